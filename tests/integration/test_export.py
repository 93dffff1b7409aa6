"""`vaultvec export` as a user runs it: every item of an index to .jsonl, or to .npy with the
ids, metadata and contents beside it, through the cursor; plaintext files readable by their
owner alone."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson
import pytest

from cluster.client import Client, generate_key
from tests.integration.conftest import API_KEY
from tests.integration.support import cli, unique_name

DIM = 6


@pytest.mark.parametrize("n_shards", [1, 2])
def test_export_writes_every_item(service, tmp_path: Path, n_shards: int) -> None:
    key = generate_key()
    rng = np.random.default_rng(n_shards)
    x = rng.standard_normal((2345, DIM)).astype(np.float32)
    ids = [f"e{i}" for i in range(2345)]
    meta = [{"i": i, "odd": bool(i % 2)} for i in range(2345)]
    contents = [None if i % 3 else f"text {i}" for i in range(2345)]
    with Client(service.url, API_KEY) as vv:
        name = unique_name("ex")
        idx = vv.create_index(name, key, dimension=DIM, n_shards=n_shards)
        try:
            idx.upsert(ids, x, metadata=meta, contents=contents)
            order = sorted(range(2345), key=lambda i: ids[i])

            def export(*args: str) -> str:
                return cli(service.url, API_KEY, key, "export", "--index", name, *args)

            jsonl = tmp_path / "all.jsonl"
            out = export(str(jsonl), "--page-size", "500")
            assert "exported 2,345 items" in out
            rows = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
            assert [r["id"] for r in rows] == [ids[i] for i in order]
            assert [r["metadata"] for r in rows] == [meta[i] for i in order]
            assert [r["contents"] for r in rows] == [contents[i] for i in order]
            np.testing.assert_array_equal(
                np.array([r["vector"] for r in rows], np.float32), x[order]
            )

            npy = tmp_path / "odd.npy"
            export(str(npy), "--filters", '{"odd": true}')
            odd = [i for i in order if i % 2]
            np.testing.assert_array_equal(np.load(npy), x[odd])
            side = tmp_path / "odd.items.jsonl"
            items = [orjson.loads(line) for line in side.read_bytes().splitlines()]
            assert [r["id"] for r in items] == [ids[i] for i in odd]
            assert [r["metadata"] for r in items] == [meta[i] for i in odd]
            for path in (jsonl, npy, side):
                assert os.stat(path).st_mode & 0o777 == 0o600
            assert not list(tmp_path.glob("*.partial"))
        finally:
            idx.drop()
