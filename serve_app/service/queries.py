"""What a query does, whatever the transport (JSON routes, base64 matrix routes, the Ray
transport, text queries).

A transport decodes its wire format into numpy arrays and builds one serve_app.service.params
QueryParams; these functions unlock the index, check the vectors against it, run the engine and
shape the answer: the JSON answer ``{"results": ...}`` or the compact one (:class:`ArrayHits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from actors.engine.strings import StringBlock
from actors.errors import InvalidRequest
from serve_app.access import context
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.gateway.hits import Hits
from serve_app.models import QueryRequest
from serve_app.service import fulltext, text
from serve_app.service.checks import (
    as_matrix,
    check_dimension,
    check_norms,
    to_api_distance,
    to_index_space,
)
from serve_app.service.deps import Services
from serve_app.service.params import Fields, QueryParams, distinct
from serve_app.service.results import filled, results_json, shape_results
from serve_app.service.unlock import open_index
from serve_app.telemetry import lap, now

QUERY_FIELD = "query_vectors"  # how errors name a query's vectors, whatever the transport


async def query(engine: Engine, cv: CachedView, params: QueryParams, x: np.ndarray) -> Hits:
    """Top-k for query matrix ``x`` (nq, d), ascending distance, in index space."""
    cfg = cv.config
    if cfg.dimension is None:  # nothing was ever stored
        shape = (len(x), params.top_k)
        dist = np.full(shape, np.inf, dtype=np.float32)
        meta = np.empty(shape, dtype=object) if params.fields.metadata else None
        return Hits(dist, StringBlock.empty(shape), meta, np.zeros(len(x), dtype=np.int64))
    t = now()
    check_dimension(x, cfg.dimension, QUERY_FIELD)
    check_norms(x, QUERY_FIELD)
    x, _ = to_index_space(x, cfg.metric, QUERY_FIELD)
    lap("parse", t)
    if len(x) == 1:
        return await engine.search_one(cv, x, params.query)
    return await engine.search(cv, x, params.query)


# -- the JSON answer (/v1/vectors/query, /v1/vectors/query_binary) --------------------------
async def answer(svc: Services, body: QueryRequest) -> bytes:
    """The JSON answer to a validated query body: vectors (one, or a batch) or a text."""
    if (body.query_vectors is None) == (body.query_contents is None):
        raise InvalidRequest("give exactly one of query_vectors and query_contents")
    params = QueryParams.of(body, svc.settings)
    hybrid = fulltext.Hybrid.of(body)
    if body.query_contents is not None:  # text query: one embedding, flat results
        return await query_text_json(svc.engine, svc.embedder, params, body.query_contents, hybrid)
    x, single = as_matrix(body.query_vectors, "query_vectors")
    return await query_json(svc.engine, params, x, single, hybrid)


async def query_json(
    engine: Engine,
    params: QueryParams,
    x: np.ndarray,
    single: bool,
    hybrid: fulltext.Hybrid | None = None,
) -> bytes:
    """The JSON answer to the (nq, d) matrix ``x``: one list, or one per row unless ``single``."""
    context.note(items=len(x))
    cv = await open_index(engine, params.index_name, params.index_key, Right.READ)
    return await json_answer(engine, cv, params, x, single, hybrid)


async def query_text_json(
    engine: Engine,
    embedder: Any,
    params: QueryParams,
    query_text: str,
    hybrid: fulltext.Hybrid | None = None,
) -> bytes:
    """The JSON answer to a text query, embedded with the index's model: one flat list."""
    context.note(items=1)
    cv = await open_index(engine, params.index_name, params.index_key, Right.READ)
    model = text.index_model(cv.config, "query_contents")
    x = await text.embed_query(embedder, model, query_text)
    return await json_answer(engine, cv, params, x, True, hybrid)


async def json_answer(
    engine: Engine,
    cv: CachedView,
    params: QueryParams,
    x: np.ndarray,
    single: bool,
    hybrid: fulltext.Hybrid | None = None,
) -> bytes:
    """``{"results": ...}``. Every entry of a vector query has its distance (CyborgDB's
    clients rely on it whatever ``include`` says), every entry of a hybrid query (``hybrid``:
    with text) its fused score instead; ``vector`` and ``contents``, when asked for, are
    fetched for the results by id."""
    fields = params.fields
    if hybrid is not None:
        rows = await fulltext.fused(
            engine, cv, hybrid, params, x, lambda p: query(engine, cv, p, x)
        )
        if fields.vector or fields.contents:
            await attach_items(engine, cv, rows, fields)
        return orjson.dumps({"results": rows[0] if single else rows})
    hits = await query(engine, cv, params, x)
    metric = cv.config.metric
    t = now()
    if not (fields.vector or fields.contents):
        answer = results_json(hits, metric, True, fields.metadata, single)
        lap("encode", t)
        return answer
    results = shape_results(hits, metric, True, fields.metadata)
    t = lap("encode", t)
    await attach_items(engine, cv, results, fields)
    t = lap("fetch", t)
    body = {"results": results[0] if single else results}
    answer = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    lap("encode", t)
    return answer


async def attach_items(
    engine: Engine, cv: CachedView, results: list[list[dict[str, Any]]], fields: Fields
) -> None:
    """Add the stored ``vector`` and ``contents`` (as ``fields`` selects) to the results."""
    ids = distinct([e["id"] for row in results for e in row])
    found = await engine.fetch(cv, ids, fields.vector, False, fields.contents) if ids else {}
    for row in results:
        for entry in row:
            item = found.get(entry["id"], {})
            for name in ("vector", "contents"):
                if name in item:
                    entry[name] = item[name]


# -- the compact answer (/v1/vectors/query_arrays, the Ray transport) ------------------------
@dataclass(frozen=True)
class ArrayHits:
    """Top-k of a query batch in API terms. Row q holds ``counts[q]`` results, then padding:
    id None, distance +inf, metadata None."""

    ids: StringBlock  # (nq, k) str or None
    distances: np.ndarray | None  # (nq, k) float32, the metric's distance; None unless asked
    metadata: np.ndarray | None  # (nq, k) object: orjson bytes or None; None unless asked
    counts: np.ndarray  # (nq,) int64


async def query_arrays(engine: Engine, params: QueryParams, x: np.ndarray) -> ArrayHits:
    """Top-k for the (nq, d) float32 matrix ``x`` (already finite and 2-D)."""
    context.note(items=len(x))
    cv = await open_index(engine, params.index_name, params.index_key, Right.READ)
    hits = await query(engine, cv, params, x)
    fields = params.fields
    dist = to_api_distance(hits.distances, cv.config.metric) if fields.distance else None
    return ArrayHits(
        hits.ids,
        None if dist is None else dist.astype(np.float32, copy=False),
        hits.metadata if fields.metadata else None,
        hits.counts.astype(np.int64, copy=False),
    )


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
