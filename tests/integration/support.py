"""Helpers shared by the HTTP integration tests: response checks, an index handle, oracles."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from cluster.client import generate_key
from tests.integration import served

ERROR_KEYS = {"status_code", "detail", "errors"}
Samples = dict[str, list[tuple[dict[str, str], float]]]  # Prometheus text: name -> samples


def unique_name(prefix: str = "it") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def ok(r: httpx.Response) -> Any:
    """Assert a 200 JSON answer and return its body."""
    assert r.status_code == 200, (
        f"{r.request.method} {r.request.url.path} -> {r.status_code}: {r.text[:500]}"
    )
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    """Assert an error answer with the documented body ``{"status_code", "detail"[, "errors"]}``."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert isinstance(body, dict)
    assert {"status_code", "detail"} <= set(body) <= ERROR_KEYS, body
    assert body["status_code"] == status
    assert isinstance(body["detail"], str) and body["detail"].strip()
    if "errors" in body:
        assert status == 422 and isinstance(body["errors"], list)
    return body


def assert_secret_free(r: httpx.Response, *secrets: str) -> None:
    text = r.text
    for s in secrets:
        assert s not in text, f"response leaks {s[:20]}...: {text[:300]}"
        assert s.lower() not in text.lower(), f"response leaks {s[:20]}...: {text[:300]}"


@dataclass
class Index:
    """A created index: name, key and convenience wrappers around the /v1 routes."""

    client: httpx.Client
    name: str
    key: str

    def body(self, **fields: Any) -> dict[str, Any]:
        return {"index_name": self.name, "index_key": self.key, **fields}

    def post(self, route: str, **fields: Any) -> httpx.Response:
        return self.client.post(f"/v1/{route}", json=self.body(**fields))

    def upsert(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        body = ok(self.post("vectors/upsert", items=items))
        assert body["upserted_count"] == len(items)
        return body

    def upsert_arrays(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        contents: Sequence[str | None] | None = None,
        batch: int = 1000,
    ) -> None:
        for start in range(0, len(ids), batch):
            items = []
            for j in range(start, min(start + batch, len(ids))):
                item: dict[str, Any] = {"id": ids[j], "vector": vectors[j].tolist()}
                if metadata is not None and metadata[j] is not None:
                    item["metadata"] = metadata[j]
                if contents is not None and contents[j] is not None:
                    item["contents"] = contents[j]
                items.append(item)
            self.upsert(items)

    def query(self, **fields: Any) -> Any:
        if isinstance(fields.get("query_vectors"), np.ndarray):
            fields["query_vectors"] = fields["query_vectors"].tolist()
        return ok(self.post("vectors/query", **fields))["results"]

    def get(self, ids: list[str], include: list[str] | None = None) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"ids": ids}
        if include is not None:
            fields["include"] = include
        return ok(self.post("vectors/get", **fields))["results"]

    def delete_ids(self, ids: list[str]) -> int:
        return ok(self.post("vectors/delete", ids=ids))["deleted_count"]

    def describe(self) -> dict[str, Any]:
        return ok(self.post("indexes/describe"))

    def count(self) -> int:
        return ok(self.post("vectors/num_vectors"))["result"]

    def list_ids(self) -> list[str]:
        body = ok(self.post("vectors/list_ids"))
        assert body["count"] == len(body["ids"])
        return body["ids"]

    def train(self, **params: Any) -> dict[str, Any]:
        return ok(self.post("indexes/train", **params))

    def drop(self) -> None:
        r = self.post("indexes/delete")
        assert r.status_code in (200, 404), r.text


def create_index(
    client: httpx.Client,
    *,
    name: str | None = None,
    key: str | None = None,
    index_type: str | None = "ivfflat",
    dimension: int | None = None,
    metric: str | None = None,
    n_shards: int | None = None,
    **config: Any,
) -> Index:
    idx = Index(client, name or unique_name(), key or generate_key())
    body: dict[str, Any] = idx.body()
    if n_shards is not None:
        body["n_shards"] = n_shards
    cfg = {"type": index_type, **config}
    if dimension is not None:
        cfg["dimension"] = dimension
    body["index_config"] = cfg
    if metric is not None:
        body["metric"] = metric
    created = ok(client.post("/v1/indexes/create", json=body))
    assert set(created) == {"status", "message"} and created["status"] == "success", created
    return idx


def assert_neighbours(
    results: Sequence[dict[str, Any]],
    data: np.ndarray,
    ids: Sequence[str],
    query: np.ndarray,
    exact: np.ndarray,
) -> None:
    """The results are the exact nearest neighbours, in order, up to near-ties.

    ``exact`` holds the brute-force euclidean distances (ascending). Items whose true distances
    differ by less than float32 rounding may come in either order or trade places at the k-th
    position, so each returned item's true distance is compared with the exact ranking instead
    of its id.
    """
    row_of = {item_id: j for j, item_id in enumerate(ids)}
    rows = [row_of[r["id"]] for r in results]
    true = np.sqrt(((data[rows].astype(np.float64) - query.astype(np.float64)) ** 2).sum(-1))
    assert len(rows) == len(exact) == len(set(rows))
    np.testing.assert_allclose(true, exact, rtol=1e-5, atol=1e-5)


def ids_of(results: Iterable[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in results]


def assert_ascending(results: Sequence[dict[str, Any]]) -> None:
    d = [r["distance"] for r in results]
    assert all(a <= b for a, b in pairwise(d)), d


def parse(text: str) -> Samples:
    """``GET /v1/metrics``'s text by sample name."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert found, f"no {name} with {labels}: {samples.get(name)}"
    return sum(found)


def cli(url: str, api_key: str, index_key: str, *args: str) -> str:
    """`vaultvec <args> --no-progress` against ``url``, keys in the environment as a user
    would set them; its stderr (the summary)."""
    env = served.clean_env(VAULTVEC_API_KEY=api_key, VAULTVEC_INDEX_KEY=index_key, VAULTVEC_URL=url)
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr
