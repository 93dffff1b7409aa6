"""Automatic probing through the real service: describe reports the live recall estimate the
gateway measures on a share of the automatically probed queries (1% by default), and explicit
n_probes queries are neither counted nor sampled."""

from __future__ import annotations

import time

import numpy as np


def blobs(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(77).normal(size=(20, d)).astype(np.float32)
    return (centres[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, d))).astype(np.float32)


def test_describe_reports_the_measured_recall_of_automatic_probing(make_index):
    data = blobs(3000, 16, seed=1)
    idx = make_index(dimension=16)
    idx.upsert_arrays(
        [f"a{j}" for j in range(len(data))],
        data,
        metadata=[{"half": j % 2} for j in range(len(data))],
    )
    assert idx.describe()["recall"] is None  # untrained: exact search, nothing to measure
    assert idx.train()["status"] == "success"
    report = idx.describe()["recall"]
    assert report["estimate"] is None and report["auto_queries"] == 0 and report["target"] == 0.95

    q = blobs(1000, 16, seed=2)
    idx.query(query_vectors=q[:50], top_k=10, n_probes=3)  # explicit: not counted
    assert idx.describe()["recall"]["auto_queries"] == 0
    sampled = 0
    for attempt in range(20):  # 1% of 1,000 queries a request: about 10 measured each time
        idx.query(query_vectors=q, top_k=10, filters={"half": 0} if attempt % 2 else None)
        time.sleep(0.2)
        report = idx.describe()["recall"]
        sampled = report["sampled_queries"]
        if sampled >= 20:
            break
    assert sampled > 0
    assert report["auto_queries"] == 1000 * (attempt + 1)
    assert 0.8 <= report["estimate"] <= 1.0
    assert 1 <= report["lists_scanned_per_query"] <= idx.describe()["n_lists"] * 2
    assert set(report["probe_scale"]) == {"unfiltered", "broad_filter", "selective_filter"}
