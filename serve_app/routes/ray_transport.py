"""The Ray transport: the Gateway deployment's ``query_arrays``/``upsert_arrays`` methods, called
through a DeploymentHandle with numpy arrays (the bulk driver's ``--transport ray``). They build
the same serve_app.service.params objects as the HTTP routes, so the semantics, defaults and
errors are those of every other transport."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import orjson

from actors.errors import InvalidRequest
from serve_app.gateway.calls import retry_stale
from serve_app.http.errors import api_error
from serve_app.replica import services
from serve_app.service import queries as searches
from serve_app.service import upserts
from serve_app.service.checks import as_matrix
from serve_app.service.params import COMPACT_INCLUDE, QueryArgs, QueryParams, UpsertArgs, UpsertRows


async def _guarded(run: Callable[[], Awaitable[Any]]) -> Any:
    """Run a request as the HTTP routes do: once more if the index was re-created meanwhile;
    errors mapped by the same function (serve_app.http.errors.api_error)."""
    try:
        return await retry_stale(run)
    except Exception as exc:
        raise api_error(exc) from None


def _handle_matrix(value: Any, field: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim != 2:
        raise InvalidRequest(f"{field} must be a 2-D numpy array")
    x, _ = as_matrix(value, field)  # float32, contiguous, finite, non-empty
    return x


async def handle_query(  # the signature of Gateway.query_arrays, the Ray transport's API
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
    travel as one orjson blob: far cheaper to encode than a pickled object array."""
    args = QueryArgs(index_name, index_key, top_k, n_probes, filters, greedy, include)

    async def run() -> dict[str, Any]:
        x = _handle_matrix(queries, "query_vectors")
        svc = services()
        params = QueryParams.of(args, svc.settings, COMPACT_INCLUDE)
        hits = await searches.query_arrays(svc.engine, params, x)
        ids, metadata = searches.flat_results(hits)
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
        cols = UpsertArgs(index_name, index_key, ids, metadata, contents)
        svc = services()
        rows = UpsertRows.of_columns(cols, x, svc.settings)
        return await upserts.upsert(svc.engine, rows)

    return int(await _guarded(run))
