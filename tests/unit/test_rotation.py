"""Key rotation without Ray (actors.control.rotation): partitions re-sealed under the new key while they
take writes, identical answers from a reload with the new key, the old key refused; and the
whole protocol (control plane + partitions) cut short before every store write it makes, then
restarted: exactly one key opens the index and every acknowledged write is in it."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from actors.control import rotation
from actors.control.client import ControlClient
from actors.control.options import EngineOptions
from actors.control.plane import ControlPlane
from actors.control.training import TrainParams, train_template
from actors.engine.ivf import serialize
from actors.engine.shard import Shard
from actors.errors import Unauthorized, Unavailable
from actors.storage import Store, open_store, persistence
from actors.storage.crypto import IndexKeys, derive_keys, new_salt, verify
from actors.types import IndexConfig, IndexMeta, KeyRotation, SearchRequest, UpsertBatch, shard_of
from cluster.client import AsyncClient, Client
from cluster.client.errors import AuthenticationError, ConflictError, IndexExistsError
from serve_app.gateway.engine import Engine
from tests.helpers import clustered

NAME, INDEX_ID, DIM, N_SHARDS = "rot", "rotid0", 8, 2
OLD_KEY, NEW_KEY = bytes(range(32)), bytes(range(100, 132))
X = clustered(400, DIM, n_clusters=6, seed=7)


class Crash(BaseException):
    """The process died here (a BaseException: no handler of the code under test runs)."""


class CrashingStore:
    """A store that dies before its ``budget + 1``-th write (None: never; it counts them)."""

    def __init__(self, inner: Store, budget: int | None = None) -> None:
        self.inner, self.budget, self.writes = inner, budget, 0

    def _write(self) -> None:
        if self.budget is not None and self.writes >= self.budget:
            raise Crash()
        self.writes += 1

    def _read(self) -> None:
        if self.budget is not None and self.writes >= self.budget:
            raise Crash()

    def put(self, key: str, data: bytes) -> None:
        self._write()
        self.inner.put(key, data)

    def append(self, key: str, record: bytes) -> None:
        self._write()
        self.inner.append(key, record)

    def delete(self, key: str) -> None:
        self._write()
        self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:  # one write per key: a crash can cut it short
        keys = self.inner.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def get(self, key: str) -> bytes | None:
        self._read()
        return self.inner.get(key)

    def list(self, prefix: str) -> list[str]:
        self._read()
        return self.inner.list(prefix)

    def read_log(self, key: str) -> builtins.list[bytes]:
        self._read()
        return self.inner.read_log(key)

    def close(self) -> None:
        self.inner.close()


class Index:
    """The index's partitions in this process, called as a gateway would, and what was
    acknowledged: item id -> row of X (or -1 once its delete was acknowledged)."""

    def __init__(self, store: Store | CrashingStore, acked: dict[str, int] | None = None) -> None:
        self.store = store
        self.shards = [Shard(store, NAME, INDEX_ID, s, wal_max_records=4) for s in range(N_SHARDS)]
        self.acked = {} if acked is None else acked
        self.tried: set[str] = set()  # ids of writes sent (acknowledged or not)

    def by_shard(self, ids: list[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for i in ids:
            out.setdefault(shard_of(i, N_SHARDS), []).append(i)
        return out

    def upsert(self, key: bytes, rows: range) -> None:
        ids = [f"i{j}" for j in rows]
        self.tried.update(ids)
        for s, sub in self.by_shard(ids).items():
            at = [int(i[1:]) for i in sub]
            metadata = tuple(orjson.dumps({"row": j}) for j in at)
            batch = UpsertBatch(tuple(sub), X[at], None, metadata, tuple(f"c{j}" for j in at))
            self.shards[s].upsert(key, batch)
            self.acked.update((i, j) for i, j in zip(sub, at))

    def delete(self, key: bytes, ids: list[str]) -> None:
        self.tried.update(ids)
        for s, sub in self.by_shard(ids).items():
            self.shards[s].delete(key, sub)
            self.acked.update((i, -1) for i in sub)

    def items(self, key: bytes) -> dict[str, tuple[bytes, str | None, Any]]:
        """Every stored item: id -> (vector bytes, contents, metadata)."""
        out = {}
        for shard in self.shards:
            ids = shard.list_ids(key)
            got = shard.get(key, ids, vectors=True, metadata=True, contents=True)
            assert got.vectors is not None and got.contents is not None and got.metadata
            for j, i in enumerate(got.ids):
                raw = got.metadata[j]
                meta = orjson.loads(raw) if raw is not None else None
                out[i] = (got.vectors[j].tobytes(), got.contents[j], meta)
        return out

    def answers(self, key: bytes, template: Any) -> list[tuple[list[Any], np.ndarray]]:
        """Each partition's top 5 for a few queries, probing 2 of the trained lists."""
        q = X[[1, 77, 150, 399]] + 0.01
        coarse, lists = template.quantizer.search(q, 2)
        req = SearchRequest(q, 5, 1, lists, coarse)
        return [(r.ids.tolist(), r.distances) for r in (s.search(key, req) for s in self.shards)]


class LocalPartitions:
    """rotation.Partitions over the in-process partitions; ``during(s)`` runs after partition
    ``s`` began the rotation (writes under both keys)."""

    def __init__(self, idx: Index, during: Callable[[int], None] | None = None) -> None:
        self.idx, self.during = idx, during

    def begin(self, key: bytes, new_key: bytes, epoch: int) -> None:
        for s, shard in enumerate(self.idx.shards):
            shard.begin_rotation(key, new_key, epoch)
            if self.during is not None:
                self.during(s)

    def commit(self, epoch: int) -> None:
        for shard in self.idx.shards:
            shard.commit_rotation(epoch)

    def abort(self, epoch: int) -> None:
        for shard in self.idx.shards:
            shard.abort_rotation(epoch)


def build(root: Path) -> tuple[IndexKeys, Any]:
    """A trained index of two partitions: snapshots, WAL records after the training swap, a
    delete; returns the old key's keys and the template."""
    store = open_store(f"file://{root}")
    salt = new_salt()
    keys = derive_keys(OLD_KEY, NAME, salt)
    cfg = IndexConfig(NAME, INDEX_ID, "ivfflat", "euclidean", N_SHARDS, dimension=DIM)
    persistence.write_config(store, keys.data_key, cfg)
    meta = IndexMeta(NAME, INDEX_ID, salt, keys.verifier, tuple(f"p{s}" for s in range(N_SHARDS)))
    persistence.write_meta(store, meta)
    idx = Index(store)
    for lo in range(0, 160, 10):
        idx.upsert(keys.data_key, range(lo, lo + 10))
    idx.delete(keys.data_key, ["i3", "i4"])
    template = train_template(X[:160], "ivfflat", 4, None, None, TrainParams(max_iters=5))
    trained = cfg.evolve(version=1, n_lists=4, trained_size=158)
    persistence.write_template(store, keys.data_key, trained, serialize(template))
    persistence.write_config(store, keys.data_key, trained)
    for shard in idx.shards:
        shard.rebuild(keys.data_key, 1, serialize(template))
    for lo in range(160, 200, 10):
        idx.upsert(keys.data_key, range(lo, lo + 10))
    return keys, template


def expected_items(acked: dict[str, int]) -> dict[str, tuple[bytes, str | None, Any]]:
    return {i: (X[j].tobytes(), f"c{j}", {"row": j}) for i, j in acked.items() if j >= 0}


def control(
    root: Path, monkeypatch: pytest.MonkeyPatch, parts: rotation.Partitions
) -> ControlPlane:
    monkeypatch.setattr(ControlPlane, "_partition_set", lambda self, meta: parts)
    cp = ControlPlane(EngineOptions(store_url=f"file://{root}"))
    if cp._recovery is not None:
        cp._recovery.join()
    return cp


def acked_after_build() -> dict[str, int]:
    acked = {f"i{j}": j for j in range(200)}
    acked.update({"i3": -1, "i4": -1})
    return acked


def rotate_to(cp: ControlPlane, key: bytes, index_key: bytes = NEW_KEY) -> IndexKeys:
    """Rotate the index from data key ``key`` to ``index_key``; returns the new keys."""
    salt = new_salt()
    new = derive_keys(index_key, NAME, salt)
    cp.rotate_key(NAME, key, salt, new.verifier, new.data_key)
    return new


def writes_during(idx: Index, key: bytes) -> Callable[[int], None]:
    """Writes while partitions hold both keys: new items, a replaced one, a delete."""

    def write(s: int) -> None:
        lo = 200 + 20 * s
        idx.upsert(key, range(lo, lo + 20))
        idx.upsert(key, range(10 + s, 11 + s))
        idx.delete(key, [f"i{20 + s}"])

    return write


def test_rotation_reseals_every_blob_and_a_reload_with_the_new_key_answers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, template = build(tmp_path)
    store = open_store(f"file://{tmp_path}")
    idx = Index(store, acked_after_build())
    cp = control(tmp_path, monkeypatch, LocalPartitions(idx, writes_during(idx, old.data_key)))
    new = rotate_to(cp, old.data_key)

    idx.upsert(new.data_key, range(300, 310))  # after the switch, under the new key only
    with pytest.raises(Unauthorized):  # committed partitions answer only to the new key
        idx.shards[0].stats(old.data_key)
    live_items, live_answers = idx.items(new.data_key), idx.answers(new.data_key, template)
    assert live_items == expected_items(idx.acked)

    reloaded = Index(open_store(f"file://{tmp_path}"))
    assert reloaded.items(new.data_key) == live_items
    for (ids, dist), (ids2, dist2) in zip(live_answers, reloaded.answers(new.data_key, template)):
        assert ids == ids2
        np.testing.assert_array_equal(dist, dist2)
    with pytest.raises(Unauthorized):
        Shard(store, NAME, INDEX_ID, 1).stats(old.data_key)
    meta = persistence.load_meta(store, INDEX_ID)
    assert meta is not None and (meta.epoch, meta.rotation, meta.retired_epoch) == (1, None, -1)
    assert verify(new, meta.verifier) and not verify(old, meta.verifier)
    stored = store.list(persistence.index_prefix(INDEX_ID) + "/")
    assert set(persistence.stored_epochs(store, INDEX_ID)) == {1}
    assert any("/snap/" in k for k in stored) and any("/template/" in k for k in stored)
    assert cp.config(NAME, new.data_key).key_epoch == 1
    with pytest.raises(Unauthorized):  # the control plane refuses the old key too
        cp.config(NAME, old.data_key)


def test_crash_before_any_store_write_leaves_exactly_one_key_and_every_acknowledged_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    old, template = build(base)
    salt = new_salt()
    new = derive_keys(NEW_KEY, NAME, salt)

    def attempt(root: Path, budget: int | None) -> tuple[Index, int]:
        shutil.copytree(base, root)
        store = CrashingStore(open_store(f"file://{root}"), budget)
        idx = Index(store, acked_after_build())
        cp = control(root, monkeypatch, LocalPartitions(idx, writes_during(idx, old.data_key)))
        cp.store = store
        with contextlib.suppress(Crash):
            cp.rotate_key(NAME, old.data_key, salt, new.verifier, new.data_key)
        return idx, store.writes

    _, total = attempt(tmp_path / "count", None)
    assert total > 20
    outcomes = []
    for budget in range(total + 1):
        root = tmp_path / f"crash{budget}"
        before, _ = attempt(root, budget)
        store = open_store(f"file://{root}")
        idx = Index(store)
        cp = control(root, monkeypatch, LocalPartitions(idx))  # the restart settles it
        meta = persistence.load_meta(store, INDEX_ID)
        assert meta is not None and meta.rotation is None and meta.retired_epoch == -1
        opens = [verify(derive_keys(k, NAME, meta.salt), meta.verifier) for k in (OLD_KEY, NEW_KEY)]
        assert opens.count(True) == 1, budget
        good, bad = (new, old) if opens[1] else (old, new)
        outcomes.append("new" if opens[1] else "old")
        for s in range(N_SHARDS):
            with pytest.raises(Unauthorized):
                Shard(store, NAME, INDEX_ID, s).stats(bad.data_key)
        items = idx.items(good.data_key)
        expected = expected_items(before.acked)
        unsure = before.tried - set(before.acked)  # sent when the process died
        assert {i: v for i, v in items.items() if i not in unsure} == {
            i: v for i, v in expected.items() if i not in unsure
        }, budget
        assert set(persistence.stored_epochs(store, INDEX_ID)) == {meta.epoch}, budget
        if budget % 8 == 0:  # the index goes on: a write, an answer, and another rotation
            idx.upsert(good.data_key, range(350, 360))
            assert len(idx.answers(good.data_key, template)[0][0]) == 4
            held = idx.items(good.data_key)
            third = rotate_to(cp, good.data_key, bytes(32))
            assert Index(store).items(third.data_key) == held
    assert outcomes[0] == "old" and outcomes[-1] == "new"
    print(f"{total + 1} crash points: {outcomes.count('old')} old key, {outcomes.count('new')} new")


def test_a_partition_reloaded_mid_rotation_refuses_writes_until_the_rotation_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _ = build(tmp_path)
    store = open_store(f"file://{tmp_path}")
    idx = Index(store, acked_after_build())
    cp = control(tmp_path, monkeypatch, LocalPartitions(idx))
    salt = new_salt()
    new = derive_keys(NEW_KEY, NAME, salt)
    meta = cp.update_meta(
        cp.lookup(NAME), lambda m: replace(m, rotation=KeyRotation(salt, new.verifier))
    )
    for shard in idx.shards:
        shard.begin_rotation(old.data_key, new.data_key, 1)
    idx.upsert(old.data_key, range(200, 210))  # under both keys
    # The pool actor of partition 0 restarts: it reloads the current epoch, and no longer
    # writes under both keys, so it must not write at all.
    idx.shards[0] = Shard(store, NAME, INDEX_ID, 0, wal_max_records=4)
    assert idx.shards[0].stats(old.data_key).count > 0  # reads go on
    row = next(j for j in range(210, 230) if shard_of(f"i{j}", N_SHARDS) == 0)
    with pytest.raises(Unavailable):
        idx.upsert(old.data_key, range(row, row + 1))
    with pytest.raises(Unavailable):  # nor answer a key it cannot tell from a wrong one
        idx.shards[0].stats(new.data_key)
    rotation.abort(cp, LocalPartitions(idx), meta)
    idx.upsert(old.data_key, range(210, 230))  # the rotation ended without a switch
    assert idx.items(old.data_key) == expected_items(idx.acked)
    assert set(persistence.stored_epochs(store, INDEX_ID)) == {0}


def test_a_partition_reloaded_mid_rotation_takes_the_new_key_after_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _ = build(tmp_path)
    store = open_store(f"file://{tmp_path}")
    idx = Index(store, acked_after_build())

    def restart_partition_0(s: int) -> None:
        if s == N_SHARDS - 1:
            idx.shards[0] = restarted = Shard(store, NAME, INDEX_ID, 0, wal_max_records=4)
            restarted.stats(old.data_key)

    cp = control(tmp_path, monkeypatch, LocalPartitions(idx, restart_partition_0))
    new = rotate_to(cp, old.data_key)
    assert not idx.shards[0].loaded  # the commit dropped the state loaded under the old key
    with pytest.raises(Unauthorized):
        idx.shards[0].stats(old.data_key)
    assert idx.items(new.data_key) == expected_items(idx.acked)


def test_training_and_rotation_exclude_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _ = build(tmp_path)
    idx = Index(open_store(f"file://{tmp_path}"))
    cp = control(tmp_path, monkeypatch, LocalPartitions(idx))
    cp._rotating.add(NAME)
    with pytest.raises(rotation.Busy):
        cp.train(NAME, old.data_key, TrainParams(), wait=False)
    assert cp.maybe_autotrain(NAME, old.data_key, 10**9) is False
    cp._rotating.clear()
    cp._training[NAME] = Future()
    with pytest.raises(rotation.Busy):
        rotate_to(cp, old.data_key)
    assert cp.lookup(NAME).epoch == 0 and NAME not in cp._rotating


def test_catalog_entries_without_key_epochs_still_read(tmp_path: Path) -> None:
    legacy = {"name": "a", "index_id": "x1", "salt": "00" * 16, "verifier": "11" * 32}
    meta = persistence.read_meta(orjson.dumps(legacy))
    assert (meta.epoch, meta.rotation, meta.retired_epoch, meta.placement) == (0, None, -1, ())
    rotating = replace(meta, epoch=3, rotation=KeyRotation(b"s" * 16, b"v" * 32), retired_epoch=2)
    store = open_store(f"file://{tmp_path}")
    persistence.write_meta(store, rotating)
    assert persistence.load_meta(store, "x1") == rotating
    assert persistence.epoch_prefix("x1", 0) == "indexes/x1"
    assert persistence.snap_key("x1", 2, 5, 3) == "indexes/x1/epochs/3/shards/2/snap/0000000005"


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        async def run() -> Any:
            return self.fn(*args)

        return run()


def test_gateway_asks_the_next_key_to_retry_until_the_switch_and_refuses_the_old_after() -> None:
    salt, next_salt = new_salt(), new_salt()
    old, new = derive_keys(OLD_KEY, NAME, salt), derive_keys(NEW_KEY, NAME, next_salt)
    entry = {"meta": IndexMeta(NAME, INDEX_ID, salt, old.verifier)}
    control_plane = type("Control", (), {"lookup": _Remote(lambda name: entry["meta"])})()
    engine = Engine(ControlClient(control_plane))
    run = asyncio.run
    assert run(engine.keys(NAME, OLD_KEY.hex()))[1].data_key == old.data_key
    entry["meta"] = replace(entry["meta"], rotation=KeyRotation(next_salt, new.verifier))
    with pytest.raises(Unavailable):
        run(engine.keys(NAME, NEW_KEY.hex()))
    with pytest.raises(Unauthorized):
        run(engine.keys(NAME, bytes(32).hex()))
    entry["meta"] = replace(
        entry["meta"], salt=next_salt, verifier=new.verifier, epoch=1, rotation=None
    )
    assert run(engine.keys(NAME, NEW_KEY.hex()))[1].data_key == new.data_key
    with pytest.raises(Unauthorized):
        run(engine.keys(NAME, OLD_KEY.hex()))


# -- the Python client ----------------------------------------------------------------------
def answering(routes: dict[tuple[str, str], int]) -> httpx.MockTransport:
    """A server answering (route, index_key) with the given status (200: success)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        status = routes[request.url.path, body["index_key"]]
        if status != 200:
            detail = f"index {NAME!r} {rotation.BUSY}" if status == 409 else "refused"
            return httpx.Response(status, json={"status_code": status, "detail": detail})
        return httpx.Response(200, json={"status": "success", "message": "ok", "result": 1})

    return httpx.MockTransport(handle)


ROTATE, PROBE = "/v1/indexes/rotate_key", "/v1/vectors/num_vectors"
OLD_HEX, NEW_HEX = OLD_KEY.hex(), NEW_KEY.hex()


@pytest.mark.parametrize(
    ("routes", "outcome"),
    [
        ({(ROTATE, OLD_HEX): 200}, None),
        # the answer was lost and the call repeated: the old key is refused, the new one opens
        ({(ROTATE, OLD_HEX): 401, (PROBE, NEW_HEX): 200}, None),
        ({(ROTATE, OLD_HEX): 401, (PROBE, NEW_HEX): 401}, AuthenticationError),
        ({(ROTATE, OLD_HEX): 409}, ConflictError),
    ],
)
def test_client_rotate_key_moves_the_handle_to_the_new_key(
    routes: dict[tuple[str, str], int], outcome: type[Exception] | None
) -> None:
    with Client("http://vv.test", "api", transport=answering(routes)) as vv:
        idx = vv.index(NAME, OLD_HEX)
        if outcome is None:
            idx.rotate_key(NEW_HEX)
            assert idx.key == NEW_HEX and idx._ref["index_key"] == NEW_HEX
        else:
            with pytest.raises(outcome) as info:
                idx.rotate_key(NEW_HEX)
            assert not isinstance(info.value, IndexExistsError)
            assert idx.key == OLD_HEX

    async def run() -> str:
        async with AsyncClient("http://vv.test", "api", transport=answering(routes)) as vv:
            handle = vv.index(NAME, OLD_HEX)
            await handle.rotate_key(NEW_HEX)
            return handle.key

    if outcome is None:
        assert asyncio.run(run()) == NEW_HEX
    else:
        with pytest.raises(outcome):
            asyncio.run(run())
