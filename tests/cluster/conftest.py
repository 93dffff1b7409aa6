"""A simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``) running vaultvec.

Three Ray nodes on this machine (a head and two workers, one logical CPU each), Serve's proxy on
the head, two gateway replicas on different nodes, and a PostgreSQL database of the test
session's server as the shared store. Node failure detection is tightened to ~3 s.

The fixture is package-scoped: the cluster is torn down before the integration tests start
their own single-node Ray in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.support import API_KEY, REPORT, SMALL_NODES_APP, RayCluster
from tests.helpers import free_port, ray_tmpdir
from tests.pg_server import PostgresServer

SYSTEM_CONFIG = {
    # Declare a node dead after ~3 s of missed health checks (default ~30 s).
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


@pytest.fixture(scope="package")
def ray_cluster(postgres_server: PostgresServer) -> Iterator[RayCluster]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from actors.control.plane import NAMESPACE
    from cluster.runtime import APP_NAME, wait_healthy
    from serve_app.app import build_app

    # Serve's proxy prefers replicas on its own node; the tests need both gateways to serve.
    # The variables are restored afterwards: the integration tests start a plain local Ray next.
    with ray_tmpdir("vvc", RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING="0"):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "_system_config": SYSTEM_CONFIG,
            },
        )
        rc = RayCluster(cluster, url="")
        for _ in range(2):
            rc.add_worker()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        port = free_port()
        # All interfaces: HAProxy (Serve's fast path) reaches the gateway replicas of the other
        # nodes through them, as in a real cluster (docs/deployment.md, section 7).
        serve.start(proxy_location="HeadOnly", http_options={"host": "0.0.0.0", "port": port})
        args = {
            "storage": postgres_server.create_database("vaultvec_cluster"),
            "api_key": [API_KEY],
            "gateway_replicas": 2,
            **SMALL_NODES_APP,
            "auto_train_threshold": 1_000_000,
            "shard_retries": 5,
            "shard_timeout_s": 60.0,
            # Partitions move only when a test asks (test_rebalance), not under other scenarios.
            "rebalance_check_s": 0,
        }
        serve.run(build_app(args), name=APP_NAME, route_prefix="/", blocking=False)
        rc.url = f"http://127.0.0.1:{port}"
        wait_healthy(rc.url, timeout_s=180)
        yield rc
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture()
def http(ray_cluster: RayCluster) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=ray_cluster.url, headers={"X-API-Key": API_KEY}, timeout=120
    ) as client:
        yield client


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT:
        return
    tr = terminalreporter
    tr.section("vaultvec fault report (tests/cluster)")
    cols = [
        "fault",
        "requests",
        "failed",
        "failed_as",
        "wrong_or_partial",
        "writes_acked",
        "writes_lost",
        "recovery_s",
    ]
    widths = [26] + [len(c) for c in cols[1:]]
    tr.write_line(" | ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in REPORT:
        cells = [str(row.get(c, "")) for c in cols]
        tr.write_line(" | ".join(v.ljust(w) for v, w in zip(cells, widths)))
