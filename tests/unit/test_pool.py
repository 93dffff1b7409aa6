"""The shard pool without Ray: many indexes' partitions in one actor, isolated by key; eviction by
idle TTL and memory budget; deleted indexes refused; placement spread and deterministic; the heap
given back once the actor is quiet."""

from __future__ import annotations

import asyncio
import gc
import pickle
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors import constants
from actors.constants import CALL_BYTES, PACKED_GET_IDS
from actors.errors import IndexRetired, Unauthorized, Unavailable
from actors.pool.actor import PoolOptions, ShardPool
from actors.pool.client import ShardClient
from actors.pool.placement import place
from actors.pool.wire import (
    chunks,
    pack,
    pieces,
    row_bytes,
    search_frame,
    unpack_result,
)
from actors.process import heap
from actors.storage import open_store, persistence
from actors.types import IndexMeta, Partition, ShardStats, UpsertBatch
from cluster import fastpath
from tests.helpers import clustered
from tests.unit.test_shard import batch, exact_ids, one_list

KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))


def pool(tmp_path: Path, **kw) -> ShardPool:
    return ShardPool(PoolOptions(store_url=f"file://{tmp_path}", **kw))


def catalogued(tmp_path: Path, name: str, index_id: str) -> Partition:
    """A partition of an index present in the store's catalog (as the control plane leaves it)."""
    store = open_store(f"file://{tmp_path}")
    persistence.write_meta(store, IndexMeta(name, index_id, b"salt", b"verifier"))
    return Partition(name, index_id, 0)


def test_one_pool_hosts_many_indexes_each_with_its_own_data_and_key(tmp_path: Path) -> None:
    p = pool(tmp_path)
    a, b = catalogued(tmp_path, "a", "ida"), catalogued(tmp_path, "b", "idb")
    xa, xb = clustered(60, 8, seed=1), clustered(40, 8, seed=2) + 5
    p.upsert(a, KEY_A, batch(xa, 0))
    p.upsert(b, KEY_B, batch(xb, 0))
    assert p.stats(a, KEY_A, False).count == 60 and p.stats(b, KEY_B, False).count == 40
    res = p.search(a, KEY_A, one_list(xa[:3]))
    assert res.ids.tolist() == exact_ids(xa, xa[:3], 5)
    with pytest.raises(Unauthorized):  # one index's key never opens another's partition
        p.search(b, KEY_A, one_list(xb[:1]))
    assert p.pool_stats().partitions == 2 and p.pool_stats().loaded == 2


def test_idle_partitions_are_evicted_after_the_ttl_and_reload_with_the_key(tmp_path: Path) -> None:
    p = pool(tmp_path, idle_ttl_s=60.0)
    a, b = catalogued(tmp_path, "a", "ida"), catalogued(tmp_path, "b", "idb")
    x = clustered(50, 8, seed=3)
    p.upsert(a, KEY_A, batch(x, 0))
    p.upsert(b, KEY_B, batch(x, 0))
    shard_a = p._shard(a)
    assert p.evict(now=shard_a.last_used + 30) == 0  # not idle long enough
    p.stats(b, KEY_B, False)  # b used later than a
    assert p.evict(now=shard_a.last_used + 61) >= 1
    assert not shard_a.loaded and shard_a.partition is None
    assert p.pool_stats().evictions >= 1
    assert p.stats(a, KEY_A, False).count == 50  # the next call with the key reloads it
    assert p.search(a, KEY_A, one_list(x[:2])).ids.tolist() == exact_ids(x, x[:2], 5)


def test_over_budget_the_least_recently_used_partitions_go_first(tmp_path: Path) -> None:
    p = pool(tmp_path, budget_bytes=1)  # always over: every partition not in use goes
    parts = [catalogued(tmp_path, f"i{n}", f"id{n}") for n in range(3)]
    x = clustered(30, 8, seed=4)
    for part in parts:
        p.upsert(part, KEY_A, batch(x, 0))
    shards = [p._shard(part) for part in parts]
    with shards[2]._lock.read():  # a search in flight: that partition stays
        assert p.evict() == 2
    assert [s.loaded for s in shards] == [False, False, True]
    assert p.stats(parts[0], KEY_A, False).count == 30


def test_a_partition_mid_rebuild_or_snapshot_is_not_evicted(tmp_path: Path) -> None:
    p = pool(tmp_path, budget_bytes=1)
    part = catalogued(tmp_path, "a", "ida")
    p.upsert(part, KEY_A, batch(clustered(20, 8), 0))
    shard = p._shard(part)
    with shard._snapshot_lock:
        assert not shard.unload()
    shard._pending = []
    assert not shard.unload()
    shard._pending = None
    assert shard.unload()


def test_deleted_indexes_are_refused_not_recreated_empty(tmp_path: Path) -> None:
    p = pool(tmp_path)
    part = catalogued(tmp_path, "a", "ida")
    p.upsert(part, KEY_A, batch(clustered(20, 8), 0))
    p.retire("ida")
    with pytest.raises(IndexRetired):
        p.stats(part, KEY_A, False)
    # A restarted actor knows no tombstones: the catalog entry's absence refuses the call.
    with pytest.raises(IndexRetired):
        pool(tmp_path).stats(Partition("gone", "never-created", 0), KEY_A, False)


def test_placement_uses_distinct_actors_spread_over_nodes_least_loaded_first() -> None:
    nodes = {"p0": "n1", "p1": "n1", "p2": "n2", "p3": "n2", "p4": "n3"}
    load: Counter[str] = Counter()
    first = place("idx-1", 3, nodes, load)
    assert len(set(first)) == 3 and {nodes[a] for a in first} == {"n1", "n2", "n3"}
    assert place("idx-1", 3, nodes, load) == first  # deterministic
    load.update(first)
    second = place("idx-2", 2, nodes, load)
    assert not set(second) & set(first)  # the least loaded actors first
    many = place("idx-3", 7, nodes, Counter())
    assert Counter(many).most_common(1)[0][1] == 2 and len(set(many)) == 5  # wraps when S > pool
    spread = [place(f"idx-{i}", 1, nodes, Counter())[0] for i in range(200)]
    assert len(set(spread)) == 5  # ties broken by hashing: single-shard indexes use every actor
    with pytest.raises(Unavailable):
        place("idx", 1, {}, Counter())


def test_resident_bytes_follow_the_loaded_items(tmp_path: Path) -> None:
    p = pool(tmp_path)
    part = catalogued(tmp_path, "a", "ida")
    x = clustered(1000, 32, seed=5)
    p.upsert(part, KEY_A, batch(x, 0))
    size = p.stats(part, KEY_A, True).resident_bytes
    assert x.nbytes <= size <= 3 * x.nbytes
    assert p.pool_stats().loaded_bytes == size
    p.upsert(part, KEY_A, batch(x[:100], 1000))  # 100 more items: the estimate follows
    assert p.stats(part, KEY_A, True).resident_bytes > size


def test_the_pool_grows_to_its_share_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.pool import placement

    nodes = {"n1": 1, "n2": 1, "n3": 2}
    monkeypatch.setattr(placement, "node_sizes", lambda size: dict(nodes))
    monkeypatch.setattr(placement.ray, "kill", lambda handle: None)
    pool = placement.Pool("file:///nowhere")
    started: dict[str, str | None] = {}

    def start(name: str, node: str | None) -> str:
        started[name] = node
        return name

    monkeypatch.setattr(pool, "_start", start)
    monkeypatch.setattr(pool, "_discover", lambda: None)
    monkeypatch.setattr(pool, "_ping", lambda names, strict=False: {n: started[n] for n in names})
    members = pool.members()
    assert sorted(Counter(members.values()).items()) == [("n1", 1), ("n2", 1), ("n3", 2)]
    nodes["n4"] = 1  # a node joins: it gets its share at once, nobody else a new actor
    assert Counter(pool.members().values())["n4"] == 1 and len(started) == 5
    # n1's actor moved to n2 when n1 was lost; n1 comes back: it gets its share again.
    pool._nodes["vaultvec-pool-" + placement.store_tag("file:///nowhere") + "-0"] = "n2"
    assert Counter(pool.members().values()) == Counter(n1=1, n2=2, n3=2, n4=1)
    assert len(started) == 6


def test_a_pool_gives_its_heap_back_once_quiet_when_its_memory_grew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What calls (and Ray's own periodic work) leave free in the heap does not stay resident:
    churned items' memory follows the live ones (benchmarks/many_indexes.py, churn)."""
    gc.collect()  # no pool of an earlier test left whose housekeeping could run meanwhile
    trims: list[bool] = []
    resident = [100 << 20]
    monkeypatch.setattr(constants, "HOUSEKEEPING_PERIOD_S", 3600.0)  # passes run here
    monkeypatch.setattr(heap, "resident_anon_bytes", lambda pid="self": resident[0])

    def trim(collect: bool = False) -> bool:
        if not collect:  # the shard's own tidy after writes collects first: not counted here
            trims.append(collect)
        return True

    monkeypatch.setattr(heap, "trim", trim)
    p = pool(tmp_path)
    a = catalogued(tmp_path, "a", "ida")
    x = clustered(50, 8, seed=3)
    p.upsert(a, KEY_A, batch(x, 0))  # loads the partition (which trims after loading)
    trims.clear()
    p.housekeep()
    p.housekeep()
    assert trims == []  # quiet, but nothing to give back
    p.upsert(a, KEY_A, batch(x + 1, 0))
    resident[0] += 2 << 20  # what the call left
    p.housekeep()
    assert trims == []  # a call during this period
    p.housekeep()
    assert trims == [False]  # a whole period quiet after it
    p.housekeep()
    assert trims == [False]  # nothing grew since
    resident[0] += 2 << 20  # grown without calls (Ray's own work)
    p.housekeep()
    assert len(trims) == 2
    resident[0] -= 50 << 20  # fallen without a trim of its own (an eviction)
    p.housekeep()
    resident[0] += 2 << 20  # growth counts from there
    p.housekeep()
    assert len(trims) == 3
    with p._call("search"):  # a call in flight: never
        resident[0] += 2 << 20
        p.housekeep()
        p.housekeep()
    assert len(trims) == 3


def test_calls_may_name_their_partition_in_its_encoded_form(tmp_path: Path) -> None:
    """ShardClient sends Partition.encode() (cheaper for Ray than the dataclass): the same
    partition, whatever its index is called."""
    p = pool(tmp_path)
    a = catalogued(tmp_path, "tenant:a/1", "ida")
    assert Partition.of(a.encode()) == a and Partition.of(a) is a
    x = clustered(30, 8, seed=7)
    p.upsert(a.encode(), KEY_A, batch(x, 0))
    assert p.stats(a, KEY_A, False).count == 30  # the same partition either way
    packed = p.framed(search_frame(a.encode(), KEY_A, pack(one_list(x[:2]))))
    assert unpack_result(packed).ids.tolist() == p.search(a, KEY_A, one_list(x[:2])).ids.tolist()
    assert p.pool_stats().partitions == 1


class LocalHandle:
    """A pool actor's handle in-process: ``handle.<call>.remote(...)`` is awaitable, and the
    calls made are recorded."""

    def __init__(self, target: ShardPool) -> None:
        self.target = target
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                handle.calls.append(name)

                async def answer() -> Any:
                    return getattr(handle.target, name)(*args)

                return answer()

            @staticmethod
            def options(**_: Any) -> Any:
                return Method

        return Method


def test_small_gets_come_back_packed_large_ones_as_they_are_with_the_same_answer(
    tmp_path: Path,
) -> None:
    p = pool(tmp_path)
    a = catalogued(tmp_path, "a", "ida")
    n = PACKED_GET_IDS + 50
    x = clustered(n, 8, seed=8)
    p.upsert(a, KEY_A, batch(x, 0))
    handle = LocalHandle(p)
    client = ShardClient(handle, a)
    for ids in ([f"id{i}" for i in range(5)] + ["missing"], [f"id{i}" for i in range(n)]):
        got = asyncio.run(client.get(KEY_A, ids, True, True, True))
        want = p.get(a, KEY_A, ids, True, True, True)
        assert got.ids == want.ids and got.metadata == want.metadata
        assert got.contents == want.contents
        assert got.vectors is not None and want.vectors is not None
        assert np.array_equal(got.vectors, want.vectors)
    assert handle.calls == ["framed", "get"]


def test_pieces_cover_the_batch_in_order_each_small_enough_to_pass_inside_a_call() -> None:
    """An upsert crosses to its shard in pieces that Ray passes inside the call (under the
    inline limit vaultvec runs Ray with), never through its object store."""
    inline = int(fastpath.ENV["RAY_max_direct_call_object_size"])
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9_000, 64)).astype(np.float32)
    long_text = "é" * 300_000  # 600 KB of UTF-8 in 300,000 characters
    contents = tuple(long_text if i in (10, 11, 5_000) else f"t{i}" for i in range(len(x)))
    big = UpsertBatch(
        tuple(f"item-{i}" for i in range(len(x))),
        x,
        rng.random(len(x)).astype(np.float32),
        tuple(orjson_doc(i) for i in range(len(x))),
        contents,
    )
    parts, size = pieces(big)
    assert size == int(row_bytes(big).sum())
    assert len(parts) > 3
    assert tuple(i for p in parts for i in p.ids) == big.ids
    assert tuple(c for p in parts for c in p.contents) == big.contents
    np.testing.assert_array_equal(np.concatenate([p.vectors for p in parts]), x)
    assert big.norms is not None
    np.testing.assert_array_equal(np.concatenate([p.norms for p in parts]), big.norms)
    for part in parts:  # as Ray serialises it: pickled, the arrays out of band
        buffers: list[pickle.PickleBuffer] = []
        size = len(pickle.dumps(part, protocol=5, buffer_callback=buffers.append))
        assert size + sum(b.raw().nbytes for b in buffers) < inline, len(part.ids)
    small = big.rows(100, 200)
    assert [p.ids for p in pieces(small)[0]] == [small.ids]
    # an item larger than a call goes alone; the rest still go together
    three = big.rows(0, 3)
    huge = replace(three, contents=("x" * (2 * CALL_BYTES), "a", "b"))
    assert [p.ids for p in pieces(huge)[0]] == [("item-0",), ("item-1", "item-2")]
    huge = replace(three, contents=("a", "x" * (2 * CALL_BYTES), "b"))
    assert [p.ids for p in pieces(huge)[0]] == [("item-0",), ("item-1",), ("item-2",)]
    # ids are counted in UTF-8 too (1,024 characters may be 3 KB)
    wide = replace(big.rows(0, 2_000), ids=tuple("項目" * 400 + f"-{i}" for i in range(2_000)))
    for part in pieces(wide)[0]:
        assert len(pickle.dumps(part, protocol=5)) < inline


class FailingHandle:
    """A pool actor's handle whose upserts take a while and fail for a piece holding
    ``bad``; records the pieces sent and those that finished."""

    def __init__(self, bad: str) -> None:
        self.bad = bad
        self.sent: list[str] = []
        self.finished: list[str] = []
        self.upsert = self

    def options(self, **_: Any) -> FailingHandle:
        return self

    def remote(self, p: str, key: bytes, piece: UpsertBatch) -> Any:
        self.sent.append(piece.ids[0])

        async def run() -> ShardStats:
            await asyncio.sleep(0.02 if len(self.sent) % 2 else 0.05)
            if self.bad in piece.ids:
                raise ValueError("this piece failed")
            self.finished.append(piece.ids[0])
            return ShardStats(len(self.finished), 0)

        return run()


def test_a_failing_piece_stops_the_upsert_and_nothing_lands_after_the_failure_is_raised() -> None:
    x = np.zeros((9_000, 128), dtype=np.float32)  # 4.6 MB: several pieces
    batch = UpsertBatch(
        tuple(f"i{n}" for n in range(len(x))), x, None, (None,) * 9_000, (None,) * 9_000
    )
    parts, _ = pieces(batch)
    assert len(parts) >= 5
    handle = FailingHandle(bad=parts[1].ids[-1])
    client = ShardClient(handle, Partition("a", "ida", 0))

    async def upsert() -> tuple[list[str], list[str]]:
        with pytest.raises(ValueError):
            await client.upsert(KEY_A, batch)
        return list(handle.sent), list(handle.finished)  # as the caller learns of the failure

    sent, finished = asyncio.run(upsert())
    assert sent == [p.ids[0] for p in parts[: len(sent)]] and len(sent) < len(parts)
    assert set(finished) == set(sent) - {parts[1].ids[0]}  # every other sent piece landed
    assert handle.sent == sent and handle.finished == finished  # and nothing after


def orjson_doc(i: int) -> bytes:
    return b'{"n":%d,"tag":"%s"}' % (i, b"ab" * (i % 50))


def test_a_large_upsert_goes_in_pieces_and_the_training_sample_in_chunks(tmp_path: Path) -> None:
    p = pool(tmp_path)
    a = catalogued(tmp_path, "a", "ida")
    x = clustered(6_000, 64, seed=9)  # 1.5 MB of vectors
    handle = LocalHandle(p)
    client = ShardClient(handle, a)
    stats = asyncio.run(client.upsert(KEY_A, batch(x, 0)))
    assert stats.count == 6_000 and handle.calls.count("upsert") >= 2
    got = p.get(a, KEY_A, ["id0", "id2999", "id5999"], True, True, True)
    assert got.vectors is not None
    np.testing.assert_array_equal(got.vectors, x[[0, 2999, 5999]])
    assert got.contents == ["text 0", "text 2999", "text 5999"]

    streamed = list(p.sample(a, KEY_A, 5_000, seed=3))
    assert len(streamed) >= 2 and all(c.nbytes <= CALL_BYTES for c in streamed)
    whole = p._shard(a).sample(KEY_A, 5_000, seed=3)
    np.testing.assert_array_equal(np.concatenate(streamed), whole)
    assert [len(c) for c in chunks(np.zeros((0, 0), np.float32))] == [0]
