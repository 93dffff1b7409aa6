"""Faults under continuous mixed load: a shard actor, the control plane, a whole node.

Each scenario runs :class:`~tests.cluster.load.MixedLoad` against an index whose shards are
spread over the three nodes, injects the fault, waits for full recovery and keeps the load
running a little longer. It then checks: no wrong or partial answer, no acknowledged write
lost, no failure after recovery. The figures (requests, failures, recovery time) are printed
in the fault report at the end of the pytest run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import httpx
import pytest
import ray
from ray.exceptions import RayActorError

from actors.control.plane import CONTROL_NAME, NAMESPACE
from tests.cluster.load import MixedLoad
from tests.cluster.support import (
    API_KEY,
    RayCluster,
    answers_correctly,
    control_actor,
    create,
    gateways,
    partition_actors,
    report_row,
    wait_until,
)
from tests.integration.support import Index, ok

SEED_ITEMS = 400
BASELINE_S = 3.0  # load before the fault
AFTER_S = 4.0  # load after recovery
RECOVERY_BUDGET_S = 120.0


def run_scenario(
    fault: str,
    http: httpx.Client,
    idx: Index,
    inject: Callable[[], None],
    recovered: Callable[[], bool],
) -> None:
    seed = [f"s{i}" for i in range(SEED_ITEMS)]
    with MixedLoad(http.base_url.__str__(), API_KEY, idx.name, idx.key, seed) as load:
        time.sleep(BASELINE_S)
        t_fault = load.now()
        inject()
        took = wait_until(
            lambda: settled(recovered), RECOVERY_BUDGET_S, f"recovery from: {fault}", 0.1
        )
        t_recovered = load.now()
        time.sleep(AFTER_S)
    s = load.summary()
    lost = load.lost(http)
    recovery = max(took, (s.last_failure_s or 0.0) - t_fault)
    report_row(fault, s, lost, recovery)
    print(f"{fault}: {s} lost={len(lost)} recovery={recovery:.1f}s")
    for said in s.server_errors:  # a 5xx while a fault is under way: what the service said
        print(f"  {fault}: {said}")
    assert s.wrong_or_partial == 0, s.problems[:10]
    assert lost == [], f"{len(lost)} acknowledged items lost, e.g. {lost[:5]}"
    assert s.writes_acked > 0 and s.requests > 50
    if s.last_failure_s is not None:  # failures only inside the fault window
        assert s.last_failure_s <= t_recovered + 1.0, (s.statuses, s.last_failure_s, t_recovered)
    # Recovered for good: fresh requests are answered correctly.
    assert all(answers_correctly(idx, f"s{i}") for i in range(0, SEED_ITEMS, 40))


@pytest.fixture()
def index(http: httpx.Client) -> Index:
    idx = create(http, seed_items=SEED_ITEMS)
    assert len({a.node_id for a in partition_actors(idx.name).values()}) == 3
    return idx


def settled(recovered: Callable[[], bool]) -> bool:
    """``recovered()``, false while an actor the probe asks is itself still restarting (the
    control plane may have been on the node that went away: its lookup then raises)."""
    try:
        return recovered()
    except RayActorError:
        return False


def all_alive(index_name: str, n: int) -> bool:
    placed = partition_actors(index_name)
    return len(placed) == n and all(a.state == "ALIVE" for a in placed.values())


def test_shard_actor_killed(http: httpx.Client, index: Index) -> None:
    victim = partition_actors(index.name)[0]  # the pool actor hosting partition 0

    def inject() -> None:
        os.kill(victim.pid, signal.SIGKILL)  # a crash: no clean-up, no goodbye

    def recovered() -> bool:
        now = partition_actors(index.name)
        return (
            all_alive(index.name, 3) and now[0].pid != victim.pid and answers_correctly(index, "s0")
        )

    run_scenario("shard pool actor SIGKILL", http, index, inject, recovered)


def test_control_plane_killed(http: httpx.Client, index: Index) -> None:
    before = control_actor()
    assert before is not None

    def inject() -> None:
        os.kill(before.pid, signal.SIGKILL)

    def recovered() -> bool:
        now = control_actor()
        if now is None or now.state != "ALIVE" or now.pid == before.pid:
            return False
        # Control operations work again: create, list, delete.
        probe = create(http, n_shards=1)
        listed = ok(http.get("/v1/indexes/list"))["indexes"]
        probe.drop()
        return probe.name in listed

    run_scenario("control plane SIGKILL", http, index, inject, recovered)
    control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    assert index.name in ray.get(control.list_indexes.remote())


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "ungraceful"])
def test_node_removed(
    http: httpx.Client, ray_cluster: RayCluster, index: Index, graceful: bool
) -> None:
    placed = partition_actors(index.name)
    # A worker node holding a partition (the head runs the Serve controller and proxy).
    victim = next(
        w for w in ray_cluster.workers if any(a.node_id == w.node_id for a in placed.values())
    )
    moved = {n for n, a in placed.items() if a.node_id == victim.node_id}

    def inject() -> None:
        ray_cluster.remove_worker(victim, graceful=graceful)

    def recovered() -> bool:
        now = partition_actors(index.name)
        return (
            all_alive(index.name, 3)
            and all(now[n].node_id != victim.node_id for n in moved)
            and len([g for g in gateways() if g.state == "ALIVE"]) == 2
            and answers_correctly(index, "s1")
        )

    try:
        run_scenario(
            f"node removed ({'graceful' if graceful else 'ungraceful'})",
            http,
            index,
            inject,
            recovered,
        )
    finally:
        ray_cluster.add_worker()  # back to three nodes for the next scenario


def test_control_plane_killed_during_training(http: httpx.Client) -> None:
    """The /train call in flight is retried on the restarted control plane; afterwards every
    gateway sees one consistent trained index and every item."""
    n = 20_000
    idx = create(http, seed_items=n)
    before = control_actor()
    assert before is not None
    answer: dict[str, httpx.Response] = {}
    trainer = threading.Thread(
        target=lambda: answer.update(r=idx.post("indexes/train", n_lists=128)), daemon=True
    )
    trainer.start()
    wait_until(
        lambda: idx.name in ok(http.get("/v1/indexes/training-status"))["training_indexes"],
        60,
        "training to start",
        0.02,
    )
    os.kill(before.pid, signal.SIGKILL)
    trainer.join(300)
    assert not trainer.is_alive(), "the /train call never returned"
    assert ok(answer["r"])["status"] == "success"
    after = control_actor()
    assert after is not None and after.pid != before.pid
    for i in range(20):  # both gateways
        described = idx.describe()
        assert described["is_trained"] is True
        assert described["index_config"]["n_lists"] == 128
        assert described["num_vectors"] == n
        assert answers_correctly(idx, f"s{i * 997}")
    assert sorted(idx.list_ids()) == sorted(f"s{i}" for i in range(n))
    idx.drop()
