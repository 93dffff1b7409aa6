"""Request and answer models of backup and restore (/v1/indexes/backup, /v1/indexes/restore/*:
serve_app.service.backups); the rest are in serve_app.models."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from serve_app.models import IndexKey, IndexName, IndexRequest, Model, StatusResponse

Base64 = Annotated[str, Field(description="base64 (standard alphabet, padded)")]
Hex = Annotated[str, Field(pattern="^([0-9a-f]{2})+$", max_length=1024)]
BackupId = Annotated[str, Field(pattern="^[0-9a-f]{32}$", description="the backup's id")]


class BackupHeader(Model):
    """A backup's plaintext header: what the store's catalog already keeps in the clear."""

    format: str = Field(description='"vaultvec-backup"')
    version: int = Field(description="the format's version: 1")
    backup_id: BackupId
    index_name: IndexName = Field(description="the index backed up")
    salt: Hex
    verifier: Hex
    n_shards: int = Field(ge=1, le=256)
    created: str = Field(description="when the backup began (UTC, ISO 8601)")
    vaultvec_version: str


class RestoreTarget(Model):
    index_name: IndexName = Field(description="the index to restore into: a new name")
    index_key: IndexKey = Field(description="the key of the backed-up index")
    backup: BackupHeader


class RestoreBeginRequest(RestoreTarget):
    config: Base64 = Field(description="the backup's sealed configuration")
    template: Base64 | None = Field(None, description="its sealed trained template, if any")


class RestoreChunkRequest(RestoreTarget):
    shard: int = Field(ge=0, description="the shard whose part this chunk is")
    n: int = Field(ge=0, description="the chunk's number within its shard's part")
    total: int = Field(ge=1, description="the chunks of that part")
    chunk: Base64 = Field(description="the sealed chunk, as the backup holds it")


class RestoreChunkResponse(StatusResponse):
    installed: int | None = Field(
        description="after a part's last chunk: the items the shard now holds; else null"
    )


class RestoreCommitResponse(StatusResponse):
    num_vectors: int


class BackupRequest(IndexRequest):
    pass


class RestoreCommitRequest(RestoreTarget):
    counts: list[int] = Field(
        description="per shard, the items its part installed (each part's last chunk's answer)"
    )
