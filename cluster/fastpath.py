"""Serve's fast path: the configuration `vaultvec serve` starts Ray Serve with when
VAULTVEC_SERVE_FAST_PATH is true (off by default: HAProxy runs as its own process and, when the
service is killed rather than stopped, stays behind holding the port).

- ``RAY_SERVE_ENABLE_HA_PROXY=1``: HAProxy takes the HTTP port on every node and sends each
  request straight to a gateway replica's own HTTP server, instead of Serve's Python proxy
  actor relaying it over a Ray call.
- ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: Serve's throughput mode (direct ingress, gRPC between
  deployments, less per-request logging, the garbage collector frozen after start-up).
- ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1``: what throughput mode turns off, kept on, so that
  a DeploymentHandle called from outside a replica (the bulk driver's Ray transport) works.

Measured side by side (docs/performance.md, Serve fast path): a single query's p50 falls to
about a third and 32 clients' throughput rises about 2.7 times. Serve reads these variables when
it is imported, in every process: they are set here before anything imports ``ray.serve``, and
a local Ray started afterwards passes them to its processes. A Ray cluster you start yourself
(``ray start``, KubeRay) needs them in its nodes' environment (docs/deployment.md).
Trade-off: HAProxy makes the replicas' own HTTP ports listen on every interface (each still
answers only requests with the API key), and it speaks plain HTTP: terminate TLS in front.
"""

from __future__ import annotations

import os
import socket

ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
}


# HAProxy's stats and metrics listeners take fixed ports (8404, 9101) unless told otherwise, so
# a second service on the same machine would fail to start: each gets free ones.
PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def apply(enabled: bool = True) -> dict[str, str]:
    """Set the fast path's variables that the environment does not set already (an explicit
    ``0`` keeps Serve's stock behaviour for that switch), and free ports for HAProxy's own
    listeners; returns the switches this process uses."""
    if enabled:
        for name, value in ENV.items():
            os.environ.setdefault(name, value)
        for name in PORTS:
            if name not in os.environ:
                os.environ[name] = str(free_port())
    return {name: os.environ.get(name, "0") for name in ENV}


def without_ports(env: dict[str, str]) -> dict[str, str]:
    """``env`` for another service started from this process: it picks its own ports."""
    return {k: v for k, v in env.items() if k not in PORTS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
