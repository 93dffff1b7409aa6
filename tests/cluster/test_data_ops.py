"""Managing data on the PostgreSQL store, an index in one shard or in two on two nodes, behind
two gateways: count, update and delete by filter against the filter oracle, a cursor's scan under
writes, a backup restored under a new name, and its export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from cluster.bulk import backup as tool
from cluster.bulk.export import export
from cluster.client import Client
from tests.cluster.load import vector_of
from tests.cluster.support import API_KEY, RayCluster, create
from tests.integration.support import Index, ok, unique_name
from tests.unit.filter_oracle import matches

N = 900


def meta(i: int) -> dict[str, Any]:
    return {"cat": i % 9, "half": i % 2 == 0, "name": f"n{i}"}


def count(idx: Index, flt: dict[str, Any]) -> int:
    return ok(idx.post("vectors/count", filters=flt))["count"]


def pages(idx: Index, limit: int, between: Any = None) -> list[str]:
    got, cursor, n = [], None, 0
    while True:
        extra = {"cursor": cursor} if cursor else {}
        body = ok(idx.post("vectors/list_ids", limit=limit, **extra))
        got += body["ids"]
        cursor = body["next_cursor"]
        if cursor is None:
            return got
        if between is not None:
            between(n)
        n += 1


@pytest.mark.parametrize("n_shards", [1, 2], ids=["unsharded", "sharded"])
def test_data_operations_on_postgresql_across_nodes(
    http: httpx.Client, ray_cluster: RayCluster, tmp_path: Path, n_shards: int
) -> None:
    idx = create(http, n_shards=n_shards)
    docs = {f"s{i}": meta(i) for i in range(N)}
    for lo in range(0, N, 300):
        idx.upsert(
            [
                {"id": f"s{i}", "vector": vector_of(f"s{i}"), "metadata": meta(i)}
                for i in range(lo, lo + 300)
            ]
        )
    try:
        for flt in ({"cat": 4}, {"half": True, "cat": {"$lt": 3}}, {"name": {"$in": ["n1", "n2"]}}):
            assert count(idx, flt) == sum(matches(m, flt) for m in docs.values())
        r = ok(idx.post("vectors/update", filters={"cat": 4}, update={"$set": {"tag": "x"}}))
        assert r["updated_count"] == count(idx, {"tag": "x"}) == N // 9
        r = ok(idx.post("vectors/delete", filters={"cat": 5}))
        assert r["deleted_count"] == N // 9
        alive = {i for i, m in docs.items() if m["cat"] != 5}

        added: set[str] = set()

        def write(n: int) -> None:
            new = [f"s{N + 10 * n + j}" for j in range(10)]
            idx.upsert([{"id": i, "vector": vector_of(i)} for i in new])
            added.update(new)

        got = pages(idx, 100, write)
        assert len(got) == len(set(got)) and got == sorted(got)
        assert alive <= set(got) <= alive | added

        with Client(ray_cluster.url, API_KEY) as vv:
            out = tmp_path / "pg.vvb"
            tool.backup(vv, idx.name, idx.key, out, progress=False)
            name = unique_name("clrs")
            n = tool.restore(vv, out, idx.key, name=name, progress=False)
            restored = Index(http, name, idx.key)
            try:
                assert n == restored.count() == idx.count()
                assert pages(restored, 1000) == pages(idx, 1000)
                out = tmp_path / "restored.jsonl"
                assert export(vv.index(name, idx.key), out, show_progress=False) == n
                exported = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
                assert exported == pages(idx, 1000)
                assert count(restored, {"tag": "x"}) == N // 9
                sample = sorted(alive)[:20]
                want = idx.get(sample, include=["vector", "metadata"])
                assert restored.get(sample, include=["vector", "metadata"]) == want
                q = np.asarray(vector_of("s7"))
                assert (
                    ok(restored.post("vectors/query", query_vectors=q.tolist(), top_k=1))[
                        "results"
                    ][0]["id"]
                    == "s7"
                )
            finally:
                restored.drop()
    finally:
        idx.drop()
