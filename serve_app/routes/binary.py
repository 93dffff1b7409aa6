"""/v1/vectors/query_binary and /v1/vectors/upsert_binary: the batch routes in compact form.

Matrices travel as base64 of little-endian float32 with a ``[rows, dimension]`` shape instead of
JSON number lists; query results come back as a counts array, flat ids and a base64 distance
matrix. Everything after decoding is serve_app.service's (through serve_app.arrays), so the
semantics, defaults and errors are those of /v1/vectors/query and /v1/vectors/upsert.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends, Request

from serve_app import arrays
from serve_app.errors_doc import ERRORS
from serve_app.http import JSON, Route, engine_of, require_api_key, settings_of
from serve_app.models import (
    BinaryQueryRequest,
    BinaryQueryResponse,
    BinaryUpsertRequest,
    UpsertResponse,
)

router = APIRouter(
    prefix="/vectors", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@router.post("/query_binary", response_model=BinaryQueryResponse)
async def query_binary(body: BinaryQueryRequest, request: Request) -> JSON:
    """Batch query; ``query_vectors`` is base64 of a (nq, d) little-endian float32 matrix."""
    x = arrays.decode_matrix(body.query_vectors, body.shape, "query_vectors")
    hits = await arrays.query(
        engine_of(request),
        settings_of(request).max_top_k,
        body.index_name,
        body.index_key,
        x,
        body.top_k,
        body.n_probes,
        body.filters,
        body.greedy,
        body.include,
    )
    ids, metadata = arrays.flat_results(hits)
    out = {
        "nq": len(hits.counts),
        "top_k": hits.ids.shape[1],
        "counts": hits.counts,
        "ids": orjson.Fragment(ids),
    }
    if hits.distances is not None:
        out["distances"] = arrays.encode_matrix(hits.distances)
    if metadata is not None:
        out["metadata"] = metadata
    return JSON(out)


@router.post("/upsert_binary", response_model=UpsertResponse)
async def upsert_binary(body: BinaryUpsertRequest, request: Request) -> JSON:
    """Upsert; ``vectors`` is base64 of a (n, d) little-endian float32 matrix, one row per id."""
    x = arrays.decode_matrix(body.vectors, body.shape, "vectors")
    n = await arrays.upsert(
        engine_of(request),
        body.index_name,
        body.index_key,
        body.ids,
        x,
        body.metadata,
        body.contents,
    )
    return JSON({"status": "success", "message": f"Upserted {n} vectors", "upserted_count": n})
