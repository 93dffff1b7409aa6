"""/v1/vectors/*: upsert, query, get, delete, list_ids, num_vectors — shapes and semantics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import clustered, exact_knn
from tests.integration.support import (
    assert_ascending,
    ids_of,
    ok,
)


def _items(vectors: np.ndarray, prefix: str = "v") -> list[dict]:
    return [
        {
            "id": f"{prefix}{j}",
            "vector": v.tolist(),
            "contents": f"contents of {prefix}{j}",
            "metadata": {"j": j, "even": j % 2 == 0, "tag": f"t{j % 3}"},
        }
        for j, v in enumerate(vectors)
    ]


@pytest.fixture(scope="module")
def filled(http):
    """A 150-item ivfflat index (dim 8) shared by the read-only tests of this module."""
    from tests.integration.support import create_index

    idx = create_index(http, dimension=8)
    vectors = np.random.default_rng(11).normal(size=(150, 8)).astype(np.float32)
    items = _items(vectors)
    body = ok(idx.post("vectors/upsert", items=items))
    assert set(body) == {"status", "message", "upserted_count"}
    assert body["status"] == "success" and body["upserted_count"] == 150
    yield idx, vectors, items
    idx.drop()


def test_counts_and_list_ids(filled):
    idx, _, items = filled
    assert ok(idx.post("vectors/num_vectors"))["result"] == 150
    body = ok(idx.post("vectors/list_ids"))
    assert set(body) == {"ids", "count"}
    assert body["count"] == 150 and sorted(body["ids"]) == sorted(it["id"] for it in items)


def test_query_1d_gives_flat_list_with_defaults(filled):
    idx, vectors, items = filled
    results = idx.query(query_vectors=vectors[7])
    assert isinstance(results, list) and all(isinstance(r, dict) for r in results)
    assert len(results) == 100  # default top_k
    for r in results:
        assert set(r) == {"id", "distance", "metadata"}  # default include
    assert results[0]["id"] == "v7" and results[0]["distance"] == pytest.approx(0.0, abs=1e-5)
    assert results[0]["metadata"] == items[7]["metadata"]
    assert_ascending(results)
    d, rows = exact_knn(vectors, vectors[7], 100)
    assert ids_of(results) == [f"v{j}" for j in rows[0]]
    np.testing.assert_allclose([r["distance"] for r in results], d[0], rtol=1e-4, atol=1e-4)
    by_id = {it["id"]: it for it in items}
    assert all(r["metadata"] == by_id[r["id"]]["metadata"] for r in results)


def test_query_2d_gives_one_list_per_query_in_order(filled):
    idx, vectors, _ = filled
    order = [42, 3, 99, 3]
    results = idx.query(query_vectors=vectors[order], top_k=5)
    assert len(results) == len(order)
    _, rows = exact_knn(vectors, vectors[order], 5)
    for q, res in enumerate(results):
        assert isinstance(res, list) and len(res) == 5
        assert res[0]["id"] == f"v{order[q]}"
        assert ids_of(res) == [f"v{j}" for j in rows[q]]
        assert_ascending(res)
    # A batch of one is still a batch: a list holding one list.
    single = idx.query(query_vectors=vectors[[5]], top_k=3)
    assert len(single) == 1 and isinstance(single[0], list) and single[0][0]["id"] == "v5"


def test_explicit_nulls_mean_defaults(filled):
    idx, vectors, _ = filled
    nulls = {
        "query_contents": None,
        "top_k": None,
        "n_probes": None,
        "greedy": None,
        "filters": None,
        "include": None,
    }
    with_nulls = idx.query(query_vectors=vectors[1], **nulls)
    omitted = idx.query(query_vectors=vectors[1])
    assert with_nulls == omitted
    assert len(with_nulls) == 100 and set(with_nulls[0]) == {"id", "distance", "metadata"}
    # get: include null = every field
    assert idx.get(["v1"], include=None) == idx.get(["v1"])


@pytest.mark.parametrize(
    ("include", "keys"),
    [
        (["distance"], {"id", "distance"}),
        (["metadata"], {"id", "distance", "metadata"}),
        (["metadata", "distance"], {"id", "distance", "metadata"}),
        (["vector", "contents"], {"id", "distance", "vector", "contents"}),
        (["metadata", "contents", "vector"], {"id", "distance", "metadata", "vector", "contents"}),
        ([], {"id", "distance"}),
    ],
)
def test_query_include_subsets(filled, include, keys):
    """distance is always there (CyborgDB's clients rely on it); vector and contents come
    from the stored items, as get returns them."""
    idx, vectors, items = filled
    results = idx.query(query_vectors=vectors[2], top_k=10, include=include)
    assert len(results) == 10 and results[0]["id"] == "v2"
    assert all(set(r) == keys for r in results)
    for r in results:
        j = int(r["id"][1:])
        if "vector" in keys:
            assert np.array_equal(np.asarray(r["vector"], dtype=np.float32), vectors[j])
        if "contents" in keys:
            assert r["contents"] == items[j]["contents"]
    batch = idx.query(query_vectors=vectors[2:4], top_k=3, include=include)
    assert [ids_of(row)[0] for row in batch] == ["v2", "v3"]
    assert all(set(r) == keys for row in batch for r in row)


def test_fewer_items_than_top_k_returns_all(make_index):
    idx = make_index(dimension=3)
    vectors = np.arange(21, dtype=np.float32).reshape(7, 3)
    idx.upsert_arrays([f"s{j}" for j in range(7)], vectors)
    results = idx.query(query_vectors=[0.0, 0.0, 0.0], top_k=50)
    assert ids_of(results) == [f"s{j}" for j in range(7)]
    batch = idx.query(query_vectors=[[0.0, 0.0, 0.0], [100.0, 100.0, 100.0]], top_k=10_000)
    assert [len(r) for r in batch] == [7, 7]
    assert ids_of(batch[1]) == [f"s{j}" for j in reversed(range(7))]


def test_query_on_empty_index(make_index):
    idx = make_index(dimension=4)
    assert idx.query(query_vectors=[1.0, 2.0, 3.0, 4.0]) == []
    assert idx.query(query_vectors=[[1.0, 2.0, 3.0, 4.0]] * 2) == [[], []]
    idx.drop()
    dimensionless = make_index()
    assert dimensionless.query(query_vectors=[1.0, 2.0]) == []


def test_get_keeps_request_order_and_omits_unknown_ids(filled):
    idx, vectors, items = filled
    results = idx.get(["v9", "nope", "v0", "v149", "also-missing", "v10"])
    assert ids_of(results) == ["v9", "v0", "v149", "v10"]
    for r in results:
        j = int(r["id"][1:])
        assert set(r) == {"id", "vector", "contents", "metadata"}  # ivfflat default: all
        assert np.array_equal(np.asarray(r["vector"], dtype=np.float32), vectors[j])
        assert r["contents"] == items[j]["contents"]
        assert r["metadata"] == items[j]["metadata"]
    assert idx.get(["unknown-1", "unknown-2"]) == []


@pytest.mark.parametrize(
    ("include", "keys"),
    [
        (["vector"], {"id", "vector"}),
        (["contents"], {"id", "contents"}),
        (["metadata"], {"id", "metadata"}),
        (["metadata", "contents"], {"id", "metadata", "contents"}),
        ([], {"id"}),
    ],
)
def test_get_include_subsets(filled, include, keys):
    idx, vectors, items = filled
    results = idx.get(["v3", "v4"], include=include)
    assert ids_of(results) == ["v3", "v4"]
    for r in results:
        assert set(r) == keys
        j = int(r["id"][1:])
        if "vector" in keys:
            assert np.array_equal(np.asarray(r["vector"], dtype=np.float32), vectors[j])
        if "metadata" in keys:
            assert r["metadata"] == items[j]["metadata"]
        if "contents" in keys:
            assert r["contents"] == items[j]["contents"]


@pytest.mark.parametrize("index_type", ["ivf", "ivfpq"])
def test_vector_from_compressed_index_is_the_original(make_index, index_type):
    """ivf/ivfpq keep the original vectors beside their codes (untrained: in their one flat
    list; trained: sealed on disk, tests/integration/test_api_storage_precisions.py): get and
    query return them as sent, as CyborgDB's SDKs ask."""
    extra = {"pq_dim": 4} if index_type == "ivfpq" else {}
    idx = make_index(index_type=index_type, dimension=8, **extra)
    v = [0.1 * i for i in range(8)]
    idx.upsert([{"id": "a", "vector": v, "contents": "c", "metadata": {"m": 1}}])
    full = [{"id": "a", "vector": v, "contents": "c", "metadata": {"m": 1}}]
    got = ok(idx.post("vectors/get", ids=["a"], include=["vector"]))["results"]
    assert got == [{"id": "a", "vector": pytest.approx(v)}]
    assert idx.get(["a"], include=["metadata", "vector", "contents"]) == [
        {**full[0], "vector": pytest.approx(v)}
    ]
    [hit] = idx.query(query_vectors=v, include=["vector", "contents"])
    assert set(hit) == {"id", "distance", "vector", "contents"} and hit["vector"] == pytest.approx(
        v
    )


def test_get_and_delete_tolerate_empty_and_repeated_ids(filled, make_index):
    idx, _, _ = filled
    assert ok(idx.post("vectors/get", ids=[])) == {"results": []}
    assert ids_of(idx.get(["v5", "v6", "v5", "v5"])) == ["v5", "v6"]
    other = make_index(dimension=2)
    other.upsert([{"id": "a", "vector": [1.0, 0.0]}, {"id": "b", "vector": [0.0, 1.0]}])
    assert ok(other.post("vectors/delete", ids=[]))["deleted_count"] == 0
    assert ok(other.post("vectors/delete", ids=["a", "a"]))["deleted_count"] == 1
    assert other.count() == 1


def test_upsert_replaces_vector_metadata_and_contents_completely(make_index):
    idx = make_index(dimension=4)
    old = {
        "id": "a",
        "vector": [10.0, 0.0, 0.0, 0.0],
        "contents": "old text",
        "metadata": {"x": 1, "old": "yes"},
    }
    idx.upsert(
        [old, {"id": "b", "vector": [0.0, 10.0, 0.0, 0.0], "contents": "b", "metadata": {"x": 2}}]
    )
    idx.upsert([{"id": "a", "vector": [0.0, 0.0, 10.0, 0.0], "metadata": {"new": True}}])
    assert idx.count() == 2
    [got] = idx.get(["a"])
    assert got["vector"] == [0.0, 0.0, 10.0, 0.0]
    assert got["metadata"] == {"new": True}
    assert got.get("contents") is None
    # The old vector and the old metadata no longer match anything.
    near_old = idx.query(query_vectors=[10.0, 0.0, 0.0, 0.0], top_k=2)
    assert sorted(ids_of(near_old)) == ["a", "b"]
    assert [r["distance"] for r in near_old] == [pytest.approx(np.sqrt(200.0))] * 2
    assert idx.query(query_vectors=[0.0, 0.0, 10.0, 0.0], top_k=1)[0]["id"] == "a"
    assert idx.query(query_vectors=[10.0, 0.0, 0.0, 0.0], filters={"old": "yes"}) == []
    assert idx.query(query_vectors=[10.0, 0.0, 0.0, 0.0], filters={"x": 1}) == []
    assert ids_of(idx.query(query_vectors=[10.0, 0.0, 0.0, 0.0], filters={"new": True})) == ["a"]
    # Replacing within one request batch and across shards keeps one item per id.
    idx.upsert([{"id": f"r{j}", "vector": [float(j)] * 4} for j in range(20)])
    idx.upsert(
        [{"id": f"r{j}", "vector": [float(j) + 0.5] * 4, "contents": f"n{j}"} for j in range(20)]
    )
    assert idx.count() == 22
    got = idx.get([f"r{j}" for j in range(20)])
    assert [g["vector"] for g in got] == [[j + 0.5] * 4 for j in range(20)]
    assert [g["contents"] for g in got] == [f"n{j}" for j in range(20)]


def test_delete_vectors(make_index):
    idx = make_index(dimension=4)
    vectors = (
        np.eye(4, dtype=np.float32).repeat(3, axis=0) * np.arange(1, 13, dtype=np.float32)[:, None]
    )
    ids = [f"x{j}" for j in range(12)]
    idx.upsert_arrays(ids, vectors)
    body = ok(idx.post("vectors/delete", ids=["x1", "missing", "x5", "x7"]))
    assert set(body) == {"status", "message", "deleted_count"}
    assert body["status"] == "success" and body["deleted_count"] == 3
    assert idx.delete_ids(["x1", "x5"]) == 0  # already gone: not counted
    assert idx.delete_ids(["never-there"]) == 0
    remaining = [i for i in ids if i not in {"x1", "x5", "x7"}]
    assert idx.count() == 9
    assert sorted(idx.list_ids()) == sorted(remaining)
    assert ids_of(idx.get(ids)) == remaining
    results = idx.query(query_vectors=vectors[1], top_k=100)
    assert sorted(ids_of(results)) == sorted(remaining)
    # A deleted id can be written again.
    idx.upsert([{"id": "x1", "vector": vectors[1].tolist()}])
    assert idx.query(query_vectors=vectors[1], top_k=1)[0]["id"] == "x1"
    assert idx.count() == 10


def test_item_without_metadata_or_contents(make_index):
    idx = make_index(dimension=2)
    idx.upsert([{"id": "bare", "vector": [1.0, 2.0]}])
    idx.upsert([{"id": "nulls", "vector": [5.0, 5.0], "contents": None, "metadata": None}])
    # metadata is a dict on every result, {} when none was stored (as CyborgDB 0.18 answers)
    [got] = idx.get(["nulls"])
    assert got == {"id": "nulls", "vector": [5.0, 5.0], "contents": None, "metadata": {}}
    [got] = idx.get(["bare"])
    assert got == {"id": "bare", "vector": [1.0, 2.0], "contents": None, "metadata": {}}
    hit = idx.query(query_vectors=[1.0, 2.0])[0]
    assert hit == {"id": "bare", "distance": 0.0, "metadata": {}}


def test_unusual_ids_metadata_and_contents_round_trip(make_index):
    idx = make_index(dimension=4)
    ids = ["a/b", "ü-ñ 🚀", "x" * 1024, " lead", "new\nline", "..", 'q"uote', "0"]
    metadata = {
        "ü": ["x", 1, None, True, {"d": 2.5}],
        "big": 2**60,
        "neg": -1e300,
        "s": "é\u0000z",
        "empty": {},
        "list": [],
    }
    items = [
        {
            "id": i,
            "vector": [float(n), 0.0, 0.0, 1.0],
            "contents": ["", "ünï ✓\n\t"][n % 2],
            "metadata": metadata,
        }
        for n, i in enumerate(ids)
    ]
    idx.upsert(items)
    got = idx.get(list(reversed(ids)), include=["metadata", "contents"])
    assert ids_of(got) == list(reversed(ids))
    for g in got:
        n = ids.index(g["id"])
        assert g["contents"] == items[n]["contents"]
        assert g["metadata"] == metadata
    assert sorted(idx.list_ids()) == sorted(ids)
    assert len(
        idx.query(query_vectors=[0.0, 0.0, 0.0, 1.0], filters={"ü": "x"}, include=[])
    ) == len(ids)
    assert len(
        idx.query(query_vectors=[0.0, 0.0, 0.0, 1.0], filters={"big": 2**60}, include=[])
    ) == len(ids)
    assert ids_of(idx.query(query_vectors=[7.0, 0.0, 0.0, 1.0], top_k=1)) == ["0"]
    assert idx.delete_ids(ids) == len(ids)
    assert idx.count() == 0


def test_untrained_index_answers_exact_brute_force(make_index):
    data = clustered(1500, 32, n_clusters=30, seed=5)
    queries = clustered(20, 32, n_clusters=30, seed=6)
    idx = make_index(dimension=32)
    ids = [f"e{j}" for j in range(len(data))]
    idx.upsert_arrays(ids, data, batch=500)
    assert idx.describe()["is_trained"] is False
    results = idx.query(query_vectors=queries, top_k=25)
    dist, rows = exact_knn(data, queries, 25)
    for q, res in enumerate(results):
        assert ids_of(res) == [ids[j] for j in rows[q]]
        np.testing.assert_allclose([r["distance"] for r in res], dist[q], rtol=1e-4, atol=1e-4)
