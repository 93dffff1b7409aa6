"""CyborgDB's binary forms, /v1/vectors/upsert_binary and /v1/vectors/query_binary, as its newer
SDKs send every numpy input: the same stored items and the same answers as the JSON routes."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers import clustered
from tests.integration.support import create_index, error, ids_of, ok

N, D = 300, 12


def b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode()


def rows(x: np.ndarray) -> dict[str, Any]:
    """A query batch as CyborgDB's SDK sends it."""
    return {"vectors_b64": b64(x), "dimension": x.shape[1]}


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return clustered(N, D, n_clusters=6, seed=9)


@pytest.fixture(scope="module")
def pair(http: httpx.Client, data: np.ndarray) -> Any:
    """The same items stored twice: through upsert_binary, and through the JSON upsert."""
    binary, plain = create_index(http, dimension=D), create_index(http, dimension=D)
    ids = [f"v{i}" for i in range(N)]
    meta = [{"group": i % 4} for i in range(N)]
    contents = [f"text {i}" if i % 3 else "" for i in range(N)]  # "" = none, as the SDK sends
    batch = {"ids": ids, "vectors_b64": b64(data), "dimension": D, "metadata": meta}
    body = ok(binary.post("vectors/upsert_binary", batch={**batch, "contents": contents}))
    assert body["upserted_count"] == N and body["status"] == "success"
    plain.upsert(
        [
            {"id": i, "vector": v, "metadata": m, **({"contents": c} if c else {})}
            for i, v, m, c in zip(ids, data.tolist(), meta, contents)
        ]
    )
    yield binary, plain
    binary.drop()
    plain.drop()


def test_upsert_binary_stores_what_the_json_upsert_stores(pair: Any) -> None:
    binary, plain = pair
    ids = ["v0", "v1", "v2", "v299"]
    assert binary.get(ids) == plain.get(ids)
    assert binary.get(["v3"])[0]["contents"] is None  # "" was no contents


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 5},
        {"top_k": 4, "include": ["metadata", "contents"], "filters": {"group": {"$ne": 2}}},
        {"top_k": None, "n_probes": None, "greedy": None, "include": None, "filters": None},
    ],
)
def test_query_binary_answers_as_the_json_query(
    pair: Any, data: np.ndarray, fields: dict[str, Any]
) -> None:
    binary, plain = pair
    q = data[::50] + 0.01
    got = ok(binary.post("vectors/query_binary", batch=rows(q), **fields))
    want = plain.query(query_vectors=q.tolist(), **fields)
    assert got["results"] == want
    if not fields.get("filters"):
        assert [ids_of(row)[0] for row in got["results"]] == [f"v{i}" for i in range(0, N, 50)]
    # One row is still a list of result lists (the SDK takes the first for a 1-D input).
    one = ok(binary.post("vectors/query_binary", batch=rows(q[:1])))
    assert len(one["results"]) == 1 and ids_of(one["results"][0])[0] == "v0"


@pytest.mark.parametrize(
    ("batch", "fragment"),
    [
        ({"vectors_b64": "not base64!"}, "not valid base64"),
        ({"vectors_b64": base64.b64encode(b"\0" * (4 * D + 4)).decode()}, "whole number of rows"),
        ({"vectors_b64": ""}, "whole number of rows"),
        ({"vectors_b64": b64(np.full((1, D), np.nan))}, "NaN"),
    ],
)
def test_query_binary_errors(pair: Any, batch: dict[str, Any], fragment: str) -> None:
    binary, _ = pair
    got = error(binary.post("vectors/query_binary", batch={"dimension": D, **batch}), 422)
    assert fragment in got["detail"]


def test_upsert_binary_errors(pair: Any, data: np.ndarray) -> None:
    binary, _ = pair
    two = b64(data[:2])
    cases = [
        ({"ids": ["a"], "vectors_b64": two, "dimension": D}, "1 rows"),
        ({"ids": ["a", "b"], "vectors_b64": two, "dimension": D, "metadata": [{}]}, "metadata"),
        ({"ids": ["a", "a"], "vectors_b64": two, "dimension": D}, "more than once"),
        ({"ids": ["a"], "vectors_b64": b64(data[:1, :6]), "dimension": 6}, "dimension"),
    ]
    for batch, fragment in cases:
        assert fragment in error(binary.post("vectors/upsert_binary", batch=batch), 422)["detail"]
    assert binary.count() == N  # nothing half-written
