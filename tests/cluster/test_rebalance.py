"""Partitions move between nodes under continuous mixed load: onto a node that joins (the
control plane's check for joined nodes, which it runs every VAULTVEC_REBALANCE_CHECK_S), then
off a node being drained before it leaves (``vaultvec rebalance --drain``); and a move cut short
by a restart of the control plane is undone. Every answer is checked
(tests.cluster.load): no request fails, none is wrong or partial, no acknowledged write is
lost. The figures are printed in the fault report at the end of the run."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import ray

from actors.control.plane import CONTROL_NAME, NAMESPACE
from actors.types import Partition
from cluster import cli
from tests.cluster.load import MixedLoad, vector_of
from tests.cluster.support import (
    API_KEY,
    RayCluster,
    actors,
    answers_correctly,
    control_actor,
    create,
    gateways,
    index_id_of,
    partition_actors,
    report_row,
    wait_until,
)

SEED_ITEMS = 400
UNDER_LOAD_S = 3.0  # load before and after each move


def rebalance(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``vaultvec rebalance ARGS`` as a user runs it (in this process, joined to the cluster)."""
    code = cli.main(["rebalance", *args])
    out = capsys.readouterr().out
    print(out)
    return code, out


def report(scenario: str, load: MixedLoad, http: httpx.Client, until: float | None = None) -> None:
    """Check and report the load; with ``until``, requests that failed after that many seconds
    of it are not counted as failures of the move (a node that leaves takes the gateway replica
    it ran with it: the faults tests cover that)."""
    s = load.summary()
    failed_in_move = [o for o in load.outcomes if not o.ok and (until is None or o.t < until)]
    lost = load.lost(http)
    report_row(scenario, s, lost, None)
    print(f"{scenario}: {s} lost={len(lost)}")
    for said in s.server_errors:
        print(f"  {scenario}: {said}")
    assert s.wrong_or_partial == 0, s.problems[:10]
    assert lost == [], f"{len(lost)} acknowledged items lost, e.g. {lost[:5]}"
    assert failed_in_move == [], (s.statuses, s.server_errors[:5])  # a move is never failed
    assert s.writes_acked > 0 and s.requests > 50


def hosts_now() -> list[Any]:
    """The pool actor of every partition of every index (one entry per partition)."""
    control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    live = actors("vaultvec-pool-")
    names = ray.get(control.list_indexes.remote())
    return [
        live[a]
        for meta in ray.get([control.lookup.remote(n) for n in names])
        for a in meta.placement
        if a in live
    ]


def nodes_of(index_name: str) -> dict[int, str]:
    return {s: a.node_id for s, a in partition_actors(index_name).items()}


def test_partitions_move_onto_a_joining_node_and_off_a_draining_one_under_load(
    http: httpx.Client, ray_cluster: RayCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # Named to sort first: of equally good moves the plan takes the first index by name (run
    # after other tests, indexes they left crowded on a node may go first: step 2 moves this
    # one in any case).
    idx = create(http, seed_items=SEED_ITEMS, prefix="aa-rebalance")
    filler = create(http, seed_items=50, prefix="zz-rebalance")  # two partitions per actor
    before = nodes_of(idx.name)
    assert len(set(before.values())) == 3
    seed = [f"s{i}" for i in range(SEED_ITEMS)]
    joined: Any = None
    try:
        # 1. A node joins; partitions move onto it while writers and readers run. (The
        # periodic check is off in these tests; this is the call it makes.)
        control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
        seen = ray.get(control.rebalance_if_joined.remote(None))
        with MixedLoad(str(http.base_url), API_KEY, idx.name, idx.key, seed) as load:
            time.sleep(UNDER_LOAD_S)
            joined = ray_cluster.add_worker()
            assert ray.get(control.rebalance_if_joined.remote(seen)) == seen | {joined.node_id}
            time.sleep(UNDER_LOAD_S)
        after = nodes_of(idx.name)
        per_node = Counter(a.node_id for a in hosts_now())
        assert per_node[joined.node_id] >= 1, per_node  # it took partitions
        assert len(set(after.values())) == 3  # still on three distinct nodes
        print(f"index under load moved: {before != after}; partitions per node: {per_node}")
        report("node joined, rebalanced", load, http)

        # 2. A worker holding a partition is drained, then leaves; the load goes on throughout.
        hosting = [
            w for w in ray_cluster.workers if w is not joined and w.node_id in after.values()
        ]
        serving = {g.node_id for g in gateways()}  # prefer a node without a gateway replica
        victim = min(hosting, key=lambda w: w.node_id in serving)
        with MixedLoad(str(http.base_url), API_KEY, idx.name, idx.key, list(load.acked)) as load2:
            time.sleep(UNDER_LOAD_S)
            code, out = rebalance(capsys, "--drain", victim.node_id)
            drained = nodes_of(idx.name)
            time.sleep(UNDER_LOAD_S)
            removed_at = load2.now()
            ray_cluster.remove_worker(victim, graceful=True)
            time.sleep(UNDER_LOAD_S)
        assert code == 0, out
        assert victim.node_id not in drained.values() and len(set(drained.values())) == 3
        assert f"{victim.node_id}  " in out and "(draining)" in out
        report("node drained, then removed", load2, http, until=removed_at)
        assert all(answers_correctly(idx, f"s{i}") for i in range(0, SEED_ITEMS, 40))
        assert filler.count() == 50
    finally:
        rebalance(capsys)  # no node drained any more
        for index in (idx, filler):
            index.drop()
    assert len(ray_cluster.workers) == 2  # three nodes again for whoever runs next


def test_a_move_cut_short_by_a_control_plane_restart_leaves_the_partition_where_it_was(
    http: httpx.Client,
) -> None:
    idx = create(http, seed_items=100)
    host = partition_actors(idx.name)[0]
    part = Partition(idx.name, index_id_of(idx.name), 0)
    # A move released the partition from its host, then the control plane died before the
    # catalog named another: every query now meets a refusal on that shard.
    ray.get(ray.get_actor(host.name, namespace=NAMESPACE).release.remote(part))
    assert idx.post("vectors/query", query_vectors=vector_of("s1"), top_k=5).status_code == 503
    before = control_actor()
    assert before is not None
    os.kill(before.pid, signal.SIGKILL)
    # The restarted control plane has each pool actor take back what the catalog places on it.
    wait_until(lambda: answers_correctly(idx, "s1"), 120, "the partition to answer again")
    assert partition_actors(idx.name)[0].name == host.name
    assert idx.count() == 100
    idx.drop()
