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
from actors.filters import parse_filter
from actors.strings import StringBlock
from actors.types import UpsertBatch
from serve_app.engine import CachedView, Engine, Hits, Query
from serve_app.results import results_json, shape_results
from serve_app.vectors import check_dimension, check_norms, to_index_space

DEFAULT_TOP_K = 100
DEFAULT_QUERY_INCLUDE = ("distance", "metadata")


@dataclass(frozen=True)
class Limits:
    """The configured request limits (Settings.max_*); every transport checks the same."""

    ids: int = 100_000
    items: int = 100_000
    id_length: int = 1024
    metadata_bytes: int = 65_536
    metadata_depth: int = 32
    contents_bytes: int = 1 << 20

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """The limits of a replica's settings (built once per settings object)."""
        cached = _LIMITS.get(id(settings))
        if cached is not None and cached[0] is settings:
            return cached[1]
        limits = cls(
            ids=settings.max_ids_per_request,
            items=settings.max_items_per_upsert,
            id_length=settings.max_id_length,
            metadata_bytes=settings.max_metadata_bytes,
            metadata_depth=settings.max_metadata_depth,
            contents_bytes=settings.max_contents_bytes,
        )
        _LIMITS[id(settings)] = (settings, limits)
        return limits

    def check_ids(self, ids: Sequence[str], field: str = "ids") -> None:
        if len(ids) > self.ids:
            raise InvalidRequest(
                f"{field} holds {len(ids)} ids; the limit is {self.ids} (VAULTVEC_MAX_IDS_PER_REQUEST)"
            )

    def encode_metadata(self, m: Any, at: int) -> bytes | None:
        """One item's metadata -> stored JSON, within the depth and size limits."""
        if m is None:
            return None
        if not isinstance(m, dict):
            raise InvalidRequest(f"item {at}: metadata must be a JSON object or null")
        if nesting(m, self.metadata_depth) > self.metadata_depth:
            raise InvalidRequest(
                f"item {at}: metadata is nested deeper than {self.metadata_depth} levels "
                "(VAULTVEC_MAX_METADATA_DEPTH)"
            )
        try:
            blob = orjson.dumps(m)
        except TypeError:  # orjson.JSONEncodeError
            raise InvalidRequest(f"item {at}: metadata must be JSON-serialisable") from None
        if len(blob) > self.metadata_bytes:
            raise InvalidRequest(
                f"item {at}: metadata is {len(blob)} bytes as JSON; the limit is "
                f"{self.metadata_bytes} (VAULTVEC_MAX_METADATA_BYTES)"
            )
        return blob

    def check_items(self, ids: Sequence[str], contents: Sequence[str | None]) -> None:
        """Item count, id lengths and contents sizes of an upsert."""
        if len(ids) > self.items:
            raise InvalidRequest(
                f"the upsert holds {len(ids)} items; the limit is {self.items} "
                "(VAULTVEC_MAX_ITEMS_PER_UPSERT)"
            )
        for i, item_id in enumerate(ids):
            if not isinstance(item_id, str) or not 1 <= len(item_id) <= self.id_length:
                raise InvalidRequest(
                    f"item {i}: ids must be strings of 1 to {self.id_length} characters "
                    "(VAULTVEC_MAX_ID_LENGTH)"
                )
        for i, text in enumerate(contents):
            # A character is at most 4 UTF-8 bytes: only long texts need encoding.
            if text is not None and 4 * len(text) > self.contents_bytes:
                size = len(text.encode("utf-8", "surrogatepass"))
                if size > self.contents_bytes:
                    raise InvalidRequest(
                        f"item {ids[i]!r}: contents are {size} bytes; the limit is "
                        f"{self.contents_bytes} (VAULTVEC_MAX_CONTENTS_BYTES)"
                    )


_LIMITS: dict[int, tuple[Any, Limits]] = {}


def nesting(value: Any, stop: int) -> int:
    """How deeply ``value``'s objects and arrays nest (1 = a flat object), counted without
    recursion and only up to ``stop + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop:
            return deepest
        stack.extend((c, depth + 1) for c in children)
    return deepest


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
    check_norms(x, field, ids)
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
    check_norms(x, field)
    x, _ = to_index_space(x, cfg.metric, field)
    query = Query(top_k, n_probes or 0, parse_filter(filters), bool(greedy), with_metadata)
    return await engine.search(cv, x, query)


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
