"""Backup and restore of one index, still encrypted, on a live service: a backup taken while
writes go on holds every write acknowledged before it began, byte for byte, after a restore
under another name; the file holds no plaintext; and every way a restore can go wrong is
refused clearly. (Between stores: tests/integration/test_backup_stores.py.)"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.storage.backup_format import BadBackup
from cluster.bulk import backup as tool
from cluster.client import Client, generate_key
from cluster.client.errors import (
    AuthenticationError,
    ConflictError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidRequestError,
)
from tests.integration.conftest import API_KEY
from tests.integration.support import unique_name

DIM = 16


def items(lo: int, hi: int, tag: str) -> tuple[list[str], np.ndarray, list[dict], list[str]]:
    rng = np.random.default_rng(lo)
    ids = [f"{tag}-{i:05d}" for i in range(lo, hi)]
    vectors = rng.standard_normal((hi - lo, DIM)).astype(np.float32)
    metadata = [
        {"n": i, "word": f"secret-word-{tag}-{i}", "nested": {"x": [i, "y"]}} for i in range(lo, hi)
    ]
    contents = [f"secret contents {tag} {i} ünïcode" for i in range(lo, hi)]
    return ids, vectors, metadata, contents


def snapshot(idx: Any) -> dict[str, dict[str, Any]]:
    rows = idx.scan(include=["vector", "metadata", "contents"], page_size=500)
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("n_shards", [1, 3])
def test_backup_during_writes_restores_every_acknowledged_item(
    service, tmp_path: Path, n_shards: int
) -> None:
    key = generate_key()
    with Client(service.url, API_KEY) as vv:
        name = unique_name("bk")
        idx = vv.create_index(name, key, dimension=DIM, n_shards=n_shards, n_lists=8)
        restored_name = unique_name("rs")
        try:
            ids, x, meta, contents = items(0, 3000, "a")
            idx.upsert(ids, x, metadata=meta, contents=contents)
            idx.train(n_lists=8)
            idx.delete(ids[:100])
            idx.update(ids[100:150], set={"edited": True})
            before = snapshot(idx)  # every write acknowledged before the backup began
            assert len(before) == 2900

            stop, written, errors = threading.Event(), [], []

            def writer() -> None:
                n = 3000
                try:
                    with Client(service.url, API_KEY) as w:
                        widx = w.index(name, key)
                        while not stop.is_set():
                            b = items(n, n + 50, "a")
                            widx.upsert(b[0], b[1], metadata=b[2], contents=b[3])
                            written.extend(b[0])
                            n += 50
                except Exception as exc:
                    errors.append(exc)

            t = threading.Thread(target=writer)
            t.start()
            try:
                out = tmp_path / "index.vvb"
                done = tool.backup(vv, name, key, out, progress=False)
            finally:
                stop.set()
                t.join()
            assert not errors and written, "writes went on during the backup"
            assert done["header"]["n_shards"] == n_shards
            assert len(done["chunks"]) == n_shards
            assert os.stat(out).st_mode & 0o777 == 0o600

            data = out.read_bytes()
            for needle in (b"secret-word", b"secret contents", b"a-00123", x[5].tobytes()):
                assert needle not in data, needle
            assert idx.count() == 2900 + len(written)  # the backup changed nothing

            n = tool.restore(vv, out, key, name=restored_name, progress=False)
            restored = vv.index(restored_name, key)
            after = snapshot(restored)
            assert n == len(after) >= 2900
            for i, row in before.items():  # byte for byte
                got = after[i]
                assert got["metadata"] == row["metadata"] and got["contents"] == row["contents"]
                assert (
                    np.asarray(got["vector"], np.float32).tobytes()
                    == np.asarray(row["vector"], np.float32).tobytes()
                )
            assert set(after) - set(before) <= set(written)  # the rest: writes during it
            desc = restored.describe()
            assert desc["is_trained"] and desc["index_config"]["n_lists"] == 8
            q, old = x[200:210], {"n": {"$lt": 3000}}  # the items written before the backup
            want = idx.query(q, top_k=5, filters=old).ids.tolist()
            assert restored.query(q, top_k=5, filters=old).ids.tolist() == want
            # the restored index is an index like any other: it takes writes
            restored.upsert(["late"], x[:1])
            assert restored.count() == n + 1
        finally:
            idx.drop()
            with contextlib.suppress(IndexNotFoundError):
                vv.index(restored_name, key).drop()


def test_restore_refuses_what_it_must(service, tmp_path: Path) -> None:
    key = generate_key()
    with Client(service.url, API_KEY) as vv:
        name = unique_name("bk")
        idx = vv.create_index(name, key, dimension=DIM)
        target = unique_name("rs")
        try:
            ids, x, meta, contents = items(0, 200, "b")
            idx.upsert(ids, x, metadata=meta, contents=contents)
            out = tmp_path / "b.vvb"
            tool.backup(vv, name, key, out, progress=False)
            with pytest.raises(FileExistsError):
                tool.backup(vv, name, key, out, progress=False)
            with pytest.raises(AuthenticationError):
                tool.restore(vv, out, generate_key(), name=target, progress=False)
            with pytest.raises(IndexExistsError):  # restores only into a new index
                tool.restore(vv, out, key, progress=False)
            data = bytearray(out.read_bytes())
            damaged = tmp_path / "damaged.vvb"
            data[-200] ^= 1  # inside the last shard chunk
            damaged.write_bytes(bytes(data))
            with pytest.raises(InvalidRequestError, match="does not open"):
                tool.restore(vv, damaged, key, name=target, progress=False)
            # the half-restored index answers nothing but its deletion
            with pytest.raises(ConflictError, match="being restored"):
                vv.index(target, key).count()
            vv.index(target, key).drop()
            short = tmp_path / "short.vvb"
            short.write_bytes(out.read_bytes()[:-20])
            with pytest.raises(BadBackup, match="cut short"):
                tool.restore(vv, short, key, name=target, progress=False)
            vv.index(target, key).drop()
            assert tool.restore(vv, out, key, name=target, progress=False) == 200
            assert vv.index(target, key).count() == 200
        finally:
            idx.drop()
            with contextlib.suppress(IndexNotFoundError):
                vv.index(target, key).drop()
