"""Distance metrics against numpy, and the three index types before and after training."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import exact_knn
from tests.integration.support import assert_ascending, ids_of


def _data(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Norms vary a lot, so cosine and euclidean rankings differ.
    return (rng.normal(size=(n, d)) * rng.uniform(0.2, 5.0, size=(n, 1))).astype(np.float32)


def _check_exact(idx, data, ids, queries, k, metric, **query_args):
    results = idx.query(query_vectors=queries, top_k=k, **query_args)
    dist, rows = exact_knn(data, queries, k, metric)
    for q, res in enumerate(results):
        assert_ascending(res)
        assert ids_of(res) == [ids[j] for j in rows[q]], f"query {q}"
        np.testing.assert_allclose([r["distance"] for r in res], dist[q], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("metric", ["euclidean", "squared_euclidean", "cosine"])
def test_metric_distances_match_numpy_before_and_after_training(make_index, metric):
    data = _data(400, 16, seed=1)
    queries = _data(8, 16, seed=2)
    # An item pointing exactly along query 0 but 40 times longer: nearest by cosine only.
    data[0] = queries[0] * 40
    ids = [f"m{j}" for j in range(len(data))]
    idx = make_index(dimension=16, metric=metric)
    idx.upsert_arrays(ids, data)
    _check_exact(idx, data, ids, queries, 10, metric)
    top = idx.query(query_vectors=queries[0], top_k=1)[0]
    if metric == "cosine":
        assert top["id"] == "m0" and top["distance"] == pytest.approx(0.0, abs=1e-5)
    else:
        assert top["id"] != "m0"
    if metric == "squared_euclidean":
        assert top["distance"] == pytest.approx(
            float(((queries[0] - data[int(top["id"][1:])]) ** 2).sum()), rel=1e-4
        )

    # get returns the original vectors (not the unit vectors a cosine index searches).
    got = idx.get(ids[:5], include=["vector"])
    np.testing.assert_allclose(
        np.asarray([g["vector"] for g in got]), data[:5], rtol=1e-5, atol=1e-5
    )

    # Trained, probing every list: still the exact answer in the metric's units.
    idx.train(n_lists=4)
    assert idx.describe()["is_trained"] is True
    _check_exact(idx, data, ids, queries, 10, metric, n_probes=4)


@pytest.mark.parametrize(
    ("index_type", "config", "min_recall", "max_rel_err"),
    [
        ("ivf", {}, 0.9, 0.05),
        ("ivfpq", {"pq_dim": 8, "pq_bits": 8}, 0.7, 0.25),
    ],
)
def test_compressed_index_types(make_index, index_type, config, min_recall, max_rel_err):
    data = np.random.default_rng(3).normal(size=(1000, 16)).astype(np.float32)
    queries = np.random.default_rng(4).normal(size=(20, 16)).astype(np.float32)
    ids = [f"c{j}" for j in range(len(data))]
    idx = make_index(index_type=index_type, dimension=16, **config)
    idx.upsert_arrays(ids, data)
    # Untrained: exact search whatever the type.
    _check_exact(idx, data, ids, queries, 10, "euclidean")

    body = idx.train(n_lists=8)
    assert body["status"] == "success"
    desc = idx.describe()
    assert desc["is_trained"] is True and desc["index_config"]["n_lists"] == 8
    assert desc["num_vectors"] == 1000

    results = idx.query(query_vectors=queries, top_k=10, n_probes=8)
    _, rows = exact_knn(data, queries, 10)
    assert [len(res) for res in results] == [10] * len(queries)
    recall = (
        sum(1 for q, res in enumerate(results) for r in res if r["id"] in {ids[j] for j in rows[q]})
        / rows.size
    )
    assert recall >= min_recall, recall
    true = {ids[j]: j for j in range(len(ids))}
    for q, res in enumerate(results):
        assert_ascending(res)
        for r in res:
            d_true = float(np.linalg.norm(data[true[r["id"]]] - queries[q]))
            assert abs(r["distance"] - d_true) <= max_rel_err * d_true + 1e-3, (r, d_true)

    # Items written after training are searchable (encoded with the trained codebooks).
    new = np.random.default_rng(5).normal(size=(5, 16)).astype(np.float32) * 1.5
    idx.upsert_arrays([f"new{j}" for j in range(5)], new)
    assert idx.count() == 1005
    hits = idx.query(query_vectors=new, top_k=5, n_probes=8)
    assert sum(res[0]["id"] == f"new{q}" for q, res in enumerate(hits)) >= (
        5 if index_type == "ivf" else 3
    )
