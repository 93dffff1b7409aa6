"""Continuous mixed load against a vaultvec index, with every answer checked.

Writers upsert new items (acknowledged ids are recorded); readers query the exact vector of an
item known to be present and fetch items by id. An answer is *wrong or partial* when the item
is not the top hit at distance ~0, when fewer than ``top_k`` results come back although the
index holds more, or when a fetched acknowledged item is missing or altered. Anything other
than 200 is a *failed* request (with its status kept). After the load stops, :meth:`lost`
fetches every acknowledged item.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

DIM = 16
TOP_K = 10


def vector_of(item_id: str) -> list[float]:
    """The item's vector, derived from its id (so any reader can check what it gets back)."""
    seed = int.from_bytes(hashlib.blake2b(item_id.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    return [float(v) for v in rng.normal(size=DIM).astype(np.float32)]


@dataclass
class Outcome:
    t: float  # seconds since the load started
    ok: bool
    status: int  # HTTP status, 0 for a transport error
    kind: str


@dataclass
class Summary:
    requests: int
    failed: int
    wrong_or_partial: int
    writes_acked: int
    statuses: dict[int, int]
    last_failure_s: float | None  # since the load started
    problems: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)  # what each 5xx answer said


class MixedLoad:
    def __init__(
        self,
        url: str,
        api_key: str,
        index_name: str,
        index_key: str,
        seed_ids: list[str],
        *,
        writers: int = 2,
        readers: int = 3,
        timeout_s: float = 120.0,
    ) -> None:
        self.url, self.api_key = url, api_key
        self.name, self.key = index_name, index_key
        self.acked: list[str] = list(seed_ids)  # readers pick from here
        self.new_acked: list[str] = []
        self.outcomes: list[Outcome] = []
        self.problems: list[str] = []
        self.server_errors: list[str] = []
        self.writers, self.readers, self.timeout_s = writers, readers, timeout_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0

    # -- running ----------------------------------------------------------------------------
    def __enter__(self) -> MixedLoad:
        self._t0 = time.monotonic()
        for w in range(self.writers):
            self._spawn(self._writer, w)
        for r in range(self.readers):
            self._spawn(self._reader, r)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _spawn(self, target: Any, n: int) -> None:
        t = threading.Thread(target=target, args=(n,), daemon=True)
        t.start()
        self._threads.append(t)

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"X-API-Key": self.api_key}, timeout=self.timeout_s
        )

    def _post(self, client: httpx.Client, route: str, kind: str, **body: Any) -> Any:
        body.update(index_name=self.name, index_key=self.key)
        try:
            r = client.post(route, json=body)
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        ok = status == 200
        with self._lock:
            self.outcomes.append(Outcome(self.now(), ok, status, kind))
            if status >= 500:
                self.server_errors.append(f"{self.now():.2f}s {kind} {status}: {r.text[:300]}")
        return r.json() if ok else None

    def _problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(f"{self.now():.2f}s {text}")

    def _writer(self, w: int) -> None:
        with self._client() as client:
            i = 0
            while not self._stop.is_set():
                ids = [f"w{w}-{i}-{j}" for j in range(4)]
                items = [{"id": x, "vector": vector_of(x), "metadata": {"w": w}} for x in ids]
                if self._post(client, "/v1/vectors/upsert", "upsert", items=items) is not None:
                    with self._lock:
                        self.acked.extend(ids)
                        self.new_acked.extend(ids)
                i += 1
                time.sleep(0.02)

    def _reader(self, r: int) -> None:
        rng = random.Random(r)
        with self._client() as client:
            while not self._stop.is_set():
                with self._lock:
                    target = rng.choice(self.acked)
                if rng.random() < 0.7:
                    self._check_query(client, target)
                else:
                    with self._lock:
                        ids = rng.sample(self.acked, 5)
                    self._check_get(client, ids)
                time.sleep(0.01)

    def _check_query(self, client: httpx.Client, target: str) -> None:
        body = self._post(
            client, "/v1/vectors/query", "query", query_vectors=vector_of(target), top_k=TOP_K
        )
        if body is None:
            return
        results = body["results"]
        if len(results) != TOP_K:
            self._problem(f"query for {target}: {len(results)} results, expected {TOP_K}")
        elif results[0]["id"] != target or results[0]["distance"] > 1e-3:
            self._problem(f"query for {target}: top hit {results[0]}")

    def _check_get(self, client: httpx.Client, ids: list[str]) -> None:
        body = self._post(client, "/v1/vectors/get", "get", ids=ids, include=["vector"])
        if body is None:
            return
        got = {e["id"]: e["vector"] for e in body["results"]}
        for x in ids:
            if x not in got:
                self._problem(f"get: acknowledged item {x} missing")
            elif not np.allclose(got[x], vector_of(x), atol=1e-6):
                self._problem(f"get: item {x} has another vector")

    # -- results ----------------------------------------------------------------------------
    def summary(self) -> Summary:
        with self._lock:
            outcomes, problems = list(self.outcomes), list(self.problems)
            server_errors = list(self.server_errors)
        failures = [o for o in outcomes if not o.ok]
        return Summary(
            requests=len(outcomes),
            failed=len(failures),
            wrong_or_partial=len(problems),
            writes_acked=len(self.new_acked),
            statuses=dict(Counter(o.status for o in outcomes)),
            last_failure_s=max((o.t for o in failures), default=None),
            problems=problems,
            server_errors=server_errors,
        )

    def lost(self, client: httpx.Client) -> list[str]:
        """Acknowledged items (seeded or written under load) that are missing or altered."""
        missing: list[str] = []
        ids = list(self.acked)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            r = client.post(
                "/v1/vectors/get",
                json={
                    "index_name": self.name,
                    "index_key": self.key,
                    "ids": chunk,
                    "include": ["vector"],
                },
            )
            assert r.status_code == 200, r.text
            got = {e["id"]: e["vector"] for e in r.json()["results"]}
            missing += [
                x for x in chunk if x not in got or not np.allclose(got[x], vector_of(x), atol=1e-6)
            ]
        return missing
