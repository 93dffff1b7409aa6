"""Shard engine without Ray: writes, WAL replay, snapshots, rebuild under load, greedy, filters."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from actors import constants
from actors.control.training import TrainParams, train_template
from actors.engine.filters import parse_filter
from actors.engine.ivf import serialize
from actors.engine.shard import Shard
from actors.errors import DecryptError, IndexRetired, InvalidRequest
from actors.storage import StoreError
from actors.types import Probing, SearchRequest, UpsertBatch
from tests.helpers import clustered, exact_knn

KEY = bytes(range(32))


def batch(x: np.ndarray, start: int, meta: bool = True) -> UpsertBatch:
    ids = tuple(f"id{start + i}" for i in range(len(x)))
    metadata = tuple(
        orjson.dumps({"n": start + i, "even": (start + i) % 2 == 0}) if meta else None
        for i in range(len(x))
    )
    contents = tuple(f"text {start + i}" for i in range(len(x)))
    return UpsertBatch(ids, x, None, metadata, contents)


def exact_ids(x: np.ndarray, q: np.ndarray, k: int) -> list[list[str]]:
    return [[f"id{j}" for j in row] for row in exact_knn(x, q, k)[1]]


def one_list(q: np.ndarray) -> SearchRequest:
    z = np.zeros((len(q), 1), dtype=np.int64)
    return SearchRequest(q, 5, 0, z, np.zeros((len(q), 1), np.float32))


def new_shard(path: Path, **kw) -> Shard:
    return Shard(f"file://{path}", "idx", "id0", 0, **kw)


def test_a_growing_shard_rewrites_its_state_a_bounded_number_of_times(tmp_path: Path) -> None:
    """Past its WAL byte bound, a shard rolls its WAL into a snapshot only once the WAL holds
    its share of the last snapshot (not at every bound: a growing state rewritten over and
    over), and a restart replays that WAL to the same items."""
    x = clustered(4000, 32, seed=4)
    shard = new_shard(tmp_path, wal_max_records=10**6, wal_max_bytes=16 << 10)
    for start in range(0, 4000, 40):  # 100 records of about 6 KiB: 600 KiB of WAL in all
        shard.upsert(KEY, batch(x[start : start + 40], start))
        log = shard.log
        if log.snapshot_bytes > log.max_bytes:  # rolled at its share of the snapshot
            assert log.bytes < max(log.max_bytes, constants.WAL_SNAPSHOT_SHARE * log.snapshot_bytes)
    # At one roll per 16 KiB bound it would have written 37 snapshots (about 11 MB).
    assert shard.log.gen <= 16
    reloaded = new_shard(tmp_path)
    assert sorted(reloaded.list_ids(KEY)) == sorted(f"id{i}" for i in range(4000))
    assert reloaded.log.snapshot_bytes == shard.log.snapshot_bytes


def test_a_rotations_snapshot_is_the_one_the_wal_is_bounded_by(tmp_path: Path) -> None:
    """A key rotation writes the whole state as the new epoch's snapshot: the WAL's share
    rule then counts from that snapshot, not from an older, smaller one."""
    x = clustered(2000, 32, seed=5)
    shard = new_shard(tmp_path, wal_max_records=10**6, wal_max_bytes=1 << 30)
    for start in range(0, 2000, 200):
        shard.upsert(KEY, batch(x[start : start + 200], start))
    assert shard.log.snapshot_bytes == 0  # nothing rolled yet
    shard.begin_rotation(KEY, bytes(range(1, 33)), 1)
    frame = shard._capture()
    assert shard.log.snapshot_bytes == (frame.nbytes if hasattr(frame, "nbytes") else len(frame))
    assert shard.log.snapshot_bytes > 2000 * 32 * 4


def test_untrained_is_exact_and_survives_reload(tmp_path: Path) -> None:
    x = clustered(500, 16, seed=1)
    shard = new_shard(tmp_path, wal_max_records=4)
    for start in range(0, 500, 50):  # 10 WAL records: two snapshots roll, two records remain
        shard.upsert(KEY, batch(x[start : start + 50], start))
    shard.delete(KEY, ["id3", "id4", "missing"])
    q = x[:5] + 0.01
    res = shard.search(KEY, one_list(q))
    n_match = res.matched
    keep = np.array([i not in (3, 4) for i in range(500)])
    expected = [[i for i in row] for row in exact_ids(x[keep], q, 5)]
    # exact_ids numbers rows of the filtered array; map back to real ids
    real = np.flatnonzero(keep)
    expected = [[f"id{real[int(i[2:])]}" for i in row] for row in expected]
    assert res.ids.tolist() == expected
    assert n_match == 498

    reloaded = new_shard(tmp_path)
    res2 = reloaded.search(KEY, one_list(q))
    assert res2.ids.tolist() == expected
    np.testing.assert_array_equal(res2.distances, res.distances)
    got = reloaded.get(KEY, ["id7", "id3", "nope"], vectors=True, metadata=True, contents=True)
    assert got.ids == ["id7"]
    np.testing.assert_array_equal(got.vectors, x[7:8])
    assert got.contents == ["text 7"] and orjson.loads(got.metadata[0]) == {"n": 7, "even": False}


def test_upsert_replaces_item_completely(tmp_path: Path) -> None:
    shard = new_shard(tmp_path)
    x = clustered(20, 8, seed=2)
    shard.upsert(KEY, batch(x, 0))
    shard.upsert(KEY, UpsertBatch(("id1",), x[5:6] * 3, None, (None,), (None,)))
    got = shard.get(KEY, ["id1"], True, True, True)
    np.testing.assert_array_equal(got.vectors, x[5:6] * 3)
    assert got.metadata == [None] and got.contents == [None]
    assert shard.stats(KEY).count == 20
    res = shard.search(KEY, one_list(x[1:2]))
    assert "id1" not in res.ids.tolist()[0][:1] or res.distances[0, 0] > 0


def test_wrong_key_cannot_load(tmp_path: Path) -> None:
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(clustered(10, 8), 0))
    with pytest.raises(DecryptError):
        new_shard(tmp_path).stats(bytes(32))


def test_torn_wal_tail_is_ignored(tmp_path: Path) -> None:
    shard = new_shard(tmp_path)
    x = clustered(30, 8)
    shard.upsert(KEY, batch(x[:10], 0))
    shard.upsert(KEY, batch(x[10:20], 10))
    wal = next((tmp_path / "logs").rglob("*"), None)
    logs = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert wal is not None and len(logs) == 1
    data = logs[0].read_bytes()
    logs[0].write_bytes(data[:-7])  # the last append never completed
    assert new_shard(tmp_path).stats(KEY).count == 10


def test_filters_apply_before_top_k(tmp_path: Path) -> None:
    shard = new_shard(tmp_path)
    x = clustered(400, 8, seed=3)
    shard.upsert(KEY, batch(x, 0))
    req = one_list(x[:3])
    req = SearchRequest(
        req.queries, 5, 0, req.list_nos, req.coarse_dis, parse_filter({"n": {"$gte": 390}})
    )
    res = shard.search(KEY, req)
    n_match = res.matched
    assert n_match == 10
    assert all(int(i[2:]) >= 390 for i in res.ids.flat())
    assert (res.distances[:, :5] < np.inf).all()


def trained_shard(tmp_path: Path, x: np.ndarray, n_lists: int = 32) -> tuple[Shard, object]:
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x, 0))
    template = train_template(x, "ivfflat", n_lists, None, None, TrainParams(max_iters=10))
    shard.rebuild(KEY, 1, serialize(template))
    return shard, template


def test_greedy_finds_exact_neighbours(tmp_path: Path) -> None:
    x = clustered(3000, 16, n_clusters=30, seed=4)
    shard, template = trained_shard(tmp_path, x)
    q = clustered(50, 16, n_clusters=30, seed=5)
    coarse, lists = template.quantizer.search(q, 1)
    res = shard.search(KEY, SearchRequest(q, 10, 1, lists, coarse, probing=Probing("greedy")))
    assert res.ids.tolist() == exact_ids(x, q, 10)
    plain = shard.search(KEY, SearchRequest(q, 10, 1, lists, coarse))
    assert plain.ids.tolist() != exact_ids(x, q, 10)  # one probe alone is not exact here


def test_a_rebuild_refuses_lists_that_lost_a_live_item(tmp_path: Path) -> None:
    """A rebuild copies the lists as they lie; lists that no longer hold every live item (a
    broken invariant) fail the rebuild instead of leaving that item unsearchable for good."""
    x = clustered(3000, 16, seed=7)
    shard, _ = trained_shard(tmp_path, x)
    template = serialize(train_template(x, "ivfflat", 64, None, None, TrainParams(max_iters=5)))
    assert shard.partition is not None
    shard.partition.remove(np.array([5], dtype=np.int64))  # item id5 stays in the table
    with pytest.raises(RuntimeError, match="live items"):
        shard.rebuild(KEY, 2, template)
    assert shard.version == 1 and shard.stats(KEY).count == 3000


def test_rebuild_keeps_writes_made_during_it(tmp_path: Path) -> None:
    x = clustered(4000, 16, seed=6)
    shard, _ = trained_shard(tmp_path, x[:3000])
    template = train_template(x[:3000], "ivfflat", 64, None, None, TrainParams(max_iters=5))
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        start = 3000
        while not stop.is_set() and start < 4000:
            shard.upsert(KEY, batch(x[start : start + 10], start))
            written.append(start)
            start += 10

    t = threading.Thread(target=writer)
    t.start()
    shard.rebuild(KEY, 2, serialize(template))
    stop.set()
    t.join()
    expected = 3000 + 10 * len(written)
    assert shard.stats(KEY).count == expected and shard.version == 2
    assert shard.partition is not None and shard.partition.ntotal == expected
    reloaded = new_shard(tmp_path)
    assert reloaded.stats(KEY).count == expected and reloaded.version == 2
    assert reloaded.partition is not None and reloaded.partition.nlist == 64


def test_a_retired_shard_refuses_every_call(tmp_path: Path) -> None:
    x = clustered(50, 8, seed=3)
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x, 0))
    shard.retire()
    calls = [
        lambda: shard.search(KEY, one_list(x[:2])),
        lambda: shard.get(KEY, ["id1"], True, True, True),
        lambda: shard.upsert(KEY, batch(x[:1], 100)),
        lambda: shard.delete(KEY, ["id1"]),
        lambda: shard.stats(KEY),
        lambda: shard.list_ids(KEY),
    ]
    for call in calls:
        with pytest.raises(IndexRetired, match="was deleted"):
            call()
    # Nothing was written after retirement: a new shard on the same data sees the 50 items.
    assert new_shard(tmp_path).stats(KEY).count == 50


class CommitsThenFails:
    """A store whose next append commits and then reports failure (a lost COMMIT reply)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.fail_next = inner, True

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def append(self, key: str, record: bytes) -> None:
        self.inner.append(key, record)  # type: ignore[attr-defined]
        if self.fail_next:
            self.fail_next = False
            raise StoreError("connection lost during COMMIT: the write may or may not be stored")


def test_an_ambiguous_wal_append_never_costs_a_later_acknowledged_write(tmp_path: Path) -> None:
    x = clustered(30, 8, seed=4)
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x[:10], 0))
    shard.store = shard.log.store = CommitsThenFails(shard.store)  # type: ignore[assignment]
    with pytest.raises(StoreError):
        shard.upsert(KEY, batch(x[10:20], 10))  # not acknowledged (but stored)
    shard.upsert(KEY, batch(x[20:30], 20))  # acknowledged
    live = shard.list_ids(KEY)
    reloaded = new_shard(tmp_path).list_ids(KEY)
    assert {f"id{i}" for i in range(20, 30)} <= set(reloaded)  # the acknowledged write survives
    assert set(live) == set(reloaded)  # memory and store agree (the shard reloaded)


def test_heap_is_trimmed_once_writes_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outgrown blocks of a burst of writes go back to the system once the burst is over:
    one trim per pause, none while writes keep coming (each trim stalls the allocator)."""
    import actors.engine.shard as shard_mod

    trims: list[float] = []
    mine = {threading.current_thread().name}  # the load trims here, the tidy-ups on their own

    def trim(collect: bool = False) -> bool:
        # shards of earlier tests may still be tidying: count this one's only
        if threading.current_thread().name in mine:
            trims.append(time.monotonic())
        return True

    monkeypatch.setattr(shard_mod.heap, "trim", trim)
    monkeypatch.setattr(constants, "TRIM_AFTER_WRITES_S", 1.0)
    x = clustered(200, 8, seed=2)
    shard = new_shard(tmp_path)
    mine.add(f"vaultvec-tidy-{id(shard):x}")

    def trims_reach(n: int) -> bool:
        """Wait (up to 20 s: the tidy-up runs a full garbage collection) for n trims."""
        deadline = time.monotonic() + 20.0
        while len(trims) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(trims) == n

    shard.upsert(KEY, batch(x[:10], 0))  # loading trims once, the write's pause once more
    assert trims_reach(2)
    last = time.monotonic()
    for start in range(10, 200, 10):  # a burst: writes 0.05 s apart, never a 1 s pause
        shard.upsert(KEY, batch(x[start : start + 10], start))
        last = time.monotonic()
        time.sleep(0.05)
    assert len(trims) == 2
    assert trims_reach(3)
    assert trims[-1] - last >= 1.0
    shard.delete(KEY, ["id1"])  # deletes leave free blocks too
    assert trims_reach(4)
    shard.delete(KEY, ["missing"])  # changes nothing: no trim due
    time.sleep(1.5)
    assert len(trims) == 4


def test_churned_lists_are_laid_out_once_writes_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors import constants

    monkeypatch.setattr(constants, "TRIM_AFTER_WRITES_S", 0.2)
    monkeypatch.setattr(constants, "LISTS_COMPACT_MIN", 50)
    x = clustered(600, 16, seed=4)
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x[:300], 0))
    template = train_template(x, "ivfflat", 8, None, None, TrainParams(max_iters=4))
    shard.rebuild(KEY, 1, serialize(template))
    part = shard.partition
    assert part is not None and part.churn == 0
    q = x[:20] + 0.01
    z = np.tile(np.arange(8), (len(q), 1))
    req = SearchRequest(q, 5, 1, z, np.zeros((len(q), 8), np.float32))
    for start in range(300, 600, 30):  # 300 adds into trained lists: churn past a quarter
        shard.upsert(KEY, batch(x[start : start + 30], start))
    assert part.churn == 300 and part.needs_layout()
    before = shard.search(KEY, req)
    deadline = time.monotonic() + 20.0  # the tidy-up's garbage collection may take a while
    while part.churn and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shard.partition is part and part.churn == 0
    after = shard.search(KEY, req)
    assert after.ids.tolist() == before.ids.tolist()
    np.testing.assert_array_equal(after.distances, before.distances)


def test_vectors_no_list_can_hold_are_refused_and_dropped_from_old_wals(tmp_path: Path) -> None:
    """A vector whose squared norm overflows float32 gets no IVF list: the shard refuses it
    before logging it, the partition never takes a list number below 0, and a WAL written
    before the check (such items were acknowledged, never searchable) still loads."""
    from actors.storage import persistence

    x = clustered(20, 4, seed=3)
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x, 0))
    huge = np.array([[1e20, 0, 0, 0]], dtype=np.float32)
    with pytest.raises(InvalidRequest, match="'id20'"):
        shard.upsert(KEY, batch(huge, 20))
    with pytest.raises(ValueError, match="no list"):
        shard.partition.add(np.array([99]), huge)
    # An old WAL record holding one such item among good ones: as an older shard wrote it.
    mixed = UpsertBatch(
        ("ok1", "bad", "ok2"),
        np.concatenate([x[:1] + 1, huge, x[:1] + 2]),
        None,
        (None, None, None),
        (None, None, None),
    )
    shard._log(KEY, persistence.encode_upsert(mixed))
    reloaded = new_shard(tmp_path)
    res = reloaded.search(KEY, one_list(x[:1] + 1))
    n = res.matched
    assert n == 22 and reloaded.stats(KEY).count == 22
    assert "ok1" in res.ids.tolist()[0] and reloaded.get(KEY, ["bad"], True, True, True).ids == []


def test_delete_matching_is_durable_and_counts_come_from_the_filter(tmp_path: Path) -> None:
    x = clustered(300, 8, seed=4)
    shard = new_shard(tmp_path)
    shard.upsert(KEY, batch(x, 0))
    even = parse_filter({"even": True})
    assert shard.count_matching(KEY, even) == 150
    assert shard.count_matching(KEY, None) == 300
    # among ids: only those the filter matches (id1 is odd, "nope" does not exist)
    assert shard.delete_matching(KEY, even, ["id0", "id1", "id2", "nope"]) == 2
    assert shard.delete_matching(KEY, parse_filter({"n": {"$lt": 100}})) == 98
    want = {f"id{i}" for i in range(100, 300)}
    assert set(shard.list_ids(KEY)) == want
    # a fresh shard on the same store replays the deletes from the WAL
    again = new_shard(tmp_path)
    assert set(again.list_ids(KEY)) == want
    assert again.count_matching(KEY, even) == 100
    assert again.delete_matching(KEY, None) == 200
    assert new_shard(tmp_path).count_matching(KEY, None) == 0
