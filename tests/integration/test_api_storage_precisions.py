"""CyborgDB's storage precisions through the HTTP API: an index of each tier is created,
filled, trained and queried; describe answers the precision it was created with; the codes
alone (``rerank_mult`` 1) keep recall@10 against exact search above the tier's floor, and
reranking their candidates by the full vectors (the default) finds the exact neighbours.

The floors sit below what each tier's codes reach with every list probed on this data (float32
1.0, float16 and tq12 0.999, tq8 0.99, tq6 0.97, tq4 0.87; docs/performance.md, Storage
precisions, measures the same on SIFT and text embeddings), by about three standard errors
of 200 queries' estimate."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.client import generate_key
from tests.helpers import clustered, exact_knn
from tests.integration.support import Index, ok, unique_name

K = 10
FLOORS = {
    "float32": 0.99,
    "float16": 0.98,
    "tq12": 0.98,
    "tq8": 0.97,
    "tq6": 0.93,
    "tq4": 0.82,
}
TYPES = {"float32": "ivfflat"}  # the others are scalar-quantised ivf


@pytest.fixture(scope="module")
def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1,800 stored vectors (under the service's automatic training threshold), 200 fresh
    queries from the same clusters, and their exact 10 nearest."""
    data = clustered(2000, 64, n_clusters=40, seed=11, spread=0.5)
    x, q = data[:1800], data[1800:]
    _, truth = exact_knn(x, q, K)
    return x, q, truth


def recall(results: list[list[dict]], truth: np.ndarray) -> float:
    found = [{int(r["id"]) for r in rows} for rows in results]
    return float(np.mean([len(f & set(t.tolist())) for f, t in zip(found, truth)]) / K)


@pytest.mark.parametrize("precision", list(FLOORS))
def test_each_precision_is_stored_trained_and_searched(http, dataset, precision):
    x, q, truth = dataset
    idx = Index(http, unique_name("prec"), generate_key())
    ok(http.post("/v1/indexes/create", json=idx.body(dimension=64, storage_precision=precision)))
    try:
        desc = idx.describe()
        assert desc["storage_precision"] == precision
        assert desc["index_type"] == TYPES.get(precision, "ivf")
        idx.upsert_arrays([str(i) for i in range(len(x))], x)
        # Untrained: one exact list, whatever the precision.
        assert recall(idx.query(query_vectors=q[:20], top_k=K), truth[:20]) == 1.0
        ok(http.post("/v1/indexes/train", json=idx.body()))
        desc = idx.describe()
        assert desc["is_trained"] and desc["storage_precision"] == precision
        n_lists = desc["n_lists"]
        assert n_lists > 1
        every = {"query_vectors": q, "top_k": K, "n_probes": n_lists}
        codes = recall(idx.query(**every, rerank_mult=1), truth)
        assert codes >= FLOORS[precision], f"{precision}: recall@10 {codes:.4f}"
        answers = idx.query(**every)
        every_list = recall(answers, truth)
        assert every_list >= 0.995, f"{precision}: reranked recall@10 {every_list:.4f}"
        if precision == "tq4":
            assert codes < 0.95  # (so the rerank is what finds them)
        # The originals come back, not decoded codes.
        got = idx.get([str(i) for i in range(0, len(x), 97)], include=["vector"])
        want = x[::97]
        assert np.array_equal(np.array([r["vector"] for r in got], np.float32), want)
        # Distances are exact, not the codes' estimates.
        for rows, t, v in zip(answers, truth, q, strict=True):
            got = {int(r["id"]): r["distance"] for r in rows}
            for i in set(got) & set(t.tolist()):
                assert got[i] == pytest.approx(float(np.linalg.norm(x[i] - v)), rel=1e-4)
        # Automatic probing aims at 95% of what the codes reach with every list.
        auto = recall(idx.query(query_vectors=q, top_k=K), truth)
        assert auto >= 0.9 * every_list, f"{precision}: automatic {auto:.4f}"
    finally:
        idx.drop()
