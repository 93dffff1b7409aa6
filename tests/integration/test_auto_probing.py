"""Automatic probing through the real service: describe reports the live recall estimate the
gateway measures on the automatically probed queries (every one of an index's first 400, then
1% by default), explicit n_probes queries are neither counted nor sampled, and a restart keeps
what was learned."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import numpy as np

from cluster.client import Client, generate_key
from tests.integration import served


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
    for attempt in range(20):  # the index's first queries: many of each request measured
        idx.query(query_vectors=q, top_k=10, filters={"half": 0} if attempt % 2 else None)
        time.sleep(0.2)
        report = idx.describe()["recall"]
        sampled = report["sampled_queries"]
        # the first request's rows fitted its scale and are not in the estimate: it comes
        # from the queries measured after they were answered
        if sampled >= 20 and report["estimate"] is not None:
            break
    assert sampled > 0
    assert report["auto_queries"] == 1000 * (attempt + 1)
    assert 0.8 <= report["estimate"] <= 1.0
    assert 1 <= report["lists_scanned_per_query"] <= idx.describe()["n_lists"] * 2
    assert set(report["probe_scale"]) == {"unfiltered", "broad_filter", "selective_filter"}


def test_a_restart_keeps_what_automatic_probing_learned(tmp_path: Path) -> None:
    api_key, key = secrets.token_hex(16), generate_key()
    env = {"VAULTVEC_API_KEY": api_key}
    data, q = blobs(4000, 16, seed=3), blobs(600, 16, seed=4)
    with served.serve(tmp_path / "store", env=env) as srv, Client(srv.url, api_key) as vv:
        idx = vv.create_index("learned", key, dimension=16)
        idx.upsert([f"a{j}" for j in range(len(data))], data)
        idx.train()
        for _ in range(40):  # the first 400 queries are measured, then handed over to keep
            idx.query(q[:100], top_k=10)
            time.sleep(0.3)
            learned = idx.describe()["recall"]
            if learned["sampled_queries"] >= 400:
                break
        assert learned["sampled_queries"] >= 400
        time.sleep(2)  # the control plane writes it (the call is not awaited)
    with served.serve(tmp_path / "store", env=env) as srv, Client(srv.url, api_key) as vv:
        after = vv.index("learned", key).describe()["recall"]
    for field in ("estimate", "sampled_queries", "probe_scale", "auto_queries"):
        assert after[field] == learned[field], field
