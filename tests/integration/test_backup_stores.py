"""A backup moves an index between servers and stores, as a user runs it: `vaultvec backup`
from this service (directory store), `vaultvec restore --as` into a `vaultvec serve` on
PostgreSQL, and back; every item arrives byte for byte."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from cluster.client import Client, generate_key
from cluster.client.errors import IndexNotFoundError
from tests.integration import served
from tests.integration.conftest import API_KEY
from tests.integration.support import cli, unique_name
from tests.pg_server import PostgresServer

DIM = 12


def everything(idx: Any) -> dict[str, tuple[bytes, Any, Any]]:
    rows = idx.scan(include=["vector", "metadata", "contents"], page_size=400)
    return {
        r["id"]: (np.asarray(r["vector"], np.float32).tobytes(), r["metadata"], r["contents"])
        for r in rows
    }


def test_backup_moves_between_directory_and_postgresql(
    service, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    key = generate_key()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1500, DIM)).astype(np.float32)
    ids = [f"doc-{i}" for i in range(1500)]
    meta = [{"i": i, "t": f"text {i}"} for i in range(1500)]
    name, back = unique_name("mv"), unique_name("mvback")
    pg_key = secrets.token_hex(16)
    with Client(service.url, API_KEY) as here:
        idx = here.create_index(name, key, dimension=DIM, n_shards=2)
        try:
            idx.upsert(ids, x, metadata=meta, contents=[f"c{i}" for i in range(1500)])
            idx.train(n_lists=4)
            want = everything(idx)
            first = tmp_path / "from-directory.vvb"
            out = cli(service.url, API_KEY, key, "backup", "--index", name, str(first))
            assert "backed up" in out and os.stat(first).st_mode & 0o777 == 0o600

            with served.serve(
                postgres_server.create_database(), env={"VAULTVEC_API_KEY": pg_key}
            ) as pg:
                out = cli(pg.url, pg_key, key, "restore", str(first), "--as", "moved")
                assert "restored 1,500 items" in out
                with Client(pg.url, pg_key) as there:
                    moved = there.index("moved", key)
                    assert everything(moved) == want
                    assert moved.describe()["is_trained"]
                    moved.upsert(["pg-only"], x[:1], metadata=[{"on": "pg"}])
                    want_back = everything(moved)
                second = tmp_path / "from-postgresql.vvb"
                cli(pg.url, pg_key, key, "backup", "--index", "moved", str(second))

            out = cli(service.url, API_KEY, key, "restore", str(second), "--as", back)
            assert "restored 1,501 items" in out
            assert everything(here.index(back, key)) == want_back
        finally:
            idx.drop()
            with contextlib.suppress(IndexNotFoundError):
                here.index(back, key).drop()
