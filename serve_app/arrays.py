"""Array-level query and upsert: what the base64 matrix routes and the Ray (DeploymentHandle)
transport share. Both hand numpy matrices in; the semantics, defaults and errors are serve_app.service's,
so every transport answers alike.

Also the base64 codec of those routes: a matrix travels as base64 of its little-endian float32
bytes, row-major, with its ``[rows, dimension]`` shape or its dimension alone.
"""

from __future__ import annotations

import binascii
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pybase64

from actors.errors import InvalidRequest
from actors.strings import StringBlock
from serve_app import service
from serve_app.engine import Engine, retry_stale
from serve_app.errors import api_error
from serve_app.http import REPLICA
from serve_app.results import filled
from serve_app.vectors import as_matrix, to_api_distance

F32 = np.dtype("<f4")


@dataclass(frozen=True)
class ArrayHits:
    """Top-k of a query batch in API terms. Row q holds ``counts[q]`` results, then padding:
    id None, distance +inf, metadata None."""

    ids: StringBlock  # (nq, k) str or None
    distances: np.ndarray | None  # (nq, k) float32, the metric's distance; None unless asked
    metadata: np.ndarray | None  # (nq, k) object: orjson bytes or None; None unless asked
    counts: np.ndarray  # (nq,) int64


def decode_matrix(data: str, shape: Sequence[int], field: str) -> np.ndarray:
    """base64 little-endian float32 + [rows, dim] -> a validated (rows, dim) float32 matrix."""
    rows, dim = int(shape[0]), int(shape[1])
    if rows < 1 or dim < 1:
        raise InvalidRequest(f"{field}: shape must be [rows >= 1, dimension >= 1]")
    return decode_rows(data, rows, dim, field, f"shape {[rows, dim]} of float32 needs")


def decode_rows(
    data: str, rows: int | None, dim: int, field: str, need: str | None = None
) -> np.ndarray:
    """base64 little-endian float32 with ``dim`` columns -> a validated (rows, dim) matrix;
    ``rows`` None: as many as the bytes hold (at least one)."""
    try:
        raw = pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{field} is not valid base64") from None
    row_bytes = dim * 4
    if rows is None:
        rows = len(raw) // row_bytes if len(raw) % row_bytes == 0 else -1
    if rows < 1 or len(raw) != rows * row_bytes:
        if rows < 1:
            need = f"a whole number of rows (at least one) of {row_bytes} bytes"
        else:
            need = f"{need or f'{rows} rows of {dim} float32 need'} {rows * row_bytes}"
        raise InvalidRequest(f"{field} holds {len(raw)} bytes; {need}")
    x, _ = as_matrix(np.frombuffer(raw, dtype=F32).reshape(rows, dim), field)
    return x


def encode_matrix(x: np.ndarray) -> str:
    return pybase64.b64encode_as_string(np.ascontiguousarray(x, dtype=F32).tobytes())


def resolve_include(include: Sequence[str] | None) -> tuple[bool, bool]:
    """(with distance, with metadata) of a query's ``include`` (None = the default)."""
    inc = service.DEFAULT_QUERY_INCLUDE if include is None else include
    unknown = set(inc) - {"distance", "metadata"}
    if unknown:
        raise InvalidRequest(f"include: unknown value {sorted(unknown)[0]!r}")
    return "distance" in inc, "metadata" in inc


async def query(
    engine: Engine,
    max_top_k: int,
    index_name: str,
    index_key: str,
    x: np.ndarray,
    top_k: int | None,
    n_probes: int | None,
    filters: dict[str, Any] | None,
    greedy: bool | None,
    include: Sequence[str] | None,
    field: str = "query_vectors",
) -> ArrayHits:
    """Top-k for the (nq, d) float32 matrix ``x`` (already finite and 2-D)."""
    k = service.resolve_top_k(top_k, max_top_k)
    with_distance, with_metadata = resolve_include(include)
    if n_probes is not None and n_probes < 0:
        raise InvalidRequest("n_probes must be >= 0 (0 = automatic)")
    cv = await engine.view(index_name, index_key)
    hits = await service.search(engine, cv, x, k, n_probes, filters, greedy, with_metadata, field)
    dist = to_api_distance(hits.distances, cv.config.metric) if with_distance else None
    return ArrayHits(
        hits.ids,
        None if dist is None else dist.astype(np.float32, copy=False),
        hits.metadata if with_metadata else None,
        hits.counts.astype(np.int64, copy=False),
    )


async def upsert(
    engine: Engine,
    limits: service.Limits,
    index_name: str,
    index_key: str,
    ids: Sequence[str],
    x: np.ndarray,
    metadata: Sequence[dict[str, Any] | None] | None,
    contents: Sequence[str | None] | None,
    field: str = "vectors",
) -> int:
    """Store ``ids`` with the rows of ``x`` (already finite and 2-D); returns the count."""
    ids = list(ids)
    n = len(ids)
    if x.shape[0] != n:
        raise InvalidRequest(f"{field} has {x.shape[0]} rows for {n} ids")
    for name, column in (("metadata", metadata), ("contents", contents)):
        if column is not None and len(column) != n:
            raise InvalidRequest(f"{name} has {len(column)} entries for {n} ids")
    if contents is not None and any(c is not None and not isinstance(c, str) for c in contents):
        raise InvalidRequest("contents must be strings or null")
    cont: Sequence[str | None] = [None] * n if contents is None else contents
    limits.check_items(ids, cont)
    meta = (
        [None] * n
        if metadata is None
        else [limits.encode_metadata(m, i) for i, m in enumerate(metadata)]
    )
    cv = await engine.view(index_name, index_key)
    return await service.upsert(engine, cv, ids, x, meta, cont, field)


def flat_results(hits: ArrayHits) -> tuple[bytes, list[Any] | None]:
    """The compact answer's flat ids as the bytes of a JSON array (and the metadata list) in
    query order: row q's counts[q] entries."""
    counts = hits.counts
    k = hits.ids.shape[1]
    if len(counts) and int(counts.min()) == k:  # every query full: no padding to drop
        ids = hits.ids.json_array()
        meta = None if hits.metadata is None else hits.metadata.ravel().tolist()
    else:
        keep = filled(counts, k)
        ids = hits.ids.select(keep).json_array()
        meta = None if hits.metadata is None else hits.metadata[keep].tolist()
    if meta is not None:  # as the JSON route: an item without metadata has null
        meta = [None if m is None else orjson.Fragment(m) for m in meta]
    return ids, meta


# -- the Ray transport: Gateway methods called through a DeploymentHandle -------------------
async def _guarded(run: Callable[[], Awaitable[Any]]) -> Any:
    """Run a request as the HTTP routes do: once more if the index was re-created meanwhile;
    errors mapped by the same function (serve_app.errors.api_error)."""
    try:
        return await retry_stale(run)
    except Exception as exc:
        raise api_error(exc) from None


def _handle_matrix(value: Any, field: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim != 2:
        raise InvalidRequest(f"{field} must be a 2-D numpy array")
    x, _ = as_matrix(value, field)  # float32, contiguous, finite, non-empty
    return x


async def handle_query(
    index_name: str,
    index_key: str,
    queries: Any,
    top_k: int | None = None,
    n_probes: int | None = None,
    filters: dict[str, Any] | None = None,
    greedy: bool | None = None,
    include: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``Gateway.query_arrays``: the query_arrays answer with numpy arrays, for Ray to carry.

    {"top_k": k, "counts": (nq,) int64, "ids": JSON bytes of the flat id list (sum(counts)
    ids, query after query), "distances": (nq, k) float32 (+inf past counts[q]) or None,
    "metadata": JSON bytes of the flat metadata list (aligned with ids) or None}. The ids
    travel as one orjson blob: ten times cheaper to encode than a pickled object array."""

    async def run() -> dict[str, Any]:
        rep = REPLICA
        x = _handle_matrix(queries, "query_vectors")
        hits = await query(
            rep.engine,
            rep.settings.max_top_k,
            index_name,
            index_key,
            x,
            top_k,
            n_probes,
            filters,
            greedy,
            include,
        )
        ids, metadata = flat_results(hits)
        return {
            "top_k": hits.ids.shape[1],
            "counts": hits.counts,
            "ids": ids,
            "distances": hits.distances,
            "metadata": None if metadata is None else orjson.dumps(metadata),
        }

    return dict(await _guarded(run))


async def handle_upsert(
    index_name: str,
    index_key: str,
    ids: Sequence[str],
    vectors: Any,
    metadata: Sequence[dict[str, Any] | None] | None = None,
    contents: Sequence[str | None] | None = None,
) -> int:
    """``Gateway.upsert_arrays``: the number of items upserted."""

    async def run() -> int:
        x = _handle_matrix(vectors, "vectors")
        limits = service.Limits.of(REPLICA.settings)
        return await upsert(
            REPLICA.engine, limits, index_name, index_key, ids, x, metadata, contents
        )

    return int(await _guarded(run))
