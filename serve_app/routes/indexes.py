"""/v1/indexes/*: create, list, describe, delete, train, training-status, rotate_key, and
/v1/embedding-models. Each route translates HTTP to an operation of the service layer
(serve_app.service.indexes) and its answer back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from serve_app.http.bodies import JSON, Route
from serve_app.http.errors_doc import BODY_ERRORS, CONFLICT, ERRORS
from serve_app.http.gate import require_api_key
from serve_app.models import (
    CreateIndexRequest,
    DescribeResponse,
    EmbeddingModelsResponse,
    ErrorResponse,
    IndexRequest,
    ListIndexesResponse,
    RotateKeyRequest,
    StatusResponse,
    TrainingStatusResponse,
    TrainRequest,
)
from serve_app.replica import services
from serve_app.service import indexes

BUSY: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "The index is training or rotating its key"}
}

router = APIRouter(
    prefix="/indexes", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@router.get("/list", response_model=ListIndexesResponse)
async def list_indexes() -> JSON:
    return JSON({"indexes": await indexes.list_indexes(services())})


@router.post("/create", response_model=StatusResponse, responses={**BODY_ERRORS, **CONFLICT})
async def create_index(body: CreateIndexRequest) -> JSON:
    return JSON(await indexes.create(services(), body))


@router.post("/describe", response_model=DescribeResponse, responses=BODY_ERRORS)
async def describe_index(body: IndexRequest) -> JSON:
    return JSON(await indexes.describe(services(), body))


@router.post("/delete", response_model=StatusResponse, responses=BODY_ERRORS)
async def delete_index(body: IndexRequest) -> JSON:
    return JSON(await indexes.delete(services(), body))


@router.post("/train", response_model=StatusResponse, responses={**BODY_ERRORS, **BUSY})
async def train_index(body: TrainRequest) -> JSON:
    return JSON(await indexes.train(services(), body))


@router.post("/rotate_key", response_model=StatusResponse, responses={**BODY_ERRORS, **BUSY})
async def rotate_key(body: RotateKeyRequest) -> JSON:
    """Re-seal every stored blob of the index under new_index_key while it keeps serving;
    once this answers, only the new key opens the index."""
    return JSON(await indexes.rotate_key(services(), body))


@router.get("/training-status", response_model=TrainingStatusResponse)
async def training_status() -> JSON:
    return JSON(await indexes.training_status(services()))


# GET /v1/embedding-models: outside /indexes, as CyborgDB serves it.
models_router = APIRouter(
    route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@models_router.get("/embedding-models", response_model=EmbeddingModelsResponse)
async def embedding_models() -> JSON:
    """The models ``embedding_model`` accepts on create: name, dimension, max_seq_length."""
    return JSON({"models": await indexes.embedding_models(services())})
