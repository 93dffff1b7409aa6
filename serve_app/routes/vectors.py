"""/v1/vectors/*: upsert, query, get, delete, list_ids, num_vectors, query_metadata. Each route
translates HTTP to an operation of the service layer (serve_app.service) and its answer back."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Depends
from starlette.responses import Response

from serve_app import constants
from serve_app.http.bodies import JSON, OPTIONS, Route
from serve_app.http.errors_doc import BODY_ROUTE_ERRORS
from serve_app.http.gate import require_api_key
from serve_app.models import (
    CountRequest,
    CountResponse,
    DeleteRequest,
    DeleteResponse,
    GetRequest,
    GetResponse,
    IndexRequest,
    ListIdsRequest,
    ListIdsResponse,
    NumVectorsResponse,
    QueryMetadataRequest,
    QueryMetadataResponse,
    QueryRequest,
    QueryResponse,
    UpdateRequest,
    UpdateResponse,
    UpsertRequest,
    UpsertResponse,
)
from serve_app.replica import services
from serve_app.service import items, queries, upserts
from serve_app.service.params import UpsertRows

router = APIRouter(
    prefix="/vectors",
    route_class=Route,
    dependencies=[Depends(require_api_key)],
    responses=BODY_ROUTE_ERRORS,
)


@router.post("/upsert", response_model=UpsertResponse)
async def upsert(body: UpsertRequest) -> JSON:
    svc = services()
    rows = UpsertRows.of_items(body, svc.settings)
    # Items without a vector are embedded from their contents (one model call per request).
    n = await upserts.upsert(svc.engine, rows, svc.embedder)
    return JSON({"status": "success", "message": f"Upserted {n} vectors", "upserted_count": n})


@router.post("/query", response_model=QueryResponse)
async def query(body: QueryRequest) -> Response:
    return await answer_query(body)


async def answer_query(body: QueryRequest) -> Response:
    """The answer to a validated query body (this route's, and serve_app.http.direct's)."""
    return Response(await queries.answer(services(), body), media_type="application/json")


# Answered before FastAPI's routing (serve_app.http.direct.DirectRoutes): (method, path) -> the
# body's model and its answer.
DIRECT = {("POST", "/v1/vectors/query"): (QueryRequest, answer_query)}


@router.post("/get", response_model=GetResponse)
async def get(body: GetRequest) -> Response:
    results = await items.get(services(), body)
    if len(results) <= constants.INLINE_GET_RESULTS:
        return JSON({"results": results})
    # Many items encode in a worker thread, leaving the event loop its turns of the GIL.
    answer = await asyncio.to_thread(orjson.dumps, {"results": results}, option=OPTIONS)
    return Response(answer, media_type="application/json")


@router.post("/delete", response_model=DeleteResponse)
async def delete(body: DeleteRequest) -> JSON:
    n = await items.delete(services(), body)
    return JSON({"status": "success", "message": f"Deleted {n} vectors", "deleted_count": n})


@router.post("/list_ids", response_model=ListIdsResponse)
async def list_ids(body: ListIdsRequest) -> JSON:
    """Every id; with ``limit`` one page in id order and its ``next_cursor`` (vaultvec)."""
    ids, cursor = await items.list_ids(services(), body)
    out: dict[str, Any] = {"ids": ids, "count": len(ids)}
    if body.limit is not None:
        out["next_cursor"] = cursor
    return JSON(out)


@router.post("/update", response_model=UpdateResponse)
async def update(body: UpdateRequest) -> JSON:
    """vaultvec: change items' metadata ($set/$unset) or contents in place, by ids or filter."""
    n = await items.update(services(), body)
    return JSON({"status": "success", "message": f"Updated {n} vectors", "updated_count": n})


@router.post("/count", response_model=CountResponse)
async def count(body: CountRequest) -> JSON:
    """vaultvec: how many items a filter matches (every item without one), exact."""
    return JSON({"count": await items.count_matching(services(), body)})


@router.post("/num_vectors", response_model=NumVectorsResponse)
async def num_vectors(body: IndexRequest) -> JSON:
    num = await items.count(services(), body)
    return JSON({"status": "success", "message": f"The index holds {num} vectors", "result": num})


@router.post("/query_metadata", response_model=QueryMetadataResponse)
async def query_metadata(body: QueryMetadataRequest) -> JSON:
    """Metadata-only search: the ids of the items the filter matches (no vector), in the order
    of ``order_by`` if given, at most ``top_k``, with the fields of ``include`` as
    /v1/vectors/get returns them."""
    results, ids, cursor = await items.query_metadata(services(), body)
    out: dict[str, Any] = {"results": results, "ids": ids, "count": len(ids)}
    if body.limit is not None:
        out["next_cursor"] = cursor
    return JSON(out)
