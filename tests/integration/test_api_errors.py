"""Error answers: status codes, the {"status_code", "detail"} body, and no leaked secrets."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cluster.client import generate_key
from tests.integration.support import (
    Index,
    assert_secret_free,
    create_index,
    error,
    ok,
    unique_name,
)

SECRET_CONTENTS = "TOP-SECRET-CONTENTS-3f9a1c"
SECRET_META = "TOP-SECRET-METADATA-77b2e0"
SECRET_FLOAT = 8765.4321  # a distinctive vector component
SECRET_FLOAT_TEXT = "8765.43"

INDEX_ROUTES = [
    "indexes/describe",
    "indexes/delete",
    "indexes/train",
    "vectors/upsert",
    "vectors/query",
    "vectors/get",
    "vectors/delete",
    "vectors/list_ids",
    "vectors/num_vectors",
]


def valid_fields(route: str) -> dict[str, Any]:
    """A body that would succeed on the module's index (apart from index_name / index_key)."""
    return {
        "vectors/upsert": {
            "items": [
                {"id": "new", "vector": [1.0, 2.0, 3.0, SECRET_FLOAT], "contents": SECRET_CONTENTS}
            ]
        },
        "vectors/query": {"query_vectors": [1.0, 2.0, 3.0, SECRET_FLOAT]},
        "vectors/get": {"ids": ["a"]},
        "vectors/delete": {"ids": ["zzz"]},
    }.get(route, {})


@pytest.fixture(scope="module")
def target(http: httpx.Client) -> Any:
    idx = create_index(http, dimension=4)
    idx.upsert(
        [
            {
                "id": "a",
                "vector": [1.0, 0.0, 0.0, 0.0],
                "contents": SECRET_CONTENTS,
                "metadata": {"s": SECRET_META},
            },
            {
                "id": "b",
                "vector": [0.0, 1.0, 0.0, SECRET_FLOAT],
                "contents": "b",
                "metadata": {"n": 2},
            },
        ]
    )
    yield idx
    idx.drop()


def post(idx: Index, route: str, **fields: Any) -> httpx.Response:
    return idx.client.post(
        f"/v1/{route}", json={"index_name": idx.name, "index_key": idx.key, **fields}
    )


def raw(idx: Index, route: str, body: str) -> httpx.Response:
    return idx.client.post(
        f"/v1/{route}", content=body.encode(), headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize("route", INDEX_ROUTES)
def test_wrong_index_key_is_401_without_leaking_keys(target, route):
    wrong = generate_key()
    r = target.client.post(
        f"/v1/{route}", json={"index_name": target.name, "index_key": wrong, **valid_fields(route)}
    )
    error(r, 401)
    assert_secret_free(r, wrong, target.key, SECRET_CONTENTS, SECRET_FLOAT_TEXT)
    # Nothing happened: the index and its items are intact.
    assert target.count() == 2
    assert [g["id"] for g in target.get(["a", "b", "new"])] == ["a", "b"]


@pytest.mark.parametrize("route", INDEX_ROUTES)
def test_unknown_index_is_404(target, route):
    name = unique_name("missing")
    key = generate_key()
    r = target.client.post(
        f"/v1/{route}", json={"index_name": name, "index_key": key, **valid_fields(route)}
    )
    error(r, 404)
    assert_secret_free(r, key, SECRET_CONTENTS, SECRET_FLOAT_TEXT)
    assert name not in ok(target.client.get("/v1/indexes/list"))["indexes"]


def test_duplicate_index_is_409_and_keeps_the_original(target):
    other_key = generate_key()
    r = target.client.post(
        "/v1/indexes/create",
        json={"index_name": target.name, "index_key": other_key, "index_config": {"type": "ivfpq"}},
    )
    error(r, 409)
    assert_secret_free(r, other_key, target.key)
    desc = target.describe()
    assert desc["index_type"] == "ivfflat" and desc["num_vectors"] == 2


def test_body_over_limit_is_413(target):
    # 9 MiB > the 8 MiB limit configured for the test service.
    items = [
        {"id": f"big{j}", "vector": [1.0, 2.0, 3.0, 4.0], "contents": "x" * (1 << 20)}
        for j in range(9)
    ]
    r = post(target, "vectors/upsert", items=items)
    body = error(r, 413)
    assert "x" * 100 not in r.text
    assert body["status_code"] == 413
    assert target.count() == 2


def test_body_over_limit_without_content_length_is_413(target):
    def chunks():
        yield f'{{"index_name":"{target.name}","index_key":"{target.key}","query_vectors":[1,2,3,4],"pad":"'.encode()
        for _ in range(9):
            yield b"p" * (1 << 20)
        yield b'"}'

    r = target.client.post(
        "/v1/vectors/query", content=chunks(), headers={"content-type": "application/json"}
    )
    error(r, 413)


def test_body_just_under_limit_is_accepted(target):
    # Unknown fields are ignored, so a 7 MiB padding field is legal.
    results = target.query(query_vectors=[1.0, 0.0, 0.0, 0.0], top_k=1, padding="p" * (7 << 20))
    assert [r["id"] for r in results] == ["a"]


BAD_KEYS = ["ab" * 31 + "a", "g" * 64, "ab" * 33, "", "0x" + "ab" * 31, 12345]


@pytest.mark.parametrize(
    "bad_key", BAD_KEYS, ids=["63-chars", "non-hex", "66-chars", "empty", "0x", "int"]
)
@pytest.mark.parametrize(
    "route", ["indexes/create", "vectors/query", "vectors/upsert", "indexes/describe"]
)
def test_malformed_index_key_is_422(target, route, bad_key):
    name = unique_name() if route == "indexes/create" else target.name
    r = target.client.post(
        f"/v1/{route}", json={"index_name": name, "index_key": bad_key, **valid_fields(route)}
    )
    error(r, 422)
    if isinstance(bad_key, str) and bad_key:
        assert_secret_free(r, bad_key)
    if route == "indexes/create":
        assert name not in ok(target.client.get("/v1/indexes/list"))["indexes"]


# (route, fields) pairs that must be rejected with 422 against the module's 4-d index.
INVALID: list[tuple[str, str, dict[str, Any]]] = [
    ("dim-query", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0]}),
    ("dim-query-2d", "vectors/query", {"query_vectors": [[1.0, 2.0, 3.0, 4.0, 5.0]]}),
    ("dim-upsert", "vectors/upsert", {"items": [{"id": "n", "vector": [1.0, 2.0, 3.0, 4.0, 5.0]}]}),
    ("ragged-query", "vectors/query", {"query_vectors": [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]]}),
    ("3d-query", "vectors/query", {"query_vectors": [[[1.0, 2.0, 3.0, 4.0]]]}),
    ("string-vector", "vectors/query", {"query_vectors": ["a", "b", "c", "d"]}),
    ("empty-vector", "vectors/query", {"query_vectors": []}),
    ("float32-overflow", "vectors/query", {"query_vectors": [1e39, 0.0, 0.0, 0.0]}),
    (
        "float32-overflow-upsert",
        "vectors/upsert",
        {"items": [{"id": "n", "vector": [0.0, -1e39, 0.0, 0.0]}]},
    ),
    ("no-vector", "vectors/upsert", {"items": [{"id": "n", "contents": SECRET_CONTENTS}]}),
    (
        "nested-item-vector",
        "vectors/upsert",
        {"items": [{"id": "n", "vector": [[1.0, 2.0, 3.0, 4.0]]}]},
    ),
    (
        "ragged-items",
        "vectors/upsert",
        {"items": [{"id": "n", "vector": [1.0, 2.0, 3.0, 4.0]}, {"id": "d", "vector": [1.0, 2.0]}]},
    ),
    ("empty-query-row", "vectors/query", {"query_vectors": [[]]}),
    (
        "id-too-long",
        "vectors/upsert",
        {"items": [{"id": "y" * 1025, "vector": [1.0, 2.0, 3.0, 4.0]}]},
    ),
    ("empty-items", "vectors/upsert", {"items": []}),
    ("empty-id-upsert", "vectors/upsert", {"items": [{"id": "", "vector": [1.0, 2.0, 3.0, 4.0]}]}),
    (
        "dup-id-upsert",
        "vectors/upsert",
        {
            "items": [
                {"id": "d", "vector": [1.0, 2.0, 3.0, SECRET_FLOAT], "contents": SECRET_CONTENTS},
                {"id": "d", "vector": [1.0, 2.0, 3.0, 4.0]},
            ]
        },
    ),
    ("empty-id-get", "vectors/get", {"ids": ["a", ""]}),
    ("empty-id-delete", "vectors/delete", {"ids": [""]}),
    ("include-get", "vectors/get", {"ids": ["a"], "include": ["embedding"]}),
    ("include-get-distance", "vectors/get", {"ids": ["a"], "include": ["distance"]}),
    (
        "include-query",
        "vectors/query",
        {"query_vectors": [1.0, 2.0, 3.0, 4.0], "include": ["embedding"]},
    ),
    (
        "include-query-bogus",
        "vectors/query",
        {"query_vectors": [1.0, 2.0, 3.0, 4.0], "include": ["metadata", "x"]},
    ),
    ("top_k-0", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0, 4.0], "top_k": 0}),
    ("top_k-negative", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0, 4.0], "top_k": -5}),
    ("top_k-10001", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0, 4.0], "top_k": 10_001}),
    ("top_k-string", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0, 4.0], "top_k": "ten"}),
    ("n_probes-negative", "vectors/query", {"query_vectors": [1.0, 2.0, 3.0, 4.0], "n_probes": -1}),
    (
        "both-query-inputs",
        "vectors/query",
        {"query_vectors": [1.0, 2.0, 3.0, 4.0], "query_contents": "text"},
    ),
    ("neither-query-input", "vectors/query", {}),
    ("neither-query-input-nulls", "vectors/query", {"query_vectors": None, "query_contents": None}),
    (
        "contents-not-string",
        "vectors/upsert",
        {
            "items": [
                {"id": "n", "vector": [1.0, 2.0, 3.0, 4.0], "contents": {"x": SECRET_CONTENTS}}
            ]
        },
    ),
    (
        "metadata-not-object",
        "vectors/upsert",
        {"items": [{"id": "n", "vector": [1.0, 2.0, 3.0, 4.0], "metadata": SECRET_META}]},
    ),
    ("train-n_lists-too-big", "indexes/train", {"n_lists": 50}),
    ("train-negative-iters", "indexes/train", {"max_iters": -1}),
]


@pytest.mark.parametrize(
    ("route", "fields"), [(r, f) for _, r, f in INVALID], ids=[n for n, _, _ in INVALID]
)
def test_invalid_parameters_are_422(target, route, fields):
    r = post(target, route, **fields)
    error(r, 422)
    assert_secret_free(r, target.key, SECRET_CONTENTS, SECRET_META, SECRET_FLOAT_TEXT)
    # Rejected writes change nothing.
    assert target.count() == 2
    assert target.get(["n", "d"]) == []


FILTERS: list[tuple[Any, str]] = [
    ({"n": {"$foo": 1}}, "$foo"),
    ({"$nor": {"n": 1}}, "$nor"),
    ({"n": {"$in": 3}}, "$in"),
    ({"n": {"$nin": "abc"}}, "$nin"),
    ({"$and": {"n": 1}}, "$and"),
    ({"$or": []}, "$or"),
    ({"$or": [1, 2]}, "$or"),
    ({"n": {"$gt": [1, 2]}}, "$gt"),
    ({"n": {"$lt": {"a": 1}}}, "$lt"),
    ({"n": {"$exists": "yes"}}, "$exists"),
    ({"n": [1, 2]}, "'n'"),
    ({"n": {"a": 1}}, "'n'"),
    ({"n": {"$eq": 1, "plain": 2}}, "'n'"),
    ({"a..b": 1}, "a..b"),
    ([{"n": 1}], "filter"),
    ("n == 1", "filter"),
]


@pytest.mark.parametrize(("flt", "named"), FILTERS, ids=[str(i) for i in range(len(FILTERS))])
def test_malformed_filter_is_422_naming_the_problem(target, flt, named):
    r = post(target, "vectors/query", query_vectors=[1.0, 2.0, 3.0, 4.0], filters=flt)
    body = error(r, 422)
    assert named in body["detail"], body["detail"]


RAW_BODIES = [
    ("nan-query", "vectors/query", '"query_vectors":[NaN,0,0,0]'),
    ("inf-query", "vectors/query", '"query_vectors":[[0,Infinity,0,0]]'),
    ("neg-inf-query", "vectors/query", '"query_vectors":[0,0,-Infinity,0]'),
    ("huge-literal-query", "vectors/query", '"query_vectors":[1e999,0,0,0]'),
    (
        "nan-upsert",
        "vectors/upsert",
        f'"items":[{{"id":"n","vector":[0,NaN,0,0],"contents":"{SECRET_CONTENTS}"}}]',
    ),
    ("inf-upsert", "vectors/upsert", '"items":[{"id":"n","vector":[0,0,0,Infinity]}]'),
    ("nan-filter", "vectors/query", '"query_vectors":[0,0,0,0],"filters":{"n":{"$gt":NaN}}'),
    ("truncated-json", "vectors/query", '"query_vectors":[0,0,'),
]


@pytest.mark.parametrize(
    ("route", "fields"), [(r, f) for _, r, f in RAW_BODIES], ids=[n for n, _, _ in RAW_BODIES]
)
def test_non_finite_numbers_and_broken_json_are_422(target, route, fields):
    body = f'{{"index_name":"{target.name}","index_key":"{target.key}",{fields}}}'
    r = raw(target, route, body)
    error(r, 422)
    assert_secret_free(r, target.key, SECRET_CONTENTS)
    assert target.count() == 2


def test_non_object_json_body_is_422(target):
    for body in ("[]", '"text"', "null", "42"):
        error(raw(target, "vectors/query", body), 422)


def test_unknown_route_and_method_use_the_error_body(http):
    error(http.get("/v1/no-such-route"), 404)
    error(http.get("/v1/vectors/query"), 405)


def test_cosine_zero_vector_is_422(make_index):
    idx = make_index(dimension=3, metric="cosine")
    error(idx.post("vectors/upsert", items=[{"id": "z", "vector": [0.0, 0.0, 0.0]}]), 422)
    idx.upsert([{"id": "a", "vector": [1.0, 0.0, 0.0]}])
    error(idx.post("vectors/query", query_vectors=[0.0, 0.0, 0.0]), 422)
    assert idx.count() == 1


def test_train_empty_index_is_422(make_index):
    idx = make_index(dimension=3)
    error(idx.post("indexes/train"), 422)
    assert idx.describe()["is_trained"] is False
