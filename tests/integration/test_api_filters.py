"""Metadata filters over HTTP against a brute-force Python oracle on the same data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.helpers import clustered, exact_knn
from tests.integration.support import (
    assert_ascending,
    create_index,
    error,
    ids_of,
    ok,
)
from tests.unit.filter_oracle import matches  # the one reference evaluator of the filter language

N = 1200
DIM = 8
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def make_metadata(j: int, rng: np.random.Generator) -> dict[str, Any] | None:
    if j % 37 == 0:
        return None  # items without metadata
    doc: dict[str, Any] = {
        "cat": ["a", "b", "c", "d"][int(rng.integers(4))],
        "n": int(rng.integers(0, 100)),
        "x": round(float(rng.random()), 4),
        "flag": bool(rng.random() < 0.3),
        "tags": [t for t in ("red", "green", "blue", "black") if rng.random() < 0.35],
        "nested": {
            "k": int(rng.integers(0, 5)),
            "s": ["p", "q", "r"][int(rng.integers(3))],
            "deep": {"z": j % 7},
        },
        "name": WORDS[j % len(WORDS)] + str(j % 13),
    }
    opt = j % 5
    if opt == 1:
        doc["opt"] = None
    elif opt == 2:
        doc["opt"] = j % 10
    elif opt == 3:
        doc["opt"] = "text"
    elif opt == 4:
        doc["opt"] = [1, None, "z"]
    # One field with values of several types: equality is type-strict.
    doc["mixed"] = [1, "1", True, 1.5, False, 0][j % 6]
    return doc


@pytest.fixture(scope="module")
def dataset(http):
    rng = np.random.default_rng(42)
    vectors = rng.normal(size=(N, DIM)).astype(np.float32)
    metadata = [make_metadata(j, rng) for j in range(N)]
    ids = [f"f{j}" for j in range(N)]
    idx = create_index(http, dimension=DIM)
    idx.upsert_arrays(ids, vectors, metadata=metadata, batch=600)
    yield idx, vectors, metadata, ids
    idx.drop()


FILTERS: list[dict[str, Any]] = [
    {"cat": "a"},
    {"cat": {"$eq": "b"}},
    {"cat": {"$ne": "a"}},
    {"n": {"$gt": 50}},
    {"n": {"$gte": 50}},
    {"n": {"$lt": 10}},
    {"n": {"$lte": 10}},
    {"x": {"$gt": 0.25, "$lte": 0.5}},
    {"n": {"$gte": 10, "$lt": 20}, "cat": "c"},
    {"n": 42},
    {"n": 42.0},
    {"n": {"$in": [1, 2, 3.0, "4"]}},
    {"cat": {"$in": ["a", "c"]}},
    {"cat": {"$nin": ["a", "c"]}},
    {"name": {"$gt": "echo"}},
    {"name": {"$lte": "charlie5"}},
    {"flag": True},
    {"flag": {"$ne": True}},
    {"tags": "red"},
    {"tags": {"$in": ["blue", "black"]}},
    {"tags": {"$nin": ["red"]}},
    {"tags": {"$exists": True}},
    {"nested.k": 3},
    {"nested.s": {"$in": ["p", "r"]}},
    {"nested.deep.z": {"$gte": 5}},
    {"nested": {"$exists": False}},
    {"opt": {"$exists": True}},
    {"opt": {"$exists": False}},
    {"opt": None},
    {"opt": {"$ne": None}},
    {"opt": {"$in": [None, 3]}},
    {"opt": "z"},
    {"opt": {"$gt": 5}},
    {"mixed": 1},
    {"mixed": True},
    {"mixed": "1"},
    {"mixed": {"$gt": 0}},
    {"mixed": {"$ne": False}},
    {"$and": [{"cat": "a"}, {"flag": False}]},
    {"$or": [{"cat": "a"}, {"n": {"$gt": 90}}]},
    {
        "$or": [
            {"$and": [{"cat": "b"}, {"tags": "red"}]},
            {"nested.k": {"$in": [0, 4]}, "flag": True},
        ]
    },
    {"$and": [{"$or": [{"n": {"$lt": 5}}, {"n": {"$gt": 95}}]}, {"cat": {"$ne": "d"}}]},
    {"no_such_field": 1},
    {"no_such_field": {"$ne": 1}},
    {},
]


@pytest.mark.parametrize("flt", FILTERS, ids=[str(f) for f in FILTERS])
def test_filter_matches_oracle(dataset, flt):
    idx, vectors, metadata, ids = dataset
    expected = [j for j in range(N) if matches(metadata[j], flt)]
    query = vectors[17] * 0.5
    results = idx.query(
        query_vectors=query, top_k=10_000, filters=flt, include=["distance", "metadata"]
    )
    assert_ascending(results)
    # Every match, nothing else, in exact distance order (the index is untrained: exact search).
    _, order = (
        exact_knn(vectors[expected], query, len(expected))
        if expected
        else (None, np.zeros((1, 0), int))
    )
    assert ids_of(results) == [ids[expected[i]] for i in order[0]]
    for r in results:
        stored = metadata[int(r["id"][1:])]
        assert r["metadata"] == (stored if stored is not None else {})  # {}: none stored
    # A small top_k keeps the nearest matches.
    top = idx.query(query_vectors=query, top_k=7, filters=flt, include=[])
    assert ids_of(top) == [ids[expected[i]] for i in order[0][:7]]


@pytest.mark.parametrize("flt", FILTERS[::3], ids=[str(f) for f in FILTERS[::3]])
def test_query_metadata_returns_every_match(dataset, flt):
    """Metadata-only search (CyborgDB 0.18's query_metadata): the ids the filter matches,
    capped by top_k, with get's fields when include asks for them."""
    idx, _, metadata, ids = dataset
    expected = {ids[j] for j in range(N) if matches(metadata[j], flt)}
    body = ok(idx.post("vectors/query_metadata", filters=flt, top_k=None))
    assert sorted(body["ids"]) == sorted(expected) and body["count"] == len(expected)
    assert body["results"] == [{"id": i} for i in body["ids"]]
    capped = ok(idx.post("vectors/query_metadata", filters=flt, top_k=3, include=["metadata"]))
    assert capped["count"] == min(3, len(expected)) and set(capped["ids"]) <= expected
    for r in capped["results"]:
        stored = metadata[int(r["id"][1:])]
        assert r == {"id": r["id"], "metadata": {} if stored is None else stored}


@pytest.mark.parametrize("path", ["n", "nested.k", "name", "opt", "mixed"])
@pytest.mark.parametrize("ascending", [True, False])
def test_query_metadata_orders_by_a_field_as_mongodb_sorts(dataset, path, ascending):
    """Missing and null first, then numbers, strings, objects/arrays, booleans (reversed when
    descending); the matches of every shard merged; top_k after the sort."""
    idx, _, metadata, ids = dataset
    flt = {"cat": {"$in": ["a", "b"]}}
    expected = [j for j in range(N) if matches(metadata[j], flt)]

    def key(j: int) -> tuple[int, Any]:
        v: Any = metadata[j]
        for part in path.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is None:
            return (0, 0)
        if isinstance(v, bool):
            return (5, v)
        if isinstance(v, (int, float)):
            return (1, v)
        return (2, v) if isinstance(v, str) else (3, 0) if isinstance(v, dict) else (4, 0)

    body = ok(
        idx.post(
            "vectors/query_metadata", filters=flt, order_by=path, ascending=ascending, top_k=None
        )
    )
    got = [key(int(i[1:])) for i in body["ids"]]
    assert sorted(body["ids"]) == sorted(ids[j] for j in expected)
    assert got == sorted(got, reverse=not ascending)
    top = ok(
        idx.post(
            "vectors/query_metadata",
            filters=flt,
            order_by={path: 1 if ascending else -1},
            top_k=25,
        )
    )
    assert [key(int(i[1:])) for i in top["ids"]] == got[:25]


def test_query_metadata_refuses_what_it_cannot_do(dataset):
    idx = dataset[0]
    for extra, named in (
        ({"text": "alpha"}, "no full_text field"),
        ({"order_by": {"n": 2}}, "order_by"),
        ({"order_by": {"n": 1, "x": 1}}, "order_by"),
        ({"order_by": ""}, "order_by"),
        ({"filters": {"name": {"$regex": "a"}}}, "$regex"),
    ):
        assert named in error(idx.post("vectors/query_metadata", **extra), 422)["detail"]


def test_filter_applies_to_every_query_of_a_batch(dataset):
    idx, vectors, metadata, ids = dataset
    flt = {"$or": [{"cat": "d"}, {"tags": "green"}]}
    expected = [j for j in range(N) if matches(metadata[j], flt)]
    queries = vectors[[3, 500, 999]]
    results = idx.query(query_vectors=queries, top_k=15, filters=flt, include=["distance"])
    _, order = exact_knn(vectors[expected], queries, 15)
    assert [ids_of(res) for res in results] == [[ids[expected[i]] for i in row] for row in order]


def test_selective_filter_on_trained_index_still_fills_top_k(make_index):
    n, dim = 1900, 16
    data = clustered(n, dim, n_clusters=40, seed=9)
    rng = np.random.default_rng(10)
    rare = set(rng.choice(n, size=57, replace=False).tolist())  # 3% of the items
    bucket = {j: int(rng.integers(0, 6)) for j in rare}
    metadata = [{"rare": j in rare, "bucket": bucket.get(j, -1)} for j in range(n)]
    ids = [f"s{j}" for j in range(n)]
    idx = make_index(dimension=dim)
    idx.upsert_arrays(ids, data, metadata=metadata)
    idx.train(n_lists=40)
    desc = idx.describe()
    assert desc["is_trained"] and desc["index_config"]["n_lists"] == 40

    queries = data[[0, 1, 2, 3]] + 0.01
    rare_ids = {ids[j] for j in rare}
    # n_probes=1 alone would see about one fortieth of the items (~1-2 rare ones).
    for res in idx.query(query_vectors=queries, top_k=20, n_probes=1, filters={"rare": True}):
        assert len(res) == 20 and set(ids_of(res)) <= rare_ids
        assert_ascending(res)
    # Fewer matches than top_k: all of them.
    for res in idx.query(query_vectors=queries, top_k=100, n_probes=1, filters={"rare": True}):
        assert sorted(ids_of(res)) == sorted(rare_ids)
    few = {"rare": True, "bucket": {"$in": [1, 99]}}
    few_ids = {ids[j] for j in rare if bucket[j] == 1}
    assert 0 < len(few_ids) < 20
    for res in idx.query(query_vectors=queries, top_k=20, n_probes=1, filters=few):
        assert sorted(ids_of(res)) == sorted(few_ids)
    # Greedy probing with a filter also fills top_k.
    for res in idx.query(
        query_vectors=queries, top_k=20, n_probes=1, greedy=True, filters={"rare": True}
    ):
        assert len(res) == 20 and set(ids_of(res)) <= rare_ids
    # Probing every list: the exact filtered answer.
    rare_rows = sorted(rare)
    _, order = exact_knn(data[rare_rows], queries, 20)
    results = idx.query(query_vectors=queries, top_k=20, n_probes=40, filters={"rare": True})
    assert [ids_of(res) for res in results] == [[ids[rare_rows[i]] for i in row] for row in order]
