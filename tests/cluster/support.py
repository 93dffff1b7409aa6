"""Helpers for the multi-node tests: actor placement, index set-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from actors.control.plane import CONTROL_NAME
from cluster.client import generate_key
from tests.cluster.load import DIM, vector_of
from tests.integration.support import Index, ok, unique_name

API_KEY = "cluster-api-key"
REPORT: list[dict[str, Any]] = []  # one row per fault scenario, printed after the run
# The app's settings on a simulated cluster of 1-CPU nodes (the tests' and
# benchmarks/cluster_cost.py's): a gateway replica per node, small CPU shares.
SMALL_NODES_APP: dict[str, Any] = {
    "gateway_max_replicas_per_node": 1,
    "gateway_num_cpus": 0.1,
    "shard_num_cpus": 0.05,
    "control_num_cpus": 0.05,
    "embedder_num_cpus": 0.05,
    "embedder_preload": False,
}


def report_row(scenario: str, s: Any, lost: list[str], recovery_s: float | None) -> None:
    """One row of the fault report (tests/cluster/conftest.py prints them)."""
    REPORT.append(
        {
            "fault": scenario,
            "requests": s.requests,
            "failed": s.failed,
            "failed_as": " ".join(
                f"{n}x{st or 'conn'}" for st, n in s.statuses.items() if st != 200
            )
            or "-",
            "wrong_or_partial": s.wrong_or_partial,
            "writes_acked": s.writes_acked,
            "writes_lost": len(lost),
            "recovery_s": "-" if recovery_s is None else f"{recovery_s:.1f}",
        }
    )


@dataclass
class RayCluster:
    cluster: Any
    url: str
    workers: list[Any] = field(default_factory=list)

    def add_worker(self) -> Any:
        node = self.cluster.add_node(num_cpus=1)
        self.cluster.wait_for_nodes()
        self.workers.append(node)
        return node

    def remove_worker(self, node: Any, *, graceful: bool) -> None:
        self.workers.remove(node)
        self.cluster.remove_node(node, allow_graceful=graceful)

    def worker_with_id(self, node_id: str) -> Any | None:
        return next((w for w in self.workers if w.node_id == node_id), None)


@dataclass(frozen=True)
class ActorInfo:
    name: str
    state: str
    node_id: str
    pid: int


def actors(prefix: str = "") -> dict[str, ActorInfo]:
    """Live and restarting actors whose name starts with ``prefix`` (from the GCS)."""
    from ray._private import state  # the public state API needs the dashboard

    out = {}
    for a in state.actors().values():
        name = a.get("Name") or ""
        if name.startswith(prefix) and a["State"] != "DEAD":
            out[name] = ActorInfo(name, a["State"], a["Address"]["NodeID"], a.get("Pid") or 0)
    return out


def partition_actors(index_name: str) -> dict[int, ActorInfo]:
    """Shard number -> the live (or restarting) pool actor hosting that partition of the index."""
    import ray

    from actors.control.plane import NAMESPACE

    control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    placement = ray.get(control.lookup.remote(index_name)).placement
    live = actors("vaultvec-pool-")
    return {s: live[a] for s, a in enumerate(placement) if a in live}


def control_actor() -> ActorInfo | None:
    return actors(CONTROL_NAME).get(CONTROL_NAME)


def gateways() -> list[ActorInfo]:
    return [a for a in actors("SERVE_REPLICA::vaultvec#Gateway").values()]


def index_id_of(name: str) -> str:
    import ray

    from actors.control.plane import NAMESPACE

    control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    return str(ray.get(control.lookup.remote(name)).index_id)


def create(
    http: httpx.Client, *, n_shards: int | None = None, seed_items: int = 0, prefix: str = "cl"
) -> Index:
    """An index of DIM-dimensional items ``s0..s{n-1}`` (vectors from ``vector_of``)."""
    idx = Index(http, unique_name(prefix), generate_key())
    body: dict[str, Any] = idx.body(index_config={"type": "ivfflat", "dimension": DIM})
    if n_shards is not None:
        body["n_shards"] = n_shards
    ok(http.post("/v1/indexes/create", json=body))
    ids = [f"s{i}" for i in range(seed_items)]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        idx.upsert([{"id": x, "vector": vector_of(x)} for x in chunk])
    return idx


def answers_correctly(idx: Index, item: str, top_k: int = 10) -> bool:
    """One query for ``item``'s own vector: 200, full top-k, the item first."""
    try:
        r = idx.post("vectors/query", query_vectors=vector_of(item), top_k=top_k)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return False
    results = r.json()["results"]
    return len(results) == top_k and results[0]["id"] == item


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> float:
    """Poll ``predicate`` until true; returns the seconds it took (fails after timeout)."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
