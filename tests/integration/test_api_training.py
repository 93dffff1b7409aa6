"""Training: explicit /train with parameters, auto-training past the threshold while reads and
writes continue, and exact answers from a trained index when every list is probed."""

from __future__ import annotations

import threading
import time
import warnings
from itertools import pairwise
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers import clustered, exact_knn
from tests.integration.conftest import API_KEY, AUTO_TRAIN_THRESHOLD
from tests.integration.support import assert_neighbours, error, ids_of, ok


def assert_exact(idx, data, ids, queries, k, n_probes, **query_args):
    results = idx.query(query_vectors=queries, top_k=k, n_probes=n_probes, **query_args)
    dist, _ = exact_knn(data, queries, k)
    for q, res in enumerate(results):
        assert_neighbours(res, data, ids, queries[q], dist[q])
        np.testing.assert_allclose([r["distance"] for r in res], dist[q], rtol=1e-4, atol=1e-4)


def test_train_with_parameters_then_retrain_with_defaults(make_index, http):
    data = clustered(600, 16, n_clusters=12, seed=21)
    queries = clustered(10, 16, n_clusters=12, seed=22)
    ids = [f"p{j}" for j in range(len(data))]
    idx = make_index(dimension=16)
    idx.upsert_arrays(ids, data)

    params = {
        "n_lists": 8,
        "batch_size": 100,
        "max_iters": 5,
        "tolerance": 1e-4,
        "max_memory": 1 << 20,
    }
    body = idx.train(**params)
    assert set(body) == {"status", "message"} and body["status"] == "success"
    desc = idx.describe()
    assert desc["is_trained"] is True
    assert desc["index_config"]["n_lists"] == 8
    assert desc["num_vectors"] == 600
    assert idx.name not in ok(http.get("/v1/indexes/training-status"))["training_indexes"]
    assert_exact(idx, data, ids, queries, 10, n_probes=8)
    # Greedy probing from a single list stops only when no unprobed list can hold a closer
    # point: the exact answer too.
    assert_exact(idx, data, ids, queries, 10, n_probes=1, greedy=True)
    # Every item is still there and readable after the swap.
    assert sorted(idx.list_ids()) == sorted(ids)
    got = idx.get(ids[:50], include=["vector"])
    np.testing.assert_array_equal(np.asarray([g["vector"] for g in got], np.float32), data[:50])

    # Retraining with explicit nulls: automatic n_lists.
    nulls = dict.fromkeys(params)
    assert idx.train(**nulls)["status"] == "success"
    desc = idx.describe()
    n_lists = desc["index_config"]["n_lists"]
    assert desc["is_trained"] is True and 1 <= n_lists <= 600
    assert_exact(idx, data, ids, queries, 10, n_probes=n_lists)
    # Upserts and deletes after training land in the right lists.
    extra = clustered(30, 16, n_clusters=12, seed=23)
    idx.upsert_arrays([f"x{j}" for j in range(30)], extra)
    assert idx.delete_ids(ids[:30]) == 30
    all_ids = ids[30:] + [f"x{j}" for j in range(30)]
    all_data = np.concatenate([data[30:], extra])
    assert_exact(idx, all_data, all_ids, queries, 10, n_probes=n_lists)


def test_train_accepts_zero_as_automatic(make_index):
    idx = make_index(dimension=4)
    idx.upsert_arrays(
        [f"z{j}" for j in range(100)],
        np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32),
    )
    body = idx.train(n_lists=0, batch_size=0, max_iters=0, tolerance=1e-6, max_memory=0)
    assert body["status"] == "success"
    assert idx.describe()["is_trained"] is True


def test_train_errors(make_index):
    idx = make_index(dimension=4)
    error(idx.post("indexes/train"), 422)  # empty index
    idx.upsert_arrays(
        [f"e{j}" for j in range(10)],
        np.eye(4, dtype=np.float32)[np.arange(10) % 4] * np.arange(1, 11)[:, None],
    )
    error(idx.post("indexes/train", n_lists=11), 422)  # more lists than items
    error(idx.post("indexes/train", n_lists=-3), 422)
    error(idx.post("indexes/train", tolerance=-1.0), 422)
    assert idx.describe()["is_trained"] is False
    assert len(idx.query(query_vectors=[1.0, 0.0, 0.0, 0.0], top_k=100)) == 10


class Load(threading.Thread):
    """Upserts new items (rows start..stop) in small batches and checks each batch right away
    with get and search."""

    def __init__(
        self, url: str, name: str, key: str, data: np.ndarray, start: int, stop: int
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.name_, self.key, self.data = url, name, key, data
        self.rows = list(range(start, stop))
        self.acked: list[int] = []
        self.failures: list[str] = []
        self.ack_times: list[float] = []
        self.query_times: list[float] = []

    def post(self, c: httpx.Client, route: str, **fields: Any) -> Any:
        r = c.post(f"/v1/{route}", json={"index_name": self.name_, "index_key": self.key, **fields})
        if r.status_code != 200:
            self.failures.append(f"{route}: {r.status_code} {r.text[:200]}")
            return None
        return r.json()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"X-API-Key": API_KEY}, timeout=120) as c:
            for start in range(0, len(self.rows), 20):
                if self.failures:
                    return
                rows = self.rows[start : start + 20]
                items = [
                    {"id": f"a{j}", "vector": self.data[j].tolist(), "metadata": {"j": j}}
                    for j in rows
                ]
                if self.post(c, "vectors/upsert", items=items) is None:
                    return
                self.acked.extend(rows)
                self.ack_times.append(time.monotonic())
                got = self.post(c, "vectors/get", ids=[f"a{j}" for j in rows], include=["metadata"])
                if got is not None and [g["id"] for g in got["results"]] != [f"a{j}" for j in rows]:
                    self.failures.append(f"get after upsert lost items: {got['results'][:3]}")
                # Search for an early item (written before the load) and for the newest one.
                for j in (start % 1000, rows[-1]):
                    res = self.post(
                        c, "vectors/query", query_vectors=self.data[j].tolist(), top_k=1
                    )
                    self.query_times.append(time.monotonic())
                    if res is not None and (
                        not res["results"] or res["results"][0]["id"] != f"a{j}"
                    ):
                        self.failures.append(f"query for a{j}: {res['results']}")


def test_auto_training_while_writes_and_queries_continue(service, make_index, http):
    n_total, dim = 3000, 32
    data = clustered(n_total, dim, n_clusters=64, seed=31)
    ids = [f"a{j}" for j in range(n_total)]
    idx = make_index(dimension=dim)
    before = AUTO_TRAIN_THRESHOLD - 100
    idx.upsert_arrays(
        ids[:before], data[:before], metadata=[{"j": j} for j in range(before)], batch=950
    )
    assert idx.describe()["is_trained"] is False

    # Three writers: the threshold is crossed after a few batches, the rest overlap training.
    bounds = np.linspace(before, n_total, 4).astype(int)
    loads = [Load(service.url, idx.name, idx.key, data, a, b) for a, b in pairwise(bounds)]
    seen_training: list[float] = []
    for load in loads:
        load.start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and any(load.is_alive() for load in loads):
        if idx.name in ok(http.get("/v1/indexes/training-status"))["training_indexes"]:
            seen_training.append(time.monotonic())
        time.sleep(0.02)
    for load in loads:
        load.join(timeout=120)
    failures = [f for load in loads for f in load.failures]
    assert failures == [], failures[:5]
    assert sum(len(load.acked) for load in loads) == n_total - before

    # Auto-training ran while the writers were busy...
    assert seen_training, "training-status never listed the index while it trained"
    deadline = time.monotonic() + 120
    while idx.name in ok(http.get("/v1/indexes/training-status"))["training_indexes"]:
        assert time.monotonic() < deadline, "auto-training did not finish"
        time.sleep(0.1)
    # ...and writes and queries were acknowledged while it ran. On a loaded machine the
    # writers can finish before the background training gets going; the overlap itself is
    # pinned deterministically by tests/unit/test_shard.py::test_rebuild_keeps_writes_made_during_it.
    window = (seen_training[0], seen_training[-1])
    overlapped = any(window[0] <= t <= window[1] for load in loads for t in load.ack_times)
    if overlapped:
        assert any(window[0] <= t <= window[1] for load in loads for t in load.query_times), (
            "writes landed during training but no query did"
        )
    else:
        warnings.warn("auto-training did not overlap the writes on this run", stacklevel=1)

    desc = idx.describe()
    assert desc["is_trained"] is True and desc["num_vectors"] == n_total
    n_lists = desc["index_config"]["n_lists"]
    assert n_lists > 1
    assert sorted(idx.list_ids()) == sorted(ids)
    got = idx.get(ids, include=["vector", "metadata"])
    assert ids_of(got) == ids
    np.testing.assert_array_equal(np.asarray([g["vector"] for g in got], np.float32), data)
    assert all(g["metadata"] == {"j": j} for j, g in enumerate(got))

    queries = clustered(20, dim, n_clusters=64, seed=31) + 0.05
    assert_exact(idx, data, ids, queries, 10, n_probes=n_lists)
    # Automatic n_probes reaches a useful recall (target 0.95 on the calibration sample).
    auto = idx.query(query_vectors=queries, top_k=10)
    _, rows = exact_knn(data, queries, 10)
    recall = np.mean(
        [len(set(ids_of(res)) & {ids[j] for j in rows[q]}) / 10 for q, res in enumerate(auto)]
    )
    assert recall >= 0.85, recall


def test_first_query_after_auto_training_probes_all_lists_when_asked(make_index, http):
    dim = 16
    data = clustered(AUTO_TRAIN_THRESHOLD + 100, dim, n_clusters=40, seed=41)
    ids = [f"q{j}" for j in range(len(data))]
    idx = make_index(dimension=dim)
    idx.upsert_arrays(ids, data, batch=len(data))  # one request crosses the threshold
    # Wait for the background training without any index-scoped request.
    seen, deadline = False, time.monotonic() + 120
    while time.monotonic() < deadline:
        training = idx.name in ok(http.get("/v1/indexes/training-status"))["training_indexes"]
        if training:
            seen = True
        elif seen:
            break
        time.sleep(0.01)
    if not seen:
        pytest.skip("auto-training was not observed (finished before the first poll?)")
    # Midpoints between items of different clusters: their neighbours lie in several lists.
    rng = np.random.default_rng(42)
    queries = (data[rng.integers(0, len(data), 20)] + data[rng.integers(0, len(data), 20)]) / 2
    first = idx.query(query_vectors=queries, top_k=10, n_probes=100_000)
    assert idx.describe()["is_trained"] is True
    dist, _ = exact_knn(data, queries, 10)
    for q, res in enumerate(first):
        assert_neighbours(res, data, ids, queries[q], dist[q])
