"""/v1/indexes/*: create, list, describe, delete, train, training-status."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from actors.control import new_index_id
from actors.crypto import derive_keys, new_salt, parse_index_key
from actors.errors import InvalidRequest
from actors.training import TrainParams
from actors.types import IndexConfig, IndexMeta
from serve_app import text
from serve_app.errors_doc import CONFLICT, ERRORS
from serve_app.http import JSON, Route, embedder_of, engine_of, require_api_key, settings_of
from serve_app.models import (
    CreateIndexRequest,
    DescribeResponse,
    IndexRequest,
    ListIndexesResponse,
    StatusResponse,
    TrainingStatusResponse,
    TrainRequest,
)

router = APIRouter(
    prefix="/indexes", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@router.get("/list", response_model=ListIndexesResponse)
async def list_indexes(request: Request) -> JSON:
    engine = engine_of(request)
    return JSON({"indexes": await engine.call(engine.control.list_indexes.remote())})


@router.post("/create", response_model=StatusResponse, responses=CONFLICT)
async def create_index(body: CreateIndexRequest, request: Request) -> JSON:
    engine, settings = engine_of(request), settings_of(request)
    key = parse_index_key(body.index_key)
    cfg_in = body.index_config
    index_type = (cfg_in.type if cfg_in else None) or "ivfflat"
    metric = body.metric or (cfg_in.metric if cfg_in else None)
    dimension = cfg_in.dimension if cfg_in else None
    model = body.embedding_model or None
    if model:  # the model fixes the dimension; such indexes default to cosine
        model_dim = await text.model_dimension(embedder_of(request), model)
        if dimension is not None and dimension != model_dim:
            raise InvalidRequest(
                f"index_config.dimension {dimension} conflicts with embedding_model {model!r}, "
                f"which produces {model_dim}-dimensional vectors"
            )
        dimension = model_dim
    metric = metric or ("cosine" if model else "euclidean")
    pq_dim = cfg_in.pq_dim if cfg_in else None
    pq_bits = cfg_in.pq_bits if cfg_in else None
    if index_type != "ivfpq" and (pq_dim or pq_bits):
        raise InvalidRequest("pq_dim and pq_bits apply only to ivfpq indexes")
    if index_type == "ivfpq":
        pq_bits = pq_bits or 8
        if pq_dim is not None and dimension is not None and dimension % pq_dim:
            raise InvalidRequest(f"pq_dim {pq_dim} must divide the dimension {dimension}")
    salt = new_salt()
    keys = derive_keys(key, body.index_name, salt)
    meta = IndexMeta(body.index_name, new_index_id(), salt, keys.verifier)
    cfg = IndexConfig(
        name=body.index_name,
        index_id=meta.index_id,
        index_type=index_type,
        metric=metric,
        n_shards=body.n_shards or settings.shards,  # 0: the control plane picks
        dimension=dimension,
        pq_dim=pq_dim,
        pq_bits=pq_bits,
        embedding_model=model,
        recall_target=settings.recall_target,
    )
    await engine.call(engine.control.create_index.remote(meta, keys.data_key, cfg))
    engine.forget(body.index_name)
    return JSON({"status": "success", "message": f"Index '{body.index_name}' created"})


@router.post("/describe", response_model=DescribeResponse)
async def describe_index(body: IndexRequest, request: Request) -> JSON:
    engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    num, cv = await engine.count(cv)
    cfg = cv.config
    index_config = {
        "type": cfg.index_type,
        "dimension": cfg.dimension,
        "metric": cfg.metric,
        "n_lists": cfg.n_lists,
    }
    if cfg.index_type == "ivfpq":
        index_config.update(pq_dim=cfg.pq_dim, pq_bits=cfg.pq_bits)
    return JSON(
        {
            "index_name": cfg.name,
            "index_type": cfg.index_type,
            "is_trained": cfg.is_trained,
            "index_config": index_config,
            "embedding_model": cfg.embedding_model,
            "num_vectors": num,
        }
    )


@router.post("/delete", response_model=StatusResponse)
async def delete_index(body: IndexRequest, request: Request) -> JSON:
    engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    await engine.call(engine.control.delete_index.remote(body.index_name, cv.key))
    engine.forget(body.index_name)
    return JSON({"status": "success", "message": f"Index '{body.index_name}' deleted"})


@router.post("/train", response_model=StatusResponse)
async def train_index(body: TrainRequest, request: Request) -> JSON:
    engine = engine_of(request)
    cv = await engine.view(body.index_name, body.index_key)
    params = TrainParams(
        n_lists=body.n_lists or None,
        batch_size=body.batch_size or None,
        max_iters=body.max_iters or None,
        tolerance=body.tolerance,
        max_memory=body.max_memory or None,
    )
    status = await engine.call(engine.control.train.remote(body.index_name, cv.key, params, True))
    engine.forget(body.index_name)
    message = "Index trained" if status == "success" else "Training continues in the background"
    return JSON({"status": status, "message": message})


@router.get("/training-status", response_model=TrainingStatusResponse)
async def training_status(request: Request) -> JSON:
    engine = engine_of(request)
    return JSON(await engine.call(engine.control.training_status.remote()))
