"""Hostile and careless input: every bad request is a 4xx with the contract's body (never a 500,
never an acknowledged write that is lost), and each configured limit is named when exceeded."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from actors.errors import InvalidRequest
from tests.integration.support import Index, error, ok

# Finite in float32, but their squared norms overflow it: before the norm check such an item was
# acknowledged and then never found (no IVF list would take it).
HUGE = [1e20, 0.0, 0.0, 0.0]


def b64(x: Any) -> str:
    return base64.b64encode(np.asarray(x, dtype="<f4").tobytes()).decode()


@pytest.fixture(params=["euclidean", "cosine"])
def index(request: pytest.FixtureRequest, make_index: Any) -> Index:
    idx = make_index(dimension=4, metric=request.param)
    idx.upsert([{"id": "fine", "vector": [1.0, 2.0, 3.0, 4.0]}])
    return idx


def test_vectors_whose_norm_overflows_float32_are_refused_on_every_route(index: Index) -> None:
    writes = [
        ("vectors/upsert", {"items": [{"id": "big", "vector": HUGE}]}),
        (
            "vectors/upsert_binary",
            {"batch": {"ids": ["big"], "vectors_b64": b64([HUGE]), "dimension": 4}},
        ),
        ("vectors/upsert_arrays", {"ids": ["big"], "vectors": b64([HUGE]), "shape": [1, 4]}),
    ]
    for route, body in writes:
        detail = error(index.post(route, **body), 422)["detail"]
        assert "'big'" in detail and "norm" in detail, detail
    assert index.count() == 1 and index.get(["big"]) == []
    reads = [
        ("vectors/query", {"query_vectors": HUGE}),
        ("vectors/query_binary", {"batch": {"vectors_b64": b64([HUGE]), "dimension": 4}}),
        ("vectors/query_arrays", {"query_vectors": b64([HUGE]), "shape": [1, 4]}),
    ]
    for route, body in reads:
        assert "norm" in error(index.post(route, **body), 422)["detail"]
    # The largest accepted norm works end to end: stored, found, returned.
    edge = [9e18, 0.0, 0.0, 0.0]
    index.upsert([{"id": "edge", "vector": edge}])
    assert index.query(query_vectors=edge, top_k=1)[0]["id"] == "edge"
    assert index.get(["edge"], include=["vector"])[0]["vector"] == pytest.approx(edge, rel=1e-6)


def test_ray_transport_refuses_them_too(index: Index) -> None:
    from ray import serve

    gateway = serve.get_app_handle("vaultvec")
    x = np.array([HUGE], dtype=np.float32)
    with pytest.raises(Exception) as caught:
        gateway.upsert_arrays.remote(index.name, index.key, ["big"], x).result(timeout_s=60)
    cause = getattr(caught.value, "cause", caught.value)
    assert isinstance(cause, InvalidRequest) and "norm" in str(cause)
    assert index.count() == 1


def test_deep_metadata_and_deep_json_are_422(make_index: Any) -> None:
    idx = make_index(dimension=2)
    deep: Any = 1
    for _ in range(300):
        deep = {"a": deep}
    for route, body in (
        ("vectors/upsert", {"items": [{"id": "d", "vector": [1.0, 2.0], "metadata": deep}]}),
        (
            "vectors/upsert_arrays",
            {"ids": ["d"], "vectors": b64([[1, 2]]), "shape": [1, 2], "metadata": [deep]},
        ),
    ):
        assert "VAULTVEC_MAX_METADATA_DEPTH" in error(idx.post(route, **body), 422)["detail"]
    nested = b'{"index_name": "x", "items": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    r = idx.client.post(
        "/v1/vectors/upsert", content=nested, headers={"Content-Type": "application/json"}
    )
    detail = error(r, 422)["detail"]
    assert "depth limit" in detail and "NaN" not in detail
    assert idx.count() == 0


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        ("vectors/get", {"ids": [str(i) for i in range(100_001)]}, "VAULTVEC_MAX_IDS_PER_REQUEST"),
        (
            "vectors/delete",
            {"ids": [str(i) for i in range(100_001)]},
            "VAULTVEC_MAX_IDS_PER_REQUEST",
        ),
        (
            "vectors/upsert",
            {"items": [{"id": str(i), "vector": [1.0, 0.0]} for i in range(100_001)]},
            "VAULTVEC_MAX_ITEMS_PER_UPSERT",
        ),
        (
            "vectors/upsert",
            {"items": [{"id": "x" * 1025, "vector": [1.0, 0.0]}]},
            "VAULTVEC_MAX_ID_LENGTH",
        ),
        (
            "vectors/upsert",
            {"items": [{"id": "m", "vector": [1.0, 0.0], "metadata": {"s": "x" * 70_000}}]},
            "VAULTVEC_MAX_METADATA_BYTES",
        ),
        (
            "vectors/upsert",
            {"items": [{"id": "c", "vector": [1.0, 0.0], "contents": "é" * 600_000}]},
            "VAULTVEC_MAX_CONTENTS_BYTES",
        ),
    ],
    ids=["get-ids", "delete-ids", "upsert-items", "id-length", "metadata-bytes", "contents-bytes"],
)
def test_each_limit_is_a_422_naming_it(
    make_index: Any, route: str, body: dict[str, Any], named: str
) -> None:
    idx = make_index(dimension=2)
    assert named in error(idx.post(route, **body), 422)["detail"]
    assert idx.count() == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"query_vectors": [True, False]},
        {"query_vectors": ["1.5", 2.0]},
        {"query_vectors": [[1.0, 2.0], [True, 1.0]]},
        {"query_vectors": [1.0, 2.0], "top_k": "5"},
        {"query_vectors": [1.0, 2.0], "top_k": 5.0},
        {"query_vectors": [1.0, 2.0], "n_probes": True},
        {"query_vectors": [1.0, 2.0], "greedy": "true"},
        {"query_vectors": [1.0, 2.0], "greedy": 1},
    ],
)
def test_no_coercion_from_strings_or_booleans(make_index: Any, fields: dict[str, Any]) -> None:
    idx = make_index(dimension=2)
    error(idx.post("vectors/query", **fields), 422)
    error(idx.post("vectors/upsert", items=[{"id": "b", "vector": [True, 1.0]}]), 422)


def test_schema_documents_the_key_pattern_and_405_carries_allow(http: httpx.Client) -> None:
    spec = ok(http.get("/openapi.json"))
    key = spec["components"]["schemas"]["IndexRequest"]["properties"]["index_key"]
    # a string of that pattern, or null (a per-index user key's requests carry none)
    forms = key.get("anyOf", [key])
    assert {f.get("pattern") for f in forms if f.get("type") == "string"} == {"^[0-9a-fA-F]{64}$"}
    assert {"type": "null"} in forms
    r = http.get("/v1/vectors/query")
    error(r, 405)
    assert r.headers["allow"] == "POST"
