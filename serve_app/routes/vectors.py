"""/v1/vectors/*: upsert, query, get, delete, list_ids, num_vectors."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Request

from actors.errors import InvalidRequest
from actors.types import UpsertBatch
from serve_app.engine import CachedView, Engine, Hits
from serve_app.errors_doc import ERRORS
from serve_app.http import JSON, Route, engine_of, require_api_key, settings_of
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
from serve_app.vectors import as_matrix, check_dimension, to_api_distance, to_index_space

router = APIRouter(
    prefix="/vectors", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


def unique_ids(ids: list[str], field: str = "ids") -> None:
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise InvalidRequest(f"{field} contains the id {dup!r} more than once")
    if any(not i for i in ids):
        raise InvalidRequest(f"{field} contains an empty id")


@router.post("/upsert", response_model=UpsertResponse)
async def upsert(body: UpsertRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    items = body.items
    ids = [it.id for it in items]
    unique_ids(ids, "items ids")
    missing = [it.id for it in items if it.vector is None]
    if missing:
        raise InvalidRequest(
            f"item {missing[0]!r} has no vector and the index has no embedding model"
        )
    x, _ = as_matrix([it.vector for it in items], "items vectors")
    if len(items) == 1 and x.shape[0] != 1:
        raise InvalidRequest("item vector must be a list of numbers")
    cfg = cv.config
    if cfg.dimension is None:
        if cfg.index_type == "ivfpq" and cfg.pq_dim and x.shape[1] % cfg.pq_dim:
            raise InvalidRequest(f"pq_dim {cfg.pq_dim} must divide the dimension {x.shape[1]}")
        await engine.call(engine.control.set_dimension.remote(cfg.name, cv.key, x.shape[1]))
        cv = await engine._load_view(cfg.name, cv.key)
        cfg = cv.config
    check_dimension(x, cfg.dimension, "items vectors")
    x, norms = to_index_space(x, cfg.metric, "items vectors")
    metadata = [None if it.metadata is None else orjson.dumps(it.metadata) for it in items]
    contents = [it.contents for it in items]

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
    return JSON(
        {
            "status": "success",
            "message": f"Upserted {len(items)} vectors",
            "upserted_count": len(items),
        }
    )


@router.post("/query", response_model=QueryResponse)
async def query(body: QueryRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    settings = settings_of(request)
    if (body.query_vectors is None) == (body.query_contents is None):
        raise InvalidRequest("give exactly one of query_vectors and query_contents")
    if body.query_contents is not None:
        raise InvalidRequest("query_contents needs an index with an embedding model")
    top_k = 100 if body.top_k is None else body.top_k
    if not 1 <= top_k <= settings.max_top_k:
        raise InvalidRequest(f"top_k must be between 1 and {settings.max_top_k}")
    include = body.include if body.include is not None else ["distance", "metadata"]
    x, single = as_matrix(body.query_vectors, "query_vectors")
    cv = await engine.view(body.index_name, body.index_key)
    cfg = cv.config
    if cfg.dimension is None:  # nothing was ever stored
        return JSON({"results": [] if single else [[] for _ in range(len(x))]})
    check_dimension(x, cfg.dimension, "query_vectors")
    x, _ = to_index_space(x, cfg.metric, "query_vectors")
    hits = await engine.search(
        cv, x, top_k, body.n_probes or 0, body.filters, bool(body.greedy), "metadata" in include
    )
    results = shape_results(hits, cfg.metric, "distance" in include, "metadata" in include)
    return JSON({"results": results[0] if single else results})


def shape_results(
    hits: Hits, metric: str, with_distance: bool, with_metadata: bool
) -> list[list[dict[str, Any]]]:
    distances = to_api_distance(hits.distances, metric).tolist()
    ids = hits.ids.tolist()
    meta = hits.metadata.tolist() if with_metadata and hits.metadata is not None else None
    empty = orjson.Fragment(b"{}")
    out = []
    for q, n in enumerate(hits.counts.tolist()):
        row_ids = ids[q]
        entries: list[dict[str, Any]] = [{"id": row_ids[j]} for j in range(n)]
        if with_distance:
            row_d = distances[q]
            for j in range(n):
                entries[j]["distance"] = row_d[j]
        if meta is not None:
            row_m = meta[q]
            for j in range(n):
                m = row_m[j]
                entries[j]["metadata"] = empty if m is None else orjson.Fragment(m)
        out.append(entries)
    return out


@router.post("/get", response_model=GetResponse)
async def get(body: GetRequest, request: Request) -> JSON:
    engine: Engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    unique_ids(body.ids)
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
    unique_ids(body.ids)
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
