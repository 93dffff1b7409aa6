"""/v1/vectors/*: upsert, query, get, delete, list_ids, num_vectors, query_metadata."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from actors.engine.filters import parse_filter
from actors.errors import InvalidRequest
from serve_app.access import context
from serve_app.gateway.engine import CachedView, Engine
from serve_app.http.errors_doc import BODY_ROUTE_ERRORS
from serve_app.http.models import (
    DeleteRequest,
    DeleteResponse,
    GetRequest,
    GetResponse,
    IndexRequest,
    ListIdsResponse,
    NumVectorsResponse,
    QueryMetadataRequest,
    QueryMetadataResponse,
    QueryRequest,
    QueryResponse,
    UpsertRequest,
    UpsertResponse,
)
from serve_app.http.plumbing import (
    JSON,
    OPTIONS,
    REPLICA,
    Route,
    embedder_of,
    engine_of,
    require_api_key,
    settings_of,
)
from serve_app.service import queries as service
from serve_app.service.checks import as_matrix
from serve_app.service.params import Limits, QueryParams, UpsertRows, distinct, get_fields

router = APIRouter(
    prefix="/vectors",
    route_class=Route,
    dependencies=[Depends(require_api_key)],
    responses=BODY_ROUTE_ERRORS,
)


@router.post("/upsert", response_model=UpsertResponse)
async def upsert(body: UpsertRequest, request: Request) -> JSON:
    rows = UpsertRows.of_items(body, settings_of(request))
    # Items without a vector are embedded from their contents (one model call per request).
    n = await service.upsert(engine_of(request), rows, embedder_of(request))
    return JSON({"status": "success", "message": f"Upserted {n} vectors", "upserted_count": n})


@router.post("/query", response_model=QueryResponse)
async def query(body: QueryRequest, request: Request) -> Response:
    return await answer_query(body)


async def answer_query(body: QueryRequest) -> Response:
    """The answer to a validated query body (this route's, and serve_app.http.plumbing.DirectRoutes')."""
    if (body.query_vectors is None) == (body.query_contents is None):
        raise InvalidRequest("give exactly one of query_vectors and query_contents")
    params = QueryParams.of(body, REPLICA.settings)
    engine: Engine = REPLICA.engine
    if body.query_contents is not None:  # text query: one embedding, flat results
        text = body.query_contents
        answer = await service.query_text_json(engine, REPLICA.embedder, params, text)
    else:
        x, single = as_matrix(body.query_vectors, "query_vectors")
        answer = await service.query_json(engine, params, x, single)
    return Response(answer, media_type="application/json")


# Answered before FastAPI's routing (serve_app.http.plumbing.DirectRoutes): (method, path) -> the body's
# model and its answer.
DIRECT = {("POST", "/v1/vectors/query"): (QueryRequest, answer_query)}


INLINE_RESULTS = 4096


@router.post("/get", response_model=GetResponse)
async def get(body: GetRequest, request: Request) -> Response:
    engine: Engine = engine_of(request)
    Limits.of(settings_of(request)).check_ids(body.ids)
    context.note(items=len(body.ids))
    cv = await engine.view(body.index_name, body.index_key)
    results = await fetch(engine, cv, body.ids, body.include)
    if len(results) <= INLINE_RESULTS:
        return JSON({"results": results})
    # Many items encode in a worker thread, leaving the event loop its turns of the GIL.
    answer = await asyncio.to_thread(orjson.dumps, {"results": results}, option=OPTIONS)
    return Response(answer, media_type="application/json")


async def fetch(
    engine: Engine, cv: CachedView, ids: list[str], include: Sequence[str] | None
) -> list[dict[str, Any]]:
    """The stored items of ``ids`` (each once, unknown ones left out) in the order asked."""
    ids = distinct(ids)
    context.note(items=len(ids))
    if not ids:
        return []
    if any(not i for i in ids):
        raise InvalidRequest("ids contains an empty id")
    fields = get_fields(include, cv.config)
    found = await engine.fetch(cv, ids, fields.vector, fields.metadata, fields.contents)
    return [found[i] for i in ids if i in found]


@router.post("/delete", response_model=DeleteResponse)
async def delete(body: DeleteRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    Limits.of(settings_of(request)).check_ids(body.ids)
    context.note(items=len(body.ids))
    cv = await engine.view(body.index_name, body.index_key)
    ids = distinct(body.ids)
    context.note(items=len(ids))
    if any(not i for i in ids):
        raise InvalidRequest("ids contains an empty id")
    n = await engine.delete(cv, ids)
    return JSON({"status": "success", "message": f"Deleted {n} vectors", "deleted_count": n})


@router.post("/list_ids", response_model=ListIdsResponse)
async def list_ids(body: IndexRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv: CachedView = await engine.view(body.index_name, body.index_key)
    ids = await engine.list_ids(cv)
    context.note(items=len(ids))
    return JSON({"ids": ids, "count": len(ids)})


@router.post("/num_vectors", response_model=NumVectorsResponse)
async def num_vectors(body: IndexRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    num, _ = await engine.count(cv)
    return JSON({"status": "success", "message": f"The index holds {num} vectors", "result": num})


@router.post("/query_metadata", response_model=QueryMetadataResponse)
async def query_metadata(body: QueryMetadataRequest, request: Request) -> JSON:
    """Metadata-only search: the ids of the items the filter matches (no vector), in the order
    of ``order_by`` if given, at most ``top_k``, with the fields of ``include`` as
    /v1/vectors/get returns them."""
    if body.text:
        raise InvalidRequest("query_metadata: text (BM25 full-text search) is not supported")
    order_by, ascending = sort_order(body.order_by, body.ascending)
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    node = parse_filter(body.filters or None)
    ids = await engine.match_ids(cv, node, body.top_k, order_by, ascending)
    context.note(items=len(ids))
    if body.include:
        results = await fetch(engine, cv, ids, body.include)
    else:
        results = [{"id": i} for i in ids]
    return JSON({"results": results, "ids": ids, "count": len(ids)})


def sort_order(
    order_by: str | dict[str, int] | None, ascending: bool | None
) -> tuple[str | None, bool]:
    """(field, ascending) of query_metadata's order_by: a name, or {name: 1 | -1}."""
    if isinstance(order_by, dict):
        if len(order_by) != 1 or next(iter(order_by.values())) not in (1, -1):
            raise InvalidRequest('order_by must be a field name or {"field": 1 | -1}')
        ((order_by, direction),) = order_by.items()
        return order_by, direction == 1
    if order_by is not None and not order_by:
        raise InvalidRequest("order_by must name a metadata field")
    return order_by, ascending is not False
