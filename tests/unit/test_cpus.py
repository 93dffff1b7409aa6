"""How many threads a vaultvec process gives faiss when not told (actors.process.cpus): its Ray node's
CPUs as Ray counts them, not the host's cores a container can see."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors.process import cpus


def test_outside_ray_it_is_the_cores_the_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus.ray, "is_initialized", lambda: False)
    assert cpus.node_cpus() == cpus.node_cores() >= 1


def test_in_ray_it_is_this_nodes_cpu_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod limited to 4 CPUs on a 64-core host: Ray (KubeRay) counts 4."""
    monkeypatch.setattr(cpus.ray, "is_initialized", lambda: True)
    context = SimpleNamespace(get_node_id=lambda: "here")
    monkeypatch.setattr(cpus.ray, "get_runtime_context", lambda: context)
    nodes = [
        {"NodeID": "other", "Resources": {"CPU": 64.0}},
        {"NodeID": "here", "Resources": {"CPU": 4.0, "memory": 1e9}},
    ]
    monkeypatch.setattr(cpus.ray, "nodes", lambda: nodes)
    assert cpus.node_cpus() == 4


def test_a_node_without_cpus_falls_back_to_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus.ray, "is_initialized", lambda: True)
    context = SimpleNamespace(get_node_id=lambda: "here")
    monkeypatch.setattr(cpus.ray, "get_runtime_context", lambda: context)
    monkeypatch.setattr(cpus.ray, "nodes", lambda: [{"NodeID": "here", "Resources": {}}])
    assert cpus.node_cpus() == cpus.node_cores()
