"""Training: the n_lists rule, k-means tolerance, sample bounds, n_probes calibration."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from actors.control.training import (
    TrainParams,
    auto_n_lists,
    calibrate_nprobe,
    kmeans,
    sample_size,
    train_template,
)
from actors.errors import InvalidRequest
from actors.types import IndexConfig
from tests.helpers import clustered, exact_knn


def test_auto_n_lists_rule() -> None:
    assert auto_n_lists(100_000) == 1265
    assert auto_n_lists(1_000_000) == 4000
    assert auto_n_lists(1000) == 25  # capped by 39 points per list
    assert auto_n_lists(10) == 1


def test_sample_size_respects_memory_bound() -> None:
    assert sample_size(100, 1_000_000, 128, None) == 20_000  # 128 per list, at least 20,000
    assert sample_size(1000, 1_000_000, 128, None) == 128_000
    assert sample_size(100, 1_000_000, 128, 512 * 1000) == 1000


def test_kmeans_tolerance_stops_early() -> None:
    x = clustered(5000, 8, n_clusters=10, seed=1)
    loose = kmeans(x, 10, 50, tolerance=0.5, seed=0)
    tight = kmeans(x, 10, 50, tolerance=None, seed=0)
    assert loose.shape == tight.shape == (10, 8)


def test_pq_needs_enough_items() -> None:
    with pytest.raises(InvalidRequest, match="at least 256"):
        train_template(clustered(100, 16), "ivfpq", 2, 4, 8, TrainParams())


@pytest.mark.parametrize("index_type", ["ivfflat", "ivf"])
def test_calibrated_nprobe_reaches_target_on_fresh_queries(index_type: str) -> None:
    data = clustered(20_300, 32, n_clusters=200, seed=2, spread=0.6)
    x, q = data[:20_000], data[20_000:]  # fresh queries from the same distribution
    template = train_template(x, index_type, 200, None, None, TrainParams(max_iters=10))
    table = calibrate_nprobe(template, x, 0.95)
    ks = [k for k, _ in table]
    probes = [p for _, p in table]
    assert ks == [1, 10, 100] and probes == sorted(probes) and 1 <= probes[1] < 200
    index = faiss.clone_index(template)
    index.add(x)
    _, truth = exact_knn(x, q, 10)
    index.nprobe = probes[1]
    _, found = index.search(q, 10)
    recall = np.mean([len(np.intersect1d(f, t)) / 10 for f, t in zip(found, truth)])
    if index_type == "ivfflat":
        assert recall >= 0.93
    else:
        assert recall >= 0.85


@pytest.mark.parametrize("index_type", ["ivfflat", "ivfpq"])
def test_calibrated_nprobe_is_the_smallest_that_faiss_search_confirms(index_type: str) -> None:
    """The table read from one ranking of the centroids per held-out query is what searching
    the held-out queries with faiss at every n_probes would give: the goal is reached at the
    chosen n_probes and missed one below it (the reference being brute force for flat lists,
    what probing every list finds for codes)."""
    x = clustered(12_000, 32, n_clusters=40, seed=4, spread=0.8)
    template = train_template(x, index_type, 120, 8, 8, TrainParams(max_iters=10))
    table = dict(calibrate_nprobe(template, x, 0.95, n_queries=300, seed=11))
    perm = np.random.default_rng(11).permutation(len(x))  # calibrate_nprobe's held-out split
    q, base = x[perm[:300]], x[perm[300:]]
    index = faiss.clone_index(template)
    index.add(base)
    previous = 0
    for k, nprobe in table.items():
        if index_type == "ivfflat":
            _, truth = exact_knn(base, q, k)
        else:
            index.nprobe = template.nlist
            _, truth = index.search(q, k)
        goal = min(1.0, 0.95 + 2 * np.sqrt(0.95 * 0.05 / truth.size))

        def recall(p: int, k: int = k, truth: np.ndarray = truth) -> float:
            index.nprobe = p
            _, found = index.search(q, k)
            return sum(len(np.intersect1d(f, t)) for f, t in zip(found, truth)) / truth.size

        assert recall(nprobe) >= goal
        if nprobe > max(previous, 1):  # (the table never decreases with top_k)
            assert recall(nprobe - 1) < goal
        previous = nprobe


def test_auto_nprobe_scales_with_top_k() -> None:
    cfg = IndexConfig(
        "n",
        "i",
        "ivfflat",
        "euclidean",
        2,
        8,
        version=1,
        n_lists=1000,
        nprobe_table=((1, 4), (10, 8), (100, 20)),
    )
    assert cfg.auto_nprobe(1) == 4
    assert cfg.auto_nprobe(10) == 8
    assert cfg.auto_nprobe(50) == 20
    assert cfg.auto_nprobe(400) == 40
    assert cfg.auto_nprobe(10**7) == 1000
    assert IndexConfig("n", "i", "ivfflat", "euclidean", 2).auto_nprobe(10) == 1
