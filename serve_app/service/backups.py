"""Backup and restore of one index, still encrypted (docs/deployment.md).

A backup is a stream of frames (actors.storage.backup_format):

- ``H`` the header (JSON, plaintext): format, version, backup id, the index's name, the salt
  and verifier of its key (what the store's catalog keeps in the clear), shard count, time;
- ``C`` the index's configuration and ``T`` its trained template (if any), each sealed with
  the index's data key, bound to the backup;
- ``S`` a chunk of one shard's state: shard, chunk number, chunk count (3 × 4 bytes), then the
  chunk sealed by the shard itself (actors.engine.shard_backup);
- ``E`` the end (JSON: chunks per shard), or ``X`` an error that cut the backup short.

Every shard takes its state when the backup starts, all at once, each at one instant, while
writes go on: the backup holds every write acknowledged before it began. Nothing in it is
plaintext but the header. A restore needs the index key: it checks it against the header,
opens the configuration, creates the new index (any name, any store) under a fresh salt,
and sends each shard its part, which the shard opens and seals again under the new index's
keys. Until the restore commits, the new index answers nothing else (409).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import numpy as np
import orjson

from actors.control.client import cause
from actors.control.options import new_index_id
from actors.errors import DecryptError, InvalidRequest, Unauthorized, VaultvecError
from actors.storage.backup_format import (
    CHUNK,
    CHUNK_HEAD,
    CONFIG,
    END,
    ERROR,
    FORMAT,
    HEADER,
    MAGIC,
    TEMPLATE,
    VERSION,
    frame,
)
from actors.storage.crypto import aad, derive_keys, new_salt, open_sealed, parse_index_key, seal
from actors.storage.crypto import verify as verify_key
from actors.types import BackupSource, IndexConfig, IndexMeta
from serve_app import __version__
from serve_app.access import context, rights
from serve_app.access.rights import Right
from serve_app.backup_models import (
    BackupHeader,
    BackupRequest,
    RestoreBeginRequest,
    RestoreChunkRequest,
    RestoreCommitRequest,
    RestoreTarget,
)
from serve_app.gateway.engine import CachedView
from serve_app.service.deps import Services
from serve_app.service.unlock import open_index


def _bound(name: str, backup_id: str, what: str) -> bytes:
    return aad(name, "backup", part=f"{backup_id}/{what}")


# -- backup ---------------------------------------------------------------------------------
async def backup(svc: Services, body: BackupRequest) -> AsyncIterator[bytes]:
    """The backup of ``body``'s index as a stream of frames (the shards' states are taken
    before this returns)."""
    engine = svc.engine
    cv = await open_index(engine, body.index_name, body.index_key, Right.MANAGE)
    cv = await engine.reload(cv)  # the config as the control plane has it now, not as cached
    stats = await engine.shard_stats(cv)
    cfg, meta = cv.config, cv.view.meta
    backup_id = secrets.token_hex(16)
    template = await engine.control.template(meta.name, cv.key) if cfg.is_trained else None
    parts = [shard.backup(cv.key, backup_id) for shard in cv.shards]  # each takes its state now
    header = BackupHeader(
        format=FORMAT,
        version=VERSION,
        backup_id=backup_id,
        index_name=meta.name,
        salt=meta.salt.hex(),
        verifier=meta.verifier.hex(),
        n_shards=len(cv.shards),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        vaultvec_version=__version__,
    )
    context.note(items=sum(st.count for st in stats))
    return _stream(cv, header, template, parts)


async def _stream(
    cv: CachedView, header: BackupHeader, template: np.ndarray | None, parts: list[Any]
) -> AsyncIterator[bytes]:
    name, bid = header.index_name, header.backup_id
    yield MAGIC + frame(HEADER, orjson.dumps(header.model_dump()))
    config = orjson.dumps(cv.config.to_json())
    yield frame(CONFIG, seal(cv.key, config, _bound(name, bid, "config")))
    if template is not None:
        yield frame(TEMPLATE, seal(cv.key, template.tobytes(), _bound(name, bid, "template")))
    counts = []
    try:
        for s, part in enumerate(parts):
            n = 0
            async for ref in part:
                total, version, blob = await ref
                if version not in (cv.config.version, -1):  # -1: an empty shard
                    raise InvalidRequest("the index was trained during the backup: run it again")
                yield frame(CHUNK, CHUNK_HEAD.pack(s, n, total) + blob)
                n += 1
            counts.append(n)
    except Exception as exc:  # the response has begun: the error goes into the stream
        failure = cause(exc)
        detail = failure.detail if isinstance(failure, VaultvecError) else "internal error"
        yield frame(ERROR, orjson.dumps({"detail": detail}))
        return
    yield frame(END, orjson.dumps({"chunks": counts}))


# -- restore --------------------------------------------------------------------------------
def _source(body: RestoreTarget) -> BackupSource:
    """The backed-up index's data key from the request's key (401 if it is not that index's)."""
    h = body.backup
    if h.format != FORMAT or h.version != VERSION:
        raise InvalidRequest(f"not a backup this vaultvec reads ({h.format} {h.version})")
    keys = derive_keys(parse_index_key(body.index_key), h.index_name, bytes.fromhex(h.salt))
    if not verify_key(keys, bytes.fromhex(h.verifier)):
        raise Unauthorized("invalid index_key for this backup")
    return BackupSource(h.index_name, h.backup_id, keys.data_key)


def _open(source: BackupSource, what: str, data: str) -> bytes:
    try:
        blob = base64.b64decode(data, validate=True)
        return open_sealed(source.data_key, blob, _bound(source.index_name, source.backup_id, what))
    except (ValueError, DecryptError):
        raise InvalidRequest(f"the backup's {what} does not open: damaged or altered") from None


async def restore_begin(svc: Services, body: RestoreBeginRequest) -> int:
    """Create ``body.index_name`` from the backup's configuration and template, not yet
    answering; returns its shard count."""
    rights.require(Right.MANAGE)
    source = _source(body)
    old = IndexConfig.from_json(orjson.loads(_open(source, "config", body.config)))
    template = None
    if old.is_trained:
        if body.template is None:
            raise InvalidRequest("the backup's index is trained but the request has no template")
        template = np.frombuffer(_open(source, "template", body.template), dtype=np.uint8)
    if old.n_shards != body.backup.n_shards:
        raise InvalidRequest("the backup's header and configuration disagree")
    ctx = context.current()
    salt = new_salt()
    keys = derive_keys(parse_index_key(body.index_key), body.index_name, salt)
    meta = IndexMeta(
        body.index_name,
        new_index_id(),
        salt,
        keys.verifier,
        owner=(ctx.key or "") if ctx is not None else "",
        restoring=source.backup_id,
    )
    cfg = old.evolve(name=body.index_name, index_id=meta.index_id, key_epoch=0)
    limit = ctx.limits.max_indexes_per_key if ctx is not None and ctx.limits else 0
    await svc.engine.control.create_index(meta, keys.data_key, cfg, limit, template)
    svc.engine.forget(body.index_name)
    return cfg.n_shards


async def _restoring(svc: Services, body: RestoreTarget) -> tuple[CachedView, BackupSource]:
    source = _source(body)
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.MANAGE, restore=True)
    if cv.view.meta.restoring != source.backup_id:
        raise InvalidRequest(
            f"index {body.index_name!r} is not being restored from backup {source.backup_id}"
        )
    return cv, source


async def restore_chunk(svc: Services, body: RestoreChunkRequest) -> int | None:
    cv, source = await _restoring(svc, body)
    if body.shard >= len(cv.shards) or body.n >= body.total:
        raise InvalidRequest(f"no chunk {body.n} of {body.total} of shard {body.shard} here")
    try:
        chunk = base64.b64decode(body.chunk, validate=True)
    except ValueError:
        raise InvalidRequest("chunk is not base64") from None
    [installed] = await svc.engine.fan_out(
        cv,
        [(body.shard, lambda c: c.restore_chunk(cv.key, source, body.n, body.total, chunk))],
        idempotent=False,
    )
    return installed


async def restore_commit(svc: Services, body: RestoreCommitRequest) -> int:
    """Open the restored index once every shard holds its part; returns its items."""
    engine = svc.engine
    cv, source = await _restoring(svc, body)
    done = await engine.all_shards(cv, lambda c: c.restored())
    missing = [s for s, d in enumerate(done) if d is None or d[0] != source.backup_id]
    if missing:
        raise InvalidRequest(
            f"shards {missing} did not install their part of the backup (or lost it in a "
            "restart): send every shard's part, then commit; or delete the index and restore again"
        )
    counts = [d[1] for d in done if d is not None]
    stats = await engine.shard_stats(cv)
    if [st.count for st in stats] != counts or counts != body.counts:
        raise InvalidRequest(
            f"the shards hold {[st.count for st in stats]} items, not the {body.counts} their "
            "parts installed: delete the index and restore again"
        )
    await engine.control.restored(body.index_name, cv.key, source.backup_id)
    engine.forget(body.index_name)
    return sum(body.counts)
