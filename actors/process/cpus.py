"""How many threads a vaultvec process gives faiss (and torch) when not told: the CPUs of its
Ray node as Ray counts them. ``ray start --num-cpus`` and KubeRay (from the container's CPU
limit) set that count; the cores the process may run on can be many more (a container sees the
host's), and a thread per host core on a few CPUs' quota only contends."""

from __future__ import annotations

import os

import ray


def node_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def node_cpus() -> int:
    """The CPU resource of this process's Ray node, or :func:`node_cores` outside Ray."""
    if ray.is_initialized():
        here = ray.get_runtime_context().get_node_id()
        for node in ray.nodes():
            cpus = int(node.get("Resources", {}).get("CPU", 0))
            if node.get("NodeID") == here and cpus > 0:
                return cpus
    return node_cores()
