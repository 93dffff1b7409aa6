"""/v1/indexes/backup and /v1/indexes/restore/*: one index's encrypted backup as a stream, and
its restore in three steps (serve_app.service.backups)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.responses import StreamingResponse

from serve_app.backup_models import (
    BackupRequest,
    RestoreBeginRequest,
    RestoreChunkRequest,
    RestoreChunkResponse,
    RestoreCommitRequest,
    RestoreCommitResponse,
)
from serve_app.http.bodies import JSON, Route
from serve_app.http.errors_doc import BODY_ERRORS, CONFLICT, ERRORS
from serve_app.http.gate import require_api_key
from serve_app.models import StatusResponse
from serve_app.replica import services
from serve_app.service import backups

MEDIA_TYPE = "application/vnd.vaultvec.backup"

router = APIRouter(
    prefix="/indexes", route_class=Route, dependencies=[Depends(require_api_key)], responses=ERRORS
)


@router.post(
    "/backup",
    response_class=StreamingResponse,
    responses={**BODY_ERRORS, 200: {"content": {MEDIA_TYPE: {}}, "description": "the backup"}},
)
async def backup(body: BackupRequest) -> StreamingResponse:
    """vaultvec: the index's backup, still encrypted, streamed as it is read (the format:
    docs/deployment.md). Writes go on meanwhile; the backup holds every write acknowledged
    before it began."""
    stream = await backups.backup(services(), body)
    return StreamingResponse(stream, media_type=MEDIA_TYPE)


@router.post("/restore/begin", response_model=StatusResponse, responses={**BODY_ERRORS, **CONFLICT})
async def restore_begin(body: RestoreBeginRequest) -> JSON:
    """vaultvec: create ``index_name`` from a backup's header, configuration and template;
    it answers nothing but the restore until /v1/indexes/restore/commit."""
    shards = await backups.restore_begin(services(), body)
    return JSON({"status": "success", "message": f"Restoring into {shards} shards"})


@router.post("/restore/chunk", response_model=RestoreChunkResponse, responses=BODY_ERRORS)
async def restore_chunk(body: RestoreChunkRequest) -> JSON:
    """vaultvec: one chunk of one shard's part of the backup, in order."""
    installed = await backups.restore_chunk(services(), body)
    return JSON({"status": "success", "message": "chunk received", "installed": installed})


@router.post("/restore/commit", response_model=RestoreCommitResponse, responses=BODY_ERRORS)
async def restore_commit(body: RestoreCommitRequest) -> JSON:
    """vaultvec: open the restored index, once every shard holds its part."""
    n = await backups.restore_commit(services(), body)
    return JSON({"status": "success", "message": f"Restored {n} vectors", "num_vectors": n})
