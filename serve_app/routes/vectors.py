"""/v1/vectors/*: upsert, query, get, delete, list_ids, num_vectors."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from actors.errors import InvalidRequest
from serve_app import service, text
from serve_app.engine import CachedView, Engine
from serve_app.errors_doc import ERRORS
from serve_app.http import JSON, Route, embedder_of, engine_of, require_api_key, settings_of
from serve_app.models import (
    DeleteRequest,
    DeleteResponse,
    GetRequest,
    GetResponse,
    IndexRequest,
    ListIdsResponse,
    NumVectorsResponse,
    QueryRequest,
    QueryResponse,
    UpsertRequest,
    UpsertResponse,
)
from serve_app.results import results_json
from serve_app.vectors import as_matrix

router = APIRouter(
    prefix="/vectors", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@router.post("/upsert", response_model=UpsertResponse)
async def upsert(body: UpsertRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    items = body.items
    ids, contents = [it.id for it in items], [it.contents for it in items]
    # Items without a vector are embedded from their contents (one model call per request).
    x = await text.item_vectors(
        embedder_of(request), cv.config, ids, [it.vector for it in items], contents
    )
    metadata = [None if it.metadata is None else orjson.dumps(it.metadata) for it in items]
    n = await service.upsert(engine, cv, ids, x, metadata, contents)
    return JSON({"status": "success", "message": f"Upserted {n} vectors", "upserted_count": n})


@router.post("/query", response_model=QueryResponse)
async def query(body: QueryRequest, request: Request) -> Response:
    engine: Engine = engine_of(request)
    if (body.query_vectors is None) == (body.query_contents is None):
        raise InvalidRequest("give exactly one of query_vectors and query_contents")
    top_k = service.resolve_top_k(body.top_k, settings_of(request).max_top_k)
    include = body.include if body.include is not None else service.DEFAULT_QUERY_INCLUDE
    if body.query_contents is not None:  # text query: one embedding, flat results
        cv = await engine.view(body.index_name, body.index_key)
        model = text.index_model(cv.config, "query_contents")
        x = await text.embed_query(embedder_of(request), model, body.query_contents)
        single = True
    else:
        x, single = as_matrix(body.query_vectors, "query_vectors")
        cv = await engine.view(body.index_name, body.index_key)
    with_metadata = "metadata" in include
    hits = await service.search(
        engine, cv, x, top_k, body.n_probes, body.filters, body.greedy, with_metadata
    )
    body_json = results_json(hits, cv.config.metric, "distance" in include, with_metadata, single)
    return Response(body_json, media_type="application/json")


@router.post("/get", response_model=GetResponse)
async def get(body: GetRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    service.unique_ids(body.ids)
    cfg = cv.config
    if body.include is None:
        include = {"contents", "metadata"} | ({"vector"} if cfg.index_type == "ivfflat" else set())
    else:
        include = set(body.include)
        if "vector" in include and cfg.index_type != "ivfflat":
            raise InvalidRequest(
                f"{cfg.index_type} indexes do not keep original vectors; drop 'vector' from include"
            )
    found = await engine.fetch(
        cv, body.ids, "vector" in include, "metadata" in include, "contents" in include
    )
    return JSON({"results": [found[i] for i in body.ids if i in found]})


@router.post("/delete", response_model=DeleteResponse)
async def delete(body: DeleteRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    service.unique_ids(body.ids)
    counts = await engine.by_shard(cv, body.ids, "delete")
    n = int(sum(counts))
    return JSON({"status": "success", "message": f"Deleted {n} vectors", "deleted_count": n})


@router.post("/list_ids", response_model=ListIdsResponse)
async def list_ids(body: IndexRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv: CachedView = await engine.view(body.index_name, body.index_key)
    parts = await engine.all_shards(cv, "list_ids")
    ids = [i for part in parts for i in part]
    return JSON({"ids": ids, "count": len(ids)})


@router.post("/num_vectors", response_model=NumVectorsResponse)
async def num_vectors(body: IndexRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    num, _ = await engine.count(cv)
    return JSON({"result": num})
