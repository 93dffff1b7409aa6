"""A shard's snapshot larger than the configured chunk size is stored in chunks, on both
stores: no stored value grows past the chunk (plus its seal), the shard reloads from them bit
for bit, a snapshot cut short by a failed store write is never loaded (the write that
triggered it stays acknowledged), and chunks do not open out of place."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from actors.engine.shard import Shard
from actors.errors import DecryptError
from actors.storage import Store, StoreError, persistence
from actors.types import UpsertBatch
from tests.unit.test_store import BACKENDS, _make_store

KEY = bytes(range(32))
DIM, CHUNK, SEAL = 16, 4096, 28  # nonce and tag


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = _make_store(request.param, request, tmp_path)
    yield s
    s.close()


def shard(store: Store) -> Shard:
    return Shard(store, "idx", "id0", 0, wal_max_records=3, snapshot_chunk_bytes=CHUNK)


def batch(lo: int, hi: int) -> UpsertBatch:
    x = np.arange(lo * DIM, hi * DIM, dtype=np.float32).reshape(-1, DIM)
    meta = [orjson.dumps({"i": i}) for i in range(lo, hi)]
    ids = [f"item-{i}" for i in range(lo, hi)]
    return UpsertBatch(
        ids=ids, vectors=x, metadata=meta, contents=[f"c{i}" for i in ids], norms=None
    )


def snapshot_keys(store: Store) -> list[str]:
    return store.list(persistence.shard_prefix("id0", 0) + "/snap/")


def everything(s: Shard) -> tuple[list[str], bytes, list, list]:
    """Every item of the shard (loading it), vectors as bytes: equal means bit for bit."""
    ids = sorted(s.list_ids(KEY))
    got = s.get(KEY, ids, vectors=True, metadata=True, contents=True)
    assert got.vectors is not None
    return got.ids, got.vectors.tobytes(), list(got.metadata or []), list(got.contents or [])


def test_a_large_snapshot_is_stored_in_chunks_and_reloads(store: Store) -> None:
    s = shard(store)
    for lo in range(0, 600, 100):
        s.upsert(KEY, batch(lo, lo + 100))  # the WAL rolls into snapshots along the way
    s.delete(KEY, ["item-5", "item-17"])
    s.snapshot(KEY)
    keys = snapshot_keys(store)
    assert len(keys) > 3, keys  # 600 items x (64 B vector + ids, metadata, contents): chunks
    gens = {k.rsplit("/", 1)[1].split(".")[0] for k in keys}
    assert len(gens) == 1, "older snapshots are gone once the new one is whole"
    for k in keys:
        blob = store.get(k)
        assert blob is not None and len(blob) <= CHUNK + SEAL, (k, len(blob))
    again = shard(store)
    assert everything(again) == everything(s)
    assert len(again.items) == 598


def test_a_snapshot_cut_short_is_not_loaded_and_the_write_stands(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = shard(store)
    for lo in range(0, 300, 100):
        s.upsert(KEY, batch(lo, lo + 100))
    before = snapshot_keys(store)
    put = store.put
    calls = {"n": 0}

    def failing(key: str, data: bytes) -> None:
        if "/snap/" in key:
            calls["n"] += 1
            if calls["n"] == 3:  # the third chunk of the next snapshot
                raise StoreError("disk full")
        put(key, data)

    monkeypatch.setattr(store, "put", failing)
    for lo in range(300, 600, 100):
        s.upsert(KEY, batch(lo, lo + 100))  # acknowledged, though a snapshot failed
    assert calls["n"] >= 3
    partial = set(snapshot_keys(store)) - set(before)
    assert partial, "the cut-short snapshot left chunks"
    monkeypatch.setattr(store, "put", put)
    again = shard(store)  # from the last whole snapshot and the WAL since
    assert everything(again) == everything(s)
    assert len(again.items) == 600
    # the next snapshot replaces both
    again.upsert(KEY, batch(600, 610))
    again.snapshot(KEY)
    assert len({k.rsplit("/", 1)[1].split(".")[0] for k in snapshot_keys(store)}) == 1
    assert len(shard(store).list_ids(KEY)) == 610


def test_chunks_open_only_in_their_place(store: Store) -> None:
    s = shard(store)
    for lo in range(0, 300, 100):
        s.upsert(KEY, batch(lo, lo + 100))
    s.snapshot(KEY)
    keys = sorted(snapshot_keys(store))
    first, second = store.get(keys[0]), store.get(keys[1])
    assert first is not None and second is not None
    store.put(keys[0], second)
    store.put(keys[1], first)
    with pytest.raises(DecryptError):
        shard(store).list_ids(KEY)


def test_a_snapshot_is_never_held_whole(tmp_path: Path) -> None:
    """Writing a snapshot holds the shard's state once more at most (the lists as faiss
    serialises them), never packed and joined copies of it; loading holds a few chunks, not
    the frame. Measured as the peak of Python's traced allocations (numpy's included)."""
    chunk = 1 << 18
    s = Shard(f"file://{tmp_path}", "idx", "id0", 0, snapshot_chunk_bytes=chunk)
    n, dim = 40_000, 64
    x = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    s.upsert(KEY, UpsertBatch([f"v{i}" for i in range(n)], x, None, [None] * n, [None] * n))
    del x
    size = s._capture().nbytes
    assert size > 40 * chunk
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        s.snapshot(KEY)
        written = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        again = Shard(f"file://{tmp_path}", "idx", "id0", 0, snapshot_chunk_bytes=chunk)
        base = tracemalloc.get_traced_memory()[0]
        assert len(again.list_ids(KEY)) == n
        read = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert written < 1.4 * size, written / size  # packed whole, then joined: 3x
    assert read < 1.2 * size, read / size  # the frame whole, then joined: 2x
