"""/v1/indexes/*: create, list, describe, delete, train, training-status, rotate_key, the
index's users (/v1/indexes/{name}/users), and /v1/embedding-models. Each route translates HTTP to an operation of the service layer
(serve_app.service.indexes) and its answer back."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header
from starlette.responses import Response

from serve_app.http.bodies import JSON, Route
from serve_app.http.errors_doc import BODY_ERRORS, CONFLICT, ERRORS
from serve_app.http.gate import require_api_key
from serve_app.models import (
    CreateIndexRequest,
    DescribeResponse,
    EmbeddingModelsResponse,
    ErrorResponse,
    IndexName,
    IndexRequest,
    ListIndexesResponse,
    RotateKeyRequest,
    StatusResponse,
    TrainingStatusResponse,
    TrainRequest,
)
from serve_app.replica import services
from serve_app.service import indexes, users
from serve_app.user_models import CreateUserRequest, CreateUserResponse, ListUsersResponse

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


# -- per-index users (serve_app.service.users) ------------------------------------------------
IndexKeyHeader = Annotated[
    str | None,
    Header(
        alias="X-Index-Key",
        pattern="^[0-9a-fA-F]{64}$",
        description="the index key, 64 hex characters",
    ),
]


@router.post("/{index_name}/users", response_model=CreateUserResponse, responses=BODY_ERRORS)
async def create_user(index_name: IndexName, body: CreateUserRequest) -> JSON:
    """Mint a key for a new user of this index with read, write or both; the key is
    returned this once. The user sends it as X-API-Key and needs no index key."""
    return JSON(await users.create(services(), index_name, body.index_key, body.permissions))


@router.get("/{index_name}/users", response_model=ListUsersResponse)
async def list_users(index_name: IndexName, index_key: IndexKeyHeader = None) -> JSON:
    return JSON(await users.list_users(services(), index_name, index_key))


@router.delete("/{index_name}/users/{user_id}", status_code=204, response_class=Response)
async def delete_user(
    index_name: IndexName, user_id: str, index_key: IndexKeyHeader = None
) -> Response:
    """Revoke a user: its key opens nothing from the next request on, at every gateway."""
    await users.delete(services(), index_name, index_key, user_id)
    return Response(status_code=204)


# GET /v1/embedding-models: outside /indexes, as CyborgDB serves it.
models_router = APIRouter(
    route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@models_router.get("/embedding-models", response_model=EmbeddingModelsResponse)
async def embedding_models() -> JSON:
    """The models ``embedding_model`` accepts on create: name, dimension, max_seq_length."""
    return JSON({"models": await indexes.embedding_models(services())})
