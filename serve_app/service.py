"""Request semantics shared by every transport (JSON routes, base64 matrix routes, the Ray transport, text queries).

Routes decode their wire format into numpy arrays and plain lists, then call these; the
validation rules, defaults and error messages live here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from actors.errors import InvalidRequest
from actors.strings import StringBlock
from actors.types import UpsertBatch
from serve_app.engine import CachedView, Engine, Hits
from serve_app.results import results_json, shape_results
from serve_app.vectors import check_dimension, to_index_space

DEFAULT_TOP_K = 100
DEFAULT_QUERY_INCLUDE = ("distance", "metadata")


@dataclass(frozen=True)
class Fields:
    """What a query answer or a get carries beside each id (distance: always, on a query)."""

    metadata: bool
    vector: bool
    contents: bool

    @classmethod
    def of(cls, include: Sequence[str], cfg: Any) -> Fields:
        """``vector`` is dropped on ivf/ivfpq indexes: they keep no original vectors."""
        inc = set(include)
        return cls(
            "metadata" in inc, "vector" in inc and cfg.index_type == "ivfflat", "contents" in inc
        )


def get_fields(include: Sequence[str] | None, cfg: Any) -> Fields:
    """A get's fields; omitted = every field the index keeps."""
    return Fields.of(("vector", "contents", "metadata") if include is None else include, cfg)


def distinct(ids: Sequence[str]) -> list[str]:
    """``ids`` with repeats dropped, first occurrence kept (a get answers each id once)."""
    return list(dict.fromkeys(ids))


def unique_ids(ids: Sequence[str], field: str = "ids") -> None:
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise InvalidRequest(f"{field} contains the id {dup!r} more than once")
    if any(not i for i in ids):
        raise InvalidRequest(f"{field} contains an empty id")


def resolve_top_k(top_k: int | None, max_top_k: int) -> int:
    k = DEFAULT_TOP_K if top_k is None else top_k
    if not 1 <= k <= max_top_k:
        raise InvalidRequest(f"top_k must be between 1 and {max_top_k}")
    return k


async def upsert(
    engine: Engine,
    cv: CachedView,
    ids: list[str],
    x: np.ndarray,
    metadata: Sequence[bytes | None],
    contents: Sequence[str | None],
    field: str = "items vectors",
) -> int:
    """Store ``ids`` with vectors ``x`` (n, d); returns the number upserted."""
    unique_ids(ids, "items ids")
    cfg = cv.config
    if cfg.dimension is None:  # the first upsert fixes the dimension
        if cfg.index_type == "ivfpq" and cfg.pq_dim and x.shape[1] % cfg.pq_dim:
            raise InvalidRequest(f"pq_dim {cfg.pq_dim} must divide the dimension {x.shape[1]}")
        await engine.call(engine.control.set_dimension.remote(cfg.name, cv.key, x.shape[1]))
        cv = await engine.reload(cv)
        cfg = cv.config
    check_dimension(x, cfg.dimension, field)
    x, norms = to_index_space(x, cfg.metric, field)

    def batch(rows: np.ndarray) -> UpsertBatch:
        r = rows.tolist()
        return UpsertBatch(
            ids=tuple(ids[i] for i in r),
            vectors=x[rows],
            norms=None if norms is None else norms[rows],
            metadata=tuple(metadata[i] for i in r),
            contents=tuple(contents[i] for i in r),
        )

    total = await engine.upsert_batches(cv, ids, batch)
    if total < 0:
        total, _ = await engine.count(cv)
    engine.control.maybe_autotrain.remote(cfg.name, cv.key, total)
    return len(ids)


async def search(
    engine: Engine,
    cv: CachedView,
    x: np.ndarray,
    top_k: int,
    n_probes: int | None,
    filters: dict[str, Any] | None,
    greedy: bool | None,
    with_metadata: bool,
    field: str = "query_vectors",
) -> Hits:
    """Top-k for query matrix ``x`` (nq, d), ascending distance, in index space."""
    cfg = cv.config
    if cfg.dimension is None:  # nothing was ever stored
        shape = (len(x), top_k)
        dist = np.full(shape, np.inf, dtype=np.float32)
        meta = np.empty(shape, dtype=object) if with_metadata else None
        return Hits(dist, StringBlock.empty(shape), meta, np.zeros(len(x), dtype=np.int64))
    check_dimension(x, cfg.dimension, field)
    x, _ = to_index_space(x, cfg.metric, field)
    return await engine.search(cv, x, top_k, n_probes or 0, filters, bool(greedy), with_metadata)


async def query_json(
    engine: Engine,
    cv: CachedView,
    x: np.ndarray,
    single: bool,
    top_k: int,
    n_probes: int | None,
    filters: dict[str, Any] | None,
    greedy: bool | None,
    include: Sequence[str] | None,
) -> bytes:
    """The JSON answer ``{"results": ...}`` of a query (one list, or one per row of ``x``).

    Every entry has its distance (CyborgDB's clients rely on it whatever ``include`` says);
    ``vector`` and ``contents``, when asked for, are fetched for the results by id."""
    fields = Fields.of(DEFAULT_QUERY_INCLUDE if include is None else include, cv.config)
    hits = await search(engine, cv, x, top_k, n_probes, filters, greedy, fields.metadata)
    metric = cv.config.metric
    if not (fields.vector or fields.contents):
        return results_json(hits, metric, True, fields.metadata, single)
    results = shape_results(hits, metric, True, fields.metadata)
    ids = distinct([e["id"] for row in results for e in row])
    found = await engine.fetch(cv, ids, fields.vector, False, fields.contents) if ids else {}
    for row in results:
        for entry in row:
            item = found.get(entry["id"], {})
            for name in ("vector", "contents"):
                if name in item:
                    entry[name] = item[name]
    body = {"results": results[0] if single else results}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
