"""Moving partitions between pool actors: the plan (drain, balance, the placement rules kept) and
a pool actor's side of a move (release, accept, the catalog's placement checked on load)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.control.moves import plan
from actors.control.rebalance import Moved, RebalanceReport, per_node
from actors.errors import PartitionMoved
from actors.pool.actor import PoolOptions, ShardPool
from actors.storage import open_store, persistence
from actors.types import IndexMeta, Partition
from cluster.rebalance import describe
from tests.helpers import clustered
from tests.unit.test_shard import batch

KEY = bytes(range(32))


def apply(
    placements: dict[str, tuple[str, ...]], nodes: dict[str, str], drain=(), surplus=()
) -> dict:
    out = {n: list(p) for n, p in placements.items()}
    planned = plan(placements, nodes, drain, surplus)
    for mv in planned.moves:
        assert out[mv.index][mv.shard_no] == mv.source
        out[mv.index][mv.shard_no] = mv.target
    return {n: tuple(p) for n, p in out.items()}


def loads(placements: dict, actors) -> Counter:
    c: Counter = Counter({a: 0 for a in actors})
    c.update(a for p in placements.values() for a in p)
    return c


def test_a_node_that_joins_gets_its_share_and_indexes_stay_spread() -> None:
    nodes = {"a": "n1", "b": "n2", "c": "n3"}
    placements = {f"i{k}": ("a", "b", "c") for k in range(8)}  # 8 per actor
    nodes["d"] = "n4"  # a node joins, empty
    after = apply(placements, nodes)
    load = loads(after, nodes)
    assert max(load.values()) - min(load.values()) <= 1 and load["d"] == 6
    for p in after.values():  # still on distinct actors and nodes
        assert len(set(p)) == 3 and len({nodes[a] for a in p}) == 3
    assert apply(after, nodes) == after  # balanced: nothing more to do


def test_draining_empties_the_node_and_moves_only_what_it_must() -> None:
    nodes = {"a": "n1", "b": "n2", "c": "n3", "d": "n4"}
    placements = {"x": ("a", "b", "c"), "y": ("b", "c", "d"), "z": ("d", "a")}
    planned = plan(placements, nodes, drain={"n4"})
    assert {(m.index, m.shard_no) for m in planned.moves} >= {("y", 2), ("z", 0)}
    after = apply(placements, nodes, drain={"n4"})
    assert all("d" not in p for p in after.values())
    assert all(len(set(p)) == len(p) for p in after.values())


def test_a_partition_with_nowhere_to_go_is_reported_stranded() -> None:
    nodes = {"a": "n1", "b": "n2"}
    planned = plan({"x": ("a", "b")}, nodes, drain={"n2"})
    assert planned.moves == [] and planned.stranded == [("x", 1)]


def test_actors_missing_from_the_membership_are_left_alone() -> None:
    nodes = {"a": "n1", "b": "n2"}
    planned = plan({"x": ("a", "gone"), "y": ("gone", "a")}, nodes)
    assert all("gone" not in (m.source, m.target) for m in planned.moves)


@settings(max_examples=200, deadline=None)
@given(
    actors_per_node=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    shards=st.lists(st.integers(1, 4), min_size=0, max_size=12),
    seed=st.integers(0, 1000),
    drain_first=st.booleans(),
)
def test_plans_keep_the_rules_and_balance(
    actors_per_node: list[int], shards: list[int], seed: int, drain_first: bool
) -> None:
    import random

    rng = random.Random(seed)
    nodes = {f"p{n}.{k}": f"n{n}" for n, m in enumerate(actors_per_node) for k in range(m)}
    actors = sorted(nodes)
    placements = {
        f"i{k}": tuple(rng.sample(actors, min(s, len(actors)))) for k, s in enumerate(shards)
    }
    drain = {"n0"} if drain_first and len(actors_per_node) > 1 else set()
    planned = plan(placements, nodes, drain)
    after = apply(placements, nodes, drain)
    kept = [a for a in actors if nodes[a] not in drain]
    if all(s == 1 for s in shards):  # nothing constrains single-shard indexes: even to one
        load = loads(after, kept)
        assert max(load.values()) - min(load.values()) <= 1
    stranded = set(planned.stranded)
    for name, p in after.items():
        assert len(set(p)) == len(p)  # distinct actors, always
        for s, a in enumerate(p):
            assert (nodes[a] not in drain) or (name, s) in stranded
        before_spread = max(Counter(nodes[a] for a in placements[name]).values())
        after_spread = max(Counter(nodes[a] for a in p).values())
        if not drain:  # balancing never crowds an index onto fewer nodes
            assert after_spread <= before_spread
    assert len(planned.moves) <= sum(len(p) for p in placements.values()) * 2
    assert plan(after, nodes, drain).moves == []  # converged: a second pass finds nothing


# -- a pool actor's side of a move ---------------------------------------------------------------
def placed(tmp_path: Path, placement: tuple[str, ...]) -> Partition:
    store = open_store(f"file://{tmp_path}")
    persistence.write_meta(store, IndexMeta("a", "ida", b"salt", b"ver", placement=placement))
    return Partition("a", "ida", 0)


def host(tmp_path: Path, name: str) -> ShardPool:
    return ShardPool(PoolOptions(store_url=f"file://{tmp_path}", name=name))


def test_a_moved_partition_is_served_by_one_host_at_a_time(tmp_path: Path) -> None:
    part = placed(tmp_path, ("A",))
    a, b = host(tmp_path, "A"), host(tmp_path, "B")
    x = clustered(40, 8, seed=5)
    a.upsert(part, KEY, batch(x, 0))
    with pytest.raises(PartitionMoved):  # not placed on B
        b.stats(part, KEY, False)
    b.prepare(part)  # 1: B refuses it still (a stale view may name B)
    b.warm(part, KEY)  # 2: B loads it while A serves
    with pytest.raises(PartitionMoved):
        b.stats(part, KEY, False)
    a.upsert(part, KEY, batch(x[:5] + 50, 40))  # A goes on writing
    placed(tmp_path, ("B",))  # 3: the catalog names B
    with pytest.raises(PartitionMoved):  # B waits for its admission
        b.upsert(part, KEY, batch(x[:1] + 60, 45))
    a.release(part)  # 4
    with pytest.raises(PartitionMoved):
        a.stats(part, KEY, False)
    assert a.pool_stats().partitions == 0  # its data dropped
    b.admit(part)  # 5
    assert b.stats(part, KEY, False).count == 45  # every write A acknowledged
    # A restarted (no memory of the release) still refuses: the catalog names B.
    with pytest.raises(PartitionMoved):
        host(tmp_path, "A").stats(part, KEY, False)
    # And back, cold (A holds nothing): the catalog names A again.
    a.prepare(part)
    b.upsert(part, KEY, batch(x[:5] + 100, 45))
    placed(tmp_path, ("A",))
    b.release(part)
    a.admit(part)
    assert a.stats(part, KEY, False).count == 50


def test_a_cut_short_move_is_settled_against_the_catalog(tmp_path: Path) -> None:
    """The control plane restarted between the catalog's change and A's release: A still
    serves, B holds a stale warm copy and refuses. Settling (every actor lets go, then every
    actor admits) leaves B serving, with what A wrote meanwhile."""
    part = placed(tmp_path, ("A",))
    a, b = host(tmp_path, "A"), host(tmp_path, "B")
    x = clustered(30, 8, seed=8)
    a.upsert(part, KEY, batch(x[:20], 0))
    b.prepare(part)
    b.warm(part, KEY)
    placed(tmp_path, ("B",))
    a.upsert(part, KEY, batch(x[20:], 20))  # a stale gateway's write, acknowledged by A
    for admit in (False, True):
        a.settle([], ["ida"], admit)
        b.settle([part], ["ida"], admit)
    with pytest.raises(PartitionMoved):
        a.stats(part, KEY, False)
    assert b.stats(part, KEY, False).count == 30


def test_release_waits_for_a_write_under_way(tmp_path: Path) -> None:
    part = placed(tmp_path, ("A",))
    a = host(tmp_path, "A")
    a.upsert(part, KEY, batch(clustered(20, 8, seed=6), 0))
    shard = a._shard(part)
    released = threading.Event()
    with shard._lock.write():  # a write in flight
        t = threading.Thread(target=lambda: (a.release(part), released.set()))
        t.start()
        time.sleep(0.2)
        assert not released.is_set()  # it waits for the write
        with pytest.raises(PartitionMoved):  # while new calls are refused already
            a.stats(part, KEY, False)
    t.join(10)
    assert released.is_set() and not shard.loaded


def test_the_report_reads_as_moves_and_partitions_per_node() -> None:
    report = RebalanceReport(
        moved=[Moved("docs", 1, "pool-0", "pool-3", "n1", "n4", 0.05)],
        skipped=[("chats", 0, "training")],
        before=per_node({"docs": ("a", "b")}, {"a": "n1", "b": "n2", "d": "n4"}),
        after={"n1": 0, "n2": 1, "n4": 1},
        draining=["n1"],
    )
    text = describe(report, dry_run=False)
    assert "docs shard 1: pool-0 on node n1 -> pool-3 on node n4 (0.05s)" in text
    assert "skipped chats shard 0: training" in text
    assert "n1  1 -> 0  (draining)" in text and "n4  0 -> 1" in text


@pytest.mark.parametrize("rolled", [False, True], ids=["log", "snapshot-rolled"])
def test_a_warm_move_catches_up_with_the_writes_made_while_it_loaded(
    tmp_path: Path, rolled: bool
) -> None:
    part = placed(tmp_path, ("A",))
    a = ShardPool(PoolOptions(store_url=f"file://{tmp_path}", name="A", wal_max_records=6))
    b = host(tmp_path, "B")
    x = clustered(90, 8, seed=7)
    a.upsert(part, KEY, batch(x[:30], 0))
    b.prepare(part)
    b.warm(part, KEY)  # B loads while A serves
    assert b._hosted[("ida", 0)].loaded
    # A goes on writing: a few records, or enough to roll its log into a newer snapshot (which
    # drops the log B's state would continue from).
    for k in range(6 if rolled else 2):
        a.upsert(part, KEY, batch(x[30 + 10 * k : 40 + 10 * k], 30 + 10 * k))
    a.delete(part, KEY, ["id0", "id1"])
    store = open_store(f"file://{tmp_path}")
    snaps = persistence.generations(store, "ida", 0, "snap")
    assert (bool(snaps) and snaps[-1] > b._hosted[("ida", 0)].log.gen) == rolled
    placed(tmp_path, ("B",))
    a.release(part)
    b.admit(part)
    written = 30 + (60 if rolled else 20)
    want = [f"id{i}" for i in range(2, written)]
    got = b.get(part, KEY, [*want, "id0", "id1"], True, False, False)
    assert list(got.ids) == want  # every write A made, the deletes too
    assert np.allclose(got.vectors, x[2:written])


def test_actors_beyond_their_nodes_share_are_emptied_and_the_pool_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from actors.pool import placement

    pool = placement.Pool("file:///nowhere")
    a, b, c, d = (pool.name(n) for n in range(4))
    # b's node was lost: b restarted on n1 beside a; d started on the node that joined since.
    members = {a: "n1", b: "n1", c: "n2", d: "n3"}
    monkeypatch.setattr(placement, "node_sizes", lambda size: {"n1": 1, "n2": 1, "n3": 1})
    assert pool.surplus(members) == {b}
    after = apply({"x": (a, b, c), "y": (b, c)}, members, surplus={b})
    assert all(b not in p for p in after.values())
    assert len({members[x] for x in after["x"]}) == 3  # x spread over three nodes again


def test_the_command_says_what_was_wrong_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    from actors.control import client
    from actors.errors import InvalidRequest
    from cluster import cli

    async def refuse(self: object, drain: list[str], dry_run: bool) -> None:
        raise InvalidRequest("no live node with pool actors has the id 'x'; nodes: n1")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_actor", lambda *a, **k: object())
    monkeypatch.setattr(client.ControlClient, "rebalance", refuse)
    assert cli.main(["rebalance", "--drain", "x"]) == 2
    err = capsys.readouterr().err
    assert "vaultvec rebalance: no live node with pool actors has the id 'x'" in err
    assert "Traceback" not in err


def test_a_snapshot_rolled_while_the_new_host_loads_is_caught_up_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writes enough to roll its log into a newer snapshot while B is still loading the
    older one (A's roll deletes the log generation B continues from): B, admitted, serves every
    write A acknowledged, and so does the store once B has rolled in turn."""
    from actors.engine.shard import Shard

    part = placed(tmp_path, ("A",))
    a = ShardPool(PoolOptions(store_url=f"file://{tmp_path}", name="A", wal_max_records=6))
    b = ShardPool(PoolOptions(store_url=f"file://{tmp_path}", name="B", wal_max_records=6))
    x = clustered(200, 8, seed=7)
    n = 0

    def write(times: int, pool: ShardPool) -> None:
        nonlocal n
        for _ in range(times):
            pool.upsert(part, KEY, batch(x[n : n + 5], n))
            n += 5

    write(7, a)  # snapshot 1, one record in log 1
    install = Shard._install

    def racing(self: Shard, state: object) -> None:
        install(self, state)
        if self is b._hosted.get(("ida", 0)) and n < 70:
            write(6, a)  # snapshot 2 lands, log 1 goes

    monkeypatch.setattr(Shard, "_install", racing)
    b.prepare(part)
    b.warm(part, KEY)
    monkeypatch.setattr(Shard, "_install", install)
    placed(tmp_path, ("B",))
    a.release(part)
    b.admit(part)
    want = [f"id{i}" for i in range(n)]
    assert list(b.get(part, KEY, want, False, False, False).ids) == want
    write(7, b)
    fresh = host(tmp_path, "B")
    want = [f"id{i}" for i in range(n)]
    assert list(fresh.get(part, KEY, want, False, False, False).ids) == want


def test_a_call_is_confirmed_only_by_an_answer_or_its_actors_death(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from actors.control import rebalance

    outcomes: list[object] = []

    def get(ref: object, timeout: float | None = None) -> object:
        result = outcomes.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(rebalance.time, "sleep", lambda s: None)
    outcomes[:] = [ActorUnavailableError("unreachable", b"x" * 16), None]
    assert rebalance.confirmed(lambda: "ref", timeout_s=60)  # retried, then answered
    outcomes[:] = [ActorDiedError()]
    assert rebalance.confirmed(lambda: "ref", timeout_s=60)  # died: restarted, holds nothing
    outcomes[:] = [ActorUnavailableError("unreachable", b"x" * 16)] * 1000
    assert not rebalance.confirmed(lambda: "ref", timeout_s=0.05)  # may be alive: not confirmed


def test_no_copy_is_left_behind_by_a_move_called_off_or_an_index_deleted(tmp_path: Path) -> None:
    part = placed(tmp_path, ("A",))
    a, b = host(tmp_path, "A"), host(tmp_path, "B")
    a.upsert(part, KEY, batch(clustered(20, 8, seed=9), 0))
    b.prepare(part)
    b.release(part)  # the move was called off before A handed the partition over
    with pytest.raises(PartitionMoved):
        b.warm(part, KEY)  # a late hand-over loads nothing
    assert b.pool_stats().partitions == 0
    b.prepare(part)
    b.warm(part, KEY)  # a copy on its way in...
    store = open_store(f"file://{tmp_path}")
    store.delete(persistence.meta_key("ida"))  # ...of an index deleted meanwhile
    b.settle([], [], admit=False)  # the catalog no longer knows it
    assert b.pool_stats().partitions == 0


def test_settling_a_partition_that_never_moved_keeps_its_state(tmp_path: Path) -> None:
    """A control plane's restart settles every partition; one whose own writes rolled its log
    into newer snapshots is caught up from the log it alone writes, not loaded again."""
    part = placed(tmp_path, ("A",))
    a = ShardPool(PoolOptions(store_url=f"file://{tmp_path}", name="A", wal_max_records=3))
    x = clustered(80, 8, seed=10)
    for k in range(8):  # two rolls: snapshots newer than none the state was loaded from
        a.upsert(part, KEY, batch(x[10 * k : 10 * k + 10], 10 * k))
    shard = a._shard(part)
    items = shard.items
    for admit in (False, True):
        a.settle([part], ["ida"], admit)
    assert shard.items is items  # not loaded again
    assert a.stats(part, KEY, False).count == 80
