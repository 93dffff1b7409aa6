"""/v1/vectors/query_arrays and /v1/vectors/upsert_arrays (vaultvec's compact form) against the
real server: the same results as the JSON routes, and the same errors."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from cluster.client import generate_key
from tests.helpers import clustered
from tests.integration.support import Index, create_index, error, ok

N, D = 600, 16


def b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode()


def query_arrays(idx: Index, q: np.ndarray, **fields: Any) -> httpx.Response:
    return idx.post("vectors/query_arrays", query_vectors=b64(q), shape=list(q.shape), **fields)


def decode(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Binary answer -> the JSON route's result lists, for comparison."""
    nq, k, counts = body["nq"], body["top_k"], body["counts"]
    dist = None
    if "distances" in body:
        raw = base64.b64decode(body["distances"])
        dist = np.frombuffer(raw, dtype="<f4").reshape(nq, k)
        for q, n in enumerate(counts):
            assert np.isinf(dist[q, n:]).all()
    out, pos = [], 0
    for q, n in enumerate(counts):
        row = []
        for j in range(n):
            entry: dict[str, Any] = {"id": body["ids"][pos + j]}
            if dist is not None:
                entry["distance"] = float(dist[q, j])
            if "metadata" in body:  # null for none stored, where the JSON routes answer {}
                m = body["metadata"][pos + j]
                entry["metadata"] = {} if m is None else m
            row.append(entry)
        out.append(row)
        pos += n
    assert pos == len(body["ids"])
    return out


def as_f32(results: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """JSON distances are float32 values printed as doubles: compare them as float32."""
    return [
        [{**e, "distance": float(np.float32(e["distance"]))} if "distance" in e else e for e in r]
        for r in results
    ]


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return clustered(N, D, n_clusters=12, seed=5)


@pytest.fixture(scope="module")
def filled(http: httpx.Client, data: np.ndarray) -> Any:
    idx = create_index(http, dimension=D)
    half = N // 2
    ids = [f"v{i}" for i in range(N)]
    meta = [{"group": i % 5, "even": i % 2 == 0} if i % 7 else None for i in range(N)]
    idx.upsert_arrays(ids[:half], data[:half], metadata=meta[:half])  # JSON route
    ok(
        idx.post(
            "vectors/upsert_arrays",
            ids=ids[half:],
            vectors=b64(data[half:]),
            shape=[N - half, D],
            metadata=meta[half:],
            contents=[f"c{i}" for i in range(half, N)],
        )
    )
    yield idx
    idx.drop()


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 7},
        {"top_k": 5, "include": ["distance"]},
        {"top_k": 5, "include": ["metadata"]},
        {"top_k": 5, "include": []},
        {"top_k": 10, "filters": {"group": {"$in": [1, 3]}}, "n_probes": 0, "greedy": None},
        {"top_k": None, "n_probes": None, "include": None, "filters": None},
    ],
)
def test_arrays_query_equals_json(filled: Index, data: np.ndarray, fields: dict[str, Any]) -> None:
    q = data[::37] + 0.01
    body = ok(query_arrays(filled, q, **fields))
    assert body["nq"] == len(q) and len(body["counts"]) == len(q)
    include = fields.get("include")
    include = ["distance", "metadata"] if include is None else include
    assert ("distances" in body) == ("distance" in include)
    assert ("metadata" in body) == ("metadata" in include)
    # The JSON answer always carries distances; the compact one only when asked.
    want = as_f32(filled.query(query_vectors=q, **fields))
    if "distance" not in include:
        want = [[{k: v for k, v in e.items() if k != "distance"} for e in row] for row in want]
    assert decode(body) == want


def test_fewer_matches_than_top_k(filled: Index, data: np.ndarray) -> None:
    q = data[:3]
    flt = {"group": 2, "even": True}  # 1 in 10 items
    body = ok(query_arrays(filled, q, top_k=200, filters=flt))
    assert body["top_k"] == 200 and all(0 < c < 200 for c in body["counts"])
    assert decode(body) == as_f32(filled.query(query_vectors=q, top_k=200, filters=flt))


def test_large_batch_equals_small_batches_and_exact_search(
    make_index: Callable[..., Index], data: np.ndarray
) -> None:
    """16,000 queries in one request to a trained index: the shards get one stored copy of a
    >1 MB request and scan it in locality order. With every list probed the answers are exact
    search's, and those of the same queries in small batches."""
    idx = make_index(dimension=D)
    idx.upsert_arrays([f"v{i}" for i in range(N)], data)
    assert idx.train(n_lists=8)["status"] == "success"
    rng = np.random.default_rng(8)
    noise = 0.05 * rng.normal(size=(16_000, D))
    q = (data[rng.integers(0, N, 16_000)] + noise).astype(np.float32)
    fields: dict[str, Any] = {"top_k": 5, "n_probes": 8, "include": ["distance"]}
    big = decode(ok(query_arrays(idx, q, **fields)))
    small = [
        row
        for start in range(0, len(q), 4000)
        for row in decode(ok(query_arrays(idx, q[start : start + 4000], **fields)))
    ]
    assert big == small
    d2 = ((q[:, None, :] - data[None, :, :]) ** 2).sum(-1)
    exact = np.argsort(d2, axis=1)[:, :5]
    assert [[e["id"] for e in row] for row in big] == [[f"v{j}" for j in r] for r in exact]


def test_arrays_upsert_equals_json_upsert(
    make_index: Callable[..., Index], data: np.ndarray
) -> None:
    a, b = make_index(dimension=D, metric="cosine"), make_index(dimension=D, metric="cosine")
    ids = [f"x{i}" for i in range(50)]
    meta = [{"i": i, "tags": ["a", "b"]} if i % 3 else None for i in range(50)]
    contents = [f"text {i}" if i % 2 else None for i in range(50)]
    items = []
    for i in range(50):
        item: dict[str, Any] = {"id": ids[i], "vector": data[i].tolist()}
        if meta[i] is not None:
            item["metadata"] = meta[i]
        if contents[i] is not None:
            item["contents"] = contents[i]
        items.append(item)
    a.upsert(items)
    r = ok(
        b.post(
            "vectors/upsert_arrays",
            ids=ids,
            vectors=b64(data[:50]),
            shape=[50, D],
            metadata=meta,
            contents=contents,
        )
    )
    assert r == {"status": "success", "message": "Upserted 50 vectors", "upserted_count": 50}
    assert a.get(ids) == b.get(ids)
    q = data[100:120]
    assert a.query(query_vectors=q, top_k=8) == b.query(query_vectors=q, top_k=8)
    assert decode(ok(query_arrays(b, q, top_k=8))) == as_f32(a.query(query_vectors=q, top_k=8))


def json_query(idx: Index, q: Any, **fields: Any) -> httpx.Response:
    return idx.post("vectors/query", query_vectors=q, **fields)


GOOD = np.ones((2, D), dtype=np.float32)
QUERY_ERRORS: list[tuple[str, dict[str, Any], dict[str, Any] | None, str]] = [
    # (case, binary body fields, equivalent JSON body fields or None, detail fragment)
    (
        "wrong dimension",
        {"query_vectors": b64(np.ones((2, 8))), "shape": [2, 8]},
        {"query_vectors": np.ones((2, 8)).tolist()},
        "query_vectors has dimension 8, the index has dimension 16",
    ),
    (
        "nan",
        {"query_vectors": b64(np.full((2, D), np.nan)), "shape": [2, D]},
        {"query_vectors": [[1e39] * D] * 2},  # JSON has no NaN; 1e39 overflows float32
        "query_vectors contains NaN or infinite values",
    ),
    (
        "inf",
        {"query_vectors": b64(np.full((1, D), np.inf)), "shape": [1, D]},
        None,
        "query_vectors contains NaN or infinite values",
    ),
    ("bad base64", {"query_vectors": "not*base64!", "shape": [2, D]}, None, "not valid base64"),
    (
        "bytes do not match the shape",
        {"query_vectors": b64(GOOD), "shape": [3, D]},
        None,
        "shape [3, 16] of float32 needs 192",
    ),
    ("shape with 3 entries", {"query_vectors": b64(GOOD), "shape": [2, D, 1]}, None, "shape"),
    ("zero rows", {"query_vectors": "", "shape": [0, D]}, None, "shape must be"),
    (
        "top_k 0",
        {"query_vectors": b64(GOOD), "shape": [2, D], "top_k": 0},
        {"query_vectors": GOOD.tolist(), "top_k": 0},
        "top_k must be between 1 and",
    ),
    (
        "unknown include",
        {"query_vectors": b64(GOOD), "shape": [2, D], "include": ["embedding"]},
        None,  # the JSON route also accepts vector and contents, so its message lists more
        "include",
    ),
    (
        "malformed filter",
        {"query_vectors": b64(GOOD), "shape": [2, D], "filters": {"a": {"$type": "x"}}},
        {"query_vectors": GOOD.tolist(), "filters": {"a": {"$type": "x"}}},
        "$type",
    ),
    (
        "negative n_probes",
        {"query_vectors": b64(GOOD), "shape": [2, D], "n_probes": -1},
        {"query_vectors": GOOD.tolist(), "n_probes": -1},
        "n_probes",
    ),
]


@pytest.mark.parametrize(("case", "binary", "as_json", "fragment"), QUERY_ERRORS)
def test_query_errors_match_json(
    filled: Index,
    case: str,
    binary: dict[str, Any],
    as_json: dict[str, Any] | None,
    fragment: str,
) -> None:
    got = error(filled.post("vectors/query_arrays", **binary), 422)
    assert fragment in got["detail"], got
    if as_json is not None:
        want = error(filled.post("vectors/query", **as_json), 422)
        assert got["detail"] == want["detail"]


UPSERT_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    (
        "duplicate ids",
        {"ids": ["a", "a"], "vectors": b64(GOOD), "shape": [2, D]},
        "items ids contains the id 'a' more than once",
    ),
    ("empty id", {"ids": ["a", ""], "vectors": b64(GOOD), "shape": [2, D]}, "ids"),
    ("ids vs rows", {"ids": ["a", "b", "c"], "vectors": b64(GOOD), "shape": [2, D]}, "3 ids"),
    (
        "wrong dimension",
        {"ids": ["a", "b"], "vectors": b64(np.ones((2, 4))), "shape": [2, 4]},
        "vectors has dimension 4, the index has dimension 16",
    ),
    (
        "nan",
        {"ids": ["a", "b"], "vectors": b64(np.full((2, D), np.nan)), "shape": [2, D]},
        "vectors contains NaN or infinite values",
    ),
    ("bad base64", {"ids": ["a"], "vectors": "%%%", "shape": [1, D]}, "not valid base64"),
    (
        "metadata length",
        {"ids": ["a", "b"], "vectors": b64(GOOD), "shape": [2, D], "metadata": [{}]},
        "metadata has 1 entries for 2 ids",
    ),
    (
        "contents length",
        {"ids": ["a", "b"], "vectors": b64(GOOD), "shape": [2, D], "contents": ["x"] * 3},
        "contents has 3 entries for 2 ids",
    ),
]


@pytest.mark.parametrize(("case", "fields", "fragment"), UPSERT_ERRORS)
def test_upsert_errors(filled: Index, case: str, fields: dict[str, Any], fragment: str) -> None:
    got = error(filled.post("vectors/upsert_arrays", **fields), 422)
    assert fragment in got["detail"], got
    assert filled.count() == N  # nothing was written


def test_duplicate_ids_detail_matches_json(filled: Index) -> None:
    items = [{"id": "a", "vector": [1.0] * D}, {"id": "a", "vector": [1.0] * D}]
    want = error(filled.post("vectors/upsert", items=items), 422)
    got = error(
        filled.post("vectors/upsert_arrays", ids=["a", "a"], vectors=b64(GOOD), shape=[2, D]),
        422,
    )
    assert got["detail"] == want["detail"]


@pytest.mark.parametrize("route", ["vectors/query_arrays", "vectors/upsert_arrays"])
def test_auth_and_unknown_index(filled: Index, http: httpx.Client, route: str) -> None:
    fields = {"query_vectors": b64(GOOD), "shape": [2, D]}
    if route.endswith("upsert_arrays"):
        fields = {"ids": ["n1", "n2"], "vectors": b64(GOOD), "shape": [2, D]}
    body = {"index_name": filled.name, "index_key": filled.key, **fields}
    error(http.post(f"/v1/{route}", json=body, headers={"X-API-Key": ""}), 401)
    error(http.post(f"/v1/{route}", json=body, headers={"X-API-Key": "wrong"}), 401)
    error(http.post(f"/v1/{route}", json={**body, "index_key": generate_key()}), 401)
    error(http.post(f"/v1/{route}", json={**body, "index_name": "no-such-index-x"}), 404)
    error(http.post(f"/v1/{route}", json={**body, "index_key": "zz"}), 422)


def test_body_limit_is_413(filled: Index) -> None:
    big = np.ones((20_000, 128), dtype=np.float32)  # 13.6 MB of base64; the limit is 8 MiB
    error(query_arrays(filled, big), 413)


def test_openapi_documents_the_array_routes(http: httpx.Client) -> None:
    spec = ok(http.get("/openapi.json"))
    for route, model in (
        ("/v1/vectors/query_arrays", "ArraysQueryRequest"),
        ("/v1/vectors/upsert_arrays", "ArraysUpsertRequest"),
    ):
        post = spec["paths"][route]["post"]
        assert model in str(post["requestBody"])
        assert {"401", "404", "413", "422", "503"} <= set(post["responses"])
    props = spec["components"]["schemas"]["ArraysQueryResponse"]["properties"]
    assert {"nq", "top_k", "counts", "ids", "distances", "metadata"} <= set(props)
