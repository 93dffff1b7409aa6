"""The shard engine on a real PostgreSQL store (no Ray): WAL, snapshots, training swap and a
reload from the tables alone — and not one plaintext byte in them or in a ``pg_dump``."""

from __future__ import annotations

import os
import subprocess
import uuid

import numpy as np
import orjson
import pytest

from actors.control.training import TrainParams, train_template
from actors.engine.ivf import serialize
from actors.engine.shard import Shard
from actors.types import SearchRequest, UpsertBatch
from tests.helpers import clustered
from tests.pg_server import PostgresServer

psycopg = pytest.importorskip("psycopg")

DIM = 8


def _needles(v: np.ndarray) -> list[bytes]:
    """Byte patterns of one vector: float32/float64 rows, big-endian rows, float32 pairs."""
    f32, f64 = v.astype(np.float32), v.astype(np.float64)
    out = [f32.tobytes(), f64.tobytes(), f32.astype(">f4").tobytes()]
    out += [f32[i : i + 2].tobytes() for i in range(DIM - 1)]
    return out + [f64[i : i + 1].tobytes() for i in range(DIM)]


def test_shard_on_postgres_reloads_and_stores_no_plaintext(
    postgres_server: PostgresServer, fresh_postgres_url: str
) -> None:
    key = os.urandom(32)
    tag = uuid.uuid4().hex[:10]
    n = 240
    ids = [f"ID-{tag}-{j:03d}" for j in range(n)]
    metas = [f"META-{tag}-{j:03d}" for j in range(n)]
    contents = [f"CONTENTS-{tag}-{j:03d} the quick brown fox" for j in range(n)]
    x = (1234.5678 + 40 * clustered(n, DIM, n_clusters=4, seed=11)).astype(np.float32)

    def batch(lo: int, hi: int) -> UpsertBatch:
        metadata = tuple(
            orjson.dumps({"field": metas[j], "num": 987654.321 + j}) for j in range(lo, hi)
        )
        return UpsertBatch(tuple(ids[lo:hi]), x[lo:hi], None, metadata, tuple(contents[lo:hi]))

    shard = Shard(fresh_postgres_url, "pg-index", "pgid0", 0, wal_max_records=4)
    reloaded = None
    try:
        for lo in range(0, 160, 16):  # 10 WAL records: the WAL rolls into snapshots twice
            shard.upsert(key, batch(lo, lo + 16))
        assert shard.delete(key, ids[:3]) == 3
        template = train_template(x[:160], "ivfflat", 4, None, None, TrainParams(max_iters=5))
        shard.rebuild(key, 1, serialize(template))  # snapshots the trained index
        for lo in range(160, n, 40):
            shard.upsert(key, batch(lo, lo + 40))  # WAL records after the swap
        live = ids[3:]
        assert shard.stats(key).count == len(live)

        reloaded = Shard(fresh_postgres_url, "pg-index", "pgid0", 0)
        assert reloaded.stats(key).count == len(live) and reloaded.version == 1
        got = reloaded.get(key, live, vectors=True, metadata=True, contents=True)
        assert got.ids == live
        np.testing.assert_array_equal(got.vectors, x[3:])
        assert got.contents == contents[3:] and got.metadata is not None
        assert [orjson.loads(m or b"{}").get("field") for m in got.metadata] == metas[3:]
        q = x[[10, 100, 200]] + 0.01
        coarse, lists = template.quantizer.search(q, 4)
        req = SearchRequest(q, 5, version=1, list_nos=lists, coarse_dis=coarse)
        expected = shard.search(key, req).ids.tolist()
        assert reloaded.search(key, req).ids.tolist() == expected
        assert [row[0] for row in expected] == [ids[10], ids[100], ids[200]]
    finally:
        shard.store.close()
        if reloaded is not None:
            reloaded.store.close()

    with psycopg.connect(fresh_postgres_url) as conn:
        rows = conn.execute(
            "SELECT key, data FROM vaultvec_blobs UNION ALL SELECT key, record FROM vaultvec_log"
        ).fetchall()
    stored = {f"{k} #{i}": bytes(k.encode()) + b"\n" + bytes(v) for i, (k, v) in enumerate(rows)}
    assert any("/snap/" in k for k in stored) and any("/wal/" in k for k in stored)
    assert sum(len(v) for v in stored.values()) > n * DIM * 4, "the shard's data is not stored"
    dump = subprocess.run(
        [str(postgres_server.bindir / "pg_dump"), "--data-only", "--dbname", fresh_postgres_url],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    snapshot = next(v for k, v in stored.items() if "/snap/" in k).split(b"\n", 1)[1]
    assert snapshot.hex()[:64].encode() in dump  # positive control: the dump holds the bytea

    needles: dict[str, bytes] = {"tag": tag.encode(), "field name": b"field"}
    for j in range(n):
        needles[f"id {j}"] = ids[j].encode()
        needles[f"metadata {j}"] = metas[j].encode()
        needles[f"contents {j}"] = contents[j].encode()
        needles[f"num {j}"] = repr(987654.321 + j).encode()
    for j in range(0, n, 7):
        for i, pattern in enumerate(_needles(x[j])):
            needles[f"vector {j} pattern {i}"] = pattern
    needles |= {"key": key, "key half": key[:16], "key hex": key.hex().encode()}
    hits = [
        (where, what) for where, data in stored.items() for what, p in needles.items() if p in data
    ]
    for what, pattern in needles.items():  # the dump shows bytea as hex
        if pattern in dump or pattern.hex().encode() in dump:
            hits.append(("pg_dump", what))
    assert hits == [], hits[:20]
