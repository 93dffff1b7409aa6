"""Helpers shared by the HTTP integration tests: response checks, an index handle, oracles."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import httpx
import numpy as np

from tests.conftest import random_key

ERROR_KEYS = {"status_code", "detail", "errors"}


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
    **config: Any,
) -> Index:
    idx = Index(client, name or unique_name(), key or random_key())
    body: dict[str, Any] = idx.body()
    cfg = {"type": index_type, **config}
    if dimension is not None:
        cfg["dimension"] = dimension
    body["index_config"] = cfg
    if metric is not None:
        body["metric"] = metric
    created = ok(client.post("/v1/indexes/create", json=body))
    assert set(created) == {"status", "message"} and created["status"] == "success", created
    return idx


# -- brute force ---------------------------------------------------------------------------
def brute_force(
    data: np.ndarray, queries: np.ndarray, k: int, metric: str = "euclidean"
) -> tuple[np.ndarray, np.ndarray]:
    """Exact (distances, row numbers) in float64, ascending, with the API's metric definitions."""
    x = data.astype(np.float64)
    q = np.atleast_2d(queries).astype(np.float64)
    if metric == "cosine":
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        d = 1.0 - qn @ xn.T
    else:
        d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
        if metric == "euclidean":
            d = np.sqrt(d)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), order


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


# -- filter oracle -------------------------------------------------------------------------
# A plain per-document interpreter of the documented filter language (DESIGN §4): equality on
# scalars, comparison operators, $in/$nin, $exists, $and/$or, dot paths into nested objects, a
# list value matches when any element matches, null matches a missing path or a null value.
_MISSING = object()


def _resolve(doc: Any, path: str) -> Any:
    cur = doc
    for seg in path.split("."):
        if not isinstance(cur, dict) or seg not in cur:
            return _MISSING
        cur = cur[seg]
    return cur


def _kind(v: Any) -> str | None:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num" if not (isinstance(v, float) and math.isnan(v)) else None
    if isinstance(v, str):
        return "str"
    return None


def _leaves(value: Any) -> list[Any]:
    if value is _MISSING:
        return []
    if isinstance(value, list):
        return [e for e in value if not isinstance(e, (list, dict))]
    return [value]


def _eq(value: Any, operand: Any) -> bool:
    if operand is None:
        return value is _MISSING or any(v is None for v in _leaves(value))
    return any(_kind(v) == _kind(operand) and v == operand for v in _leaves(value))


def _cmp(value: Any, op: str, operand: Any) -> bool:
    for v in _leaves(value):
        if _kind(v) not in ("num", "str") or _kind(v) != _kind(operand):
            continue
        if (
            (op == "$gt" and v > operand)
            or (op == "$gte" and v >= operand)
            or (op == "$lt" and v < operand)
            or (op == "$lte" and v <= operand)
        ):
            return True
    return False


def matches(doc: dict[str, Any] | None, flt: dict[str, Any]) -> bool:
    doc = doc or {}
    for key, val in flt.items():
        if key == "$and":
            good = all(matches(doc, f) for f in val)
        elif key == "$or":
            good = any(matches(doc, f) for f in val)
        elif isinstance(val, dict):
            value = _resolve(doc, key)
            good = True
            for op, operand in val.items():
                if op == "$eq":
                    good &= _eq(value, operand)
                elif op == "$ne":
                    good &= not _eq(value, operand)
                elif op == "$in":
                    good &= any(_eq(value, o) for o in operand)
                elif op == "$nin":
                    good &= not any(_eq(value, o) for o in operand)
                elif op == "$exists":
                    good &= (value is not _MISSING) == operand
                else:
                    good &= _cmp(value, op, operand)
        else:
            good = _eq(_resolve(doc, key), val)
        if not good:
            return False
    return True
