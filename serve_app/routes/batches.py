"""The batch routes with base64 float32 matrices.

- ``/v1/vectors/upsert_binary`` and ``/v1/vectors/query_binary``: CyborgDB's form (its newer
  SDKs send every numpy input there): ``batch: {ids, vectors_b64, dimension, ...}``, answered
  as the JSON routes answer.
- ``/v1/vectors/upsert_arrays`` and ``/v1/vectors/query_arrays``: vaultvec's compact form for
  its own client and bulk driver: ``[rows, dimension]`` shapes in, and query results as a
  counts array, flat ids and a base64 distance matrix.

After decoding, each route builds the serve_app.service.params object every transport builds and hands
it to serve_app.service, so the semantics, defaults and errors are those of /v1/vectors/query
and /v1/vectors/upsert.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends
from starlette.responses import Response

from serve_app import telemetry as metrics
from serve_app.batch_models import (
    ArraysQueryRequest,
    ArraysQueryResponse,
    ArraysUpsertRequest,
    BinaryQueryRequest,
    BinaryUpsertRequest,
)
from serve_app.http.bodies import JSON, Route
from serve_app.http.errors_doc import BODY_ROUTE_ERRORS
from serve_app.http.gate import require_api_key
from serve_app.models import QueryResponse, UpsertResponse
from serve_app.replica import services
from serve_app.service import fulltext, upserts
from serve_app.service import matrices as arrays
from serve_app.service import queries as service
from serve_app.service.params import COMPACT_INCLUDE, QueryParams, UpsertArgs, UpsertRows

router = APIRouter(
    prefix="/vectors",
    route_class=Route,
    dependencies=[Depends(require_api_key)],
    responses=BODY_ROUTE_ERRORS,
)


def upserted(n: int) -> JSON:
    return JSON({"status": "success", "message": f"Upserted {n} vectors", "upserted_count": n})


@router.post("/upsert_binary", response_model=UpsertResponse)
async def upsert_binary(body: BinaryUpsertRequest) -> JSON:
    """Upsert; ``batch.vectors_b64`` is base64 of an (n, dimension) little-endian float32
    matrix, one row per id. Empty contents ("") mean none, as CyborgDB's clients send them."""
    b = body.batch
    x = arrays.decode_rows(b.vectors_b64, len(b.ids), b.dimension, "batch.vectors_b64")
    contents = None if b.contents is None else [c or None for c in b.contents]
    cols = UpsertArgs(body.index_name, body.index_key, b.ids, b.metadata, contents)
    rows = UpsertRows.of_columns(cols, x, services().settings)
    return upserted(await upserts.upsert(services().engine, rows))


@router.post("/query_binary", response_model=QueryResponse)
async def query_binary(body: BinaryQueryRequest) -> Response:
    """Batch query; ``batch.vectors_b64`` is base64 of an (nq, dimension) little-endian float32
    matrix. The answer is /v1/vectors/query's for a list of vectors: a result list per row."""
    x = arrays.decode_rows(body.batch.vectors_b64, None, body.batch.dimension, "batch.vectors_b64")
    params = QueryParams.of(body, services().settings)
    hybrid = fulltext.Hybrid.of(body)
    answer = await service.query_json(services().engine, params, x, False, hybrid)
    return Response(answer, media_type="application/json")


@router.post("/query_arrays", response_model=ArraysQueryResponse)
async def query_arrays(body: ArraysQueryRequest) -> JSON:
    """Batch query; ``query_vectors`` is base64 of a (nq, d) little-endian float32 matrix."""
    x = arrays.decode_matrix(body.query_vectors, body.shape, "query_vectors")
    params = QueryParams.of(body, services().settings, COMPACT_INCLUDE)
    hits = await service.query_arrays(services().engine, params, x)
    t = metrics.now()
    ids, metadata = service.flat_results(hits)
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
    answer = JSON(out)
    metrics.lap("encode", t)
    return answer


@router.post("/upsert_arrays", response_model=UpsertResponse)
async def upsert_arrays(body: ArraysUpsertRequest) -> JSON:
    """Upsert; ``vectors`` is base64 of a (n, d) little-endian float32 matrix, one row per id."""
    x = arrays.decode_matrix(body.vectors, body.shape, "vectors")
    rows = UpsertRows.of_columns(body, x, services().settings)
    return upserted(await upserts.upsert(services().engine, rows))
