"""Concurrent clients on one index: every acknowledged write is visible to its writer at once
(get and filtered search), the final state equals the model of acknowledged operations, and
nothing answers 5xx."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from tests.integration.conftest import API_KEY
from tests.integration.support import parse, value

THREADS = 8
SECONDS = 4.0
DIM = 8
MAX_IDS_PER_THREAD = 200  # stays under the auto-training threshold (2,000)


def same_vector(got: Any, want: list[float]) -> bool:
    """float32 equality (the service answers float32 values in their shortest float32 form)."""
    return got is not None and np.array_equal(
        np.asarray(got, np.float32), np.asarray(want, np.float32)
    )


class Worker(threading.Thread):
    def __init__(self, url: str, name: str, key: str, t: int) -> None:
        super().__init__(daemon=True)
        self.url, self.index_name, self.key, self.t = url, name, key, t
        self.model: dict[str, tuple[list[float], int]] = {}  # id -> (vector, version)
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.ops: Counter[str] = Counter()
        self.stop_at = 0.0

    def post(self, c: httpx.Client, route: str, **fields: Any) -> dict[str, Any] | None:
        r = c.post(
            f"/v1/{route}", json={"index_name": self.index_name, "index_key": self.key, **fields}
        )
        self.statuses[r.status_code] += 1
        if r.status_code != 200:
            self.failures.append(f"{route}: {r.status_code} {r.text[:200]}")
            return None
        return r.json()

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            self.failures.append(what)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # surfaced by the test
            self.failures.append(f"exception: {exc!r}")

    def _run(self) -> None:
        rng = np.random.default_rng(1000 + self.t)
        api_key = API_KEY if self.t % 2 else "second-key"
        serial = 0
        with httpx.Client(base_url=self.url, headers={"X-API-Key": api_key}, timeout=120) as c:
            while time.monotonic() < self.stop_at and not self.failures:
                roll = rng.random()
                if roll < 0.5 or not self.model:
                    self.upsert(c, rng, serial)
                    serial += 4
                elif roll < 0.7:
                    self.delete(c, rng)
                else:
                    self.query(c, rng)

    def upsert(self, c: httpx.Client, rng: np.random.Generator, serial: int) -> None:
        self.ops["upsert"] += 1
        existing = list(self.model)
        ids: list[str] = []
        for j in range(int(rng.integers(1, 5))):
            if existing and (len(self.model) >= MAX_IDS_PER_THREAD or rng.random() < 0.3):
                ids.append(existing[int(rng.integers(len(existing)))])
            else:
                ids.append(f"t{self.t}-{serial + j}")
        ids = list(dict.fromkeys(ids))
        vectors = (rng.normal(size=(len(ids), DIM)) * 10).astype(np.float32)
        items = []
        for i, v in zip(ids, vectors):
            version = self.model.get(i, (None, 0))[1] + 1
            items.append(
                {
                    "id": i,
                    "vector": v.tolist(),
                    "metadata": {"t": self.t, "v": version},
                    "contents": f"{i}@{version}",
                }
            )
        body = self.post(c, "vectors/upsert", items=items)
        if body is None:
            return
        self.check(body["upserted_count"] == len(items), f"upserted_count {body}")
        for it in items:
            self.model[it["id"]] = (it["vector"], it["metadata"]["v"])
        # Read your writes: get returns exactly what was acknowledged.
        got = self.post(c, "vectors/get", ids=ids)
        if got is None:
            return
        self.check([g["id"] for g in got["results"]] == ids, f"get after upsert: {got} vs {ids}")
        for g, it in zip(got["results"], items):
            self.check(g.get("metadata") == it["metadata"], f"stale metadata {g} vs {it}")
            self.check(g.get("contents") == it["contents"], f"stale contents {g} vs {it}")
            self.check(same_vector(g.get("vector"), it["vector"]), f"stale vector for {it['id']}")
        # ...and search finds the new vector at distance 0.
        res = self.post(
            c, "vectors/query", query_vectors=items[0]["vector"], top_k=1, filters={"t": self.t}
        )
        if res is not None:
            top = res["results"]
            self.check(
                len(top) == 1 and top[0]["id"] == items[0]["id"] and top[0]["distance"] < 1e-3,
                f"search after upsert of {items[0]['id']}: {top}",
            )

    def delete(self, c: httpx.Client, rng: np.random.Generator) -> None:
        self.ops["delete"] += 1
        existing = list(self.model)
        ids = list(dict.fromkeys(existing[int(rng.integers(len(existing)))] for _ in range(2)))
        body = self.post(c, "vectors/delete", ids=[*ids, f"t{self.t}-never"])
        if body is None:
            return
        self.check(body["deleted_count"] == len(ids), f"deleted_count {body} for {ids}")
        for i in ids:
            del self.model[i]
        got = self.post(c, "vectors/get", ids=ids)
        if got is not None:
            self.check(got["results"] == [], f"deleted ids still readable: {got}")

    def query(self, c: httpx.Client, rng: np.random.Generator) -> None:
        self.ops["query"] += 1
        q = (rng.normal(size=DIM) * 10).astype(np.float32)
        body = self.post(
            c,
            "vectors/query",
            query_vectors=q.tolist(),
            top_k=10,
            filters={"t": self.t},
            include=["distance", "metadata"],
        )
        if body is None:
            return
        # Only this thread writes these ids, so the answer must be the exact top-10 of its model.
        ids = list(self.model)
        vecs = np.asarray([self.model[i][0] for i in ids], dtype=np.float64)
        d = np.sqrt(((vecs - q.astype(np.float64)) ** 2).sum(1))
        want = [ids[j] for j in np.argsort(d, kind="stable")[:10]]
        got = [r["id"] for r in body["results"]]
        self.check(got == want, f"query: {got} vs model {want}")
        for r in body["results"]:
            self.check(
                r["metadata"] == {"t": self.t, "v": self.model[r["id"]][1]},
                f"stale metadata in query {r}",
            )


def test_concurrent_writers_readers_and_queries(service, make_index):
    idx = make_index(dimension=DIM)
    workers = [Worker(service.url, idx.name, idx.key, t) for t in range(THREADS)]
    stop_at = time.monotonic() + SECONDS
    for w in workers:
        w.stop_at = stop_at
        w.start()
    for w in workers:
        w.join(timeout=SECONDS + 120)
        assert not w.is_alive(), "a client thread hung"

    statuses = sum((w.statuses for w in workers), Counter())
    failures = [f for w in workers for f in w.failures]
    assert not any(s >= 500 for s in statuses), statuses
    assert failures == [], failures[:10]
    ops = sum((w.ops for w in workers), Counter())
    assert ops["upsert"] >= THREADS and ops["delete"] > 0 and ops["query"] > 0, ops

    model: dict[str, tuple[list[float], int]] = {}
    for w in workers:
        model.update(w.model)
    assert idx.count() == len(model)
    assert sorted(idx.list_ids()) == sorted(model)
    got = idx.get(sorted(model))
    assert [g["id"] for g in got] == sorted(model)
    for g in got:
        vector, version = model[g["id"]]
        assert same_vector(g["vector"], vector), g["id"]
        assert g["metadata"]["v"] == version and g["contents"] == f"{g['id']}@{version}"


def shard_search_calls(http: httpx.Client) -> float:
    return value(parse(http.get("/v1/metrics").text), "vaultvec_shard_search_seconds_count")


def test_concurrent_single_queries_share_shard_calls_and_answer_as_alone(
    service: Any, http: httpx.Client, make_index: Any
) -> None:
    """Single queries in flight together on one index are searched in batches (one shard call
    for several), and each gets exactly the answer it gets alone, its own filter included (a
    filter on true and one on 1 match different items, though Python holds True == 1)."""
    idx = make_index(dimension=DIM)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, DIM)).astype(np.float32)
    meta = [{"i": i, "flag": True if i % 2 else 1} for i in range(len(x))]
    idx.upsert_arrays([f"c{i}" for i in range(len(x))], x, meta)
    queries = x[:96] + 0.01
    filters: list[dict[str, Any] | None] = [None, {"flag": True}, {"flag": 1}]

    def fields(j: int) -> dict[str, Any]:
        return {"query_vectors": queries[j].tolist(), "top_k": 5, "filters": filters[j % 3]}

    alone = [idx.query(**fields(j)) for j in range(len(queries))]
    for j in (1, 2):  # the filters tell the items apart
        assert {r["metadata"]["i"] % 2 for r in alone[j]} == {2 - j}

    local = threading.local()

    def ask(j: int) -> Any:
        if not hasattr(local, "client"):
            local.client = httpx.Client(
                base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=120
            )
        r = local.client.post("/v1/vectors/query", json=idx.body(**fields(j)))
        assert r.status_code == 200, r.text[:300]
        return r.json()["results"]

    before = shard_search_calls(http)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(len(queries))))
    calls = shard_search_calls(http) - before
    assert together == alone
    assert calls < len(queries), f"{calls:.0f} shard calls for {len(queries)} concurrent queries"
