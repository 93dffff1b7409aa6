"""Opening an index for a request: with the index key the request carries (an API key's
request), or with a per-index user key (actors.storage.users) whose grant unwraps the index's
data key and says what the user may do there. Every operation on an index's data opens it here,
asking for the right it needs (serve_app.access.rights)."""

from __future__ import annotations

from actors.errors import InvalidRequest, Unauthorized
from actors.storage import users
from serve_app.access import context, rights
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.telemetry import lap, started

_RIGHTS = {"read": Right.READ, "write": Right.WRITE}


async def open_index(engine: Engine, name: str, key: str | None, right: Right) -> CachedView:
    """The index's view, once the request's credentials may do ``right`` there (403 if not,
    401 for a wrong key); the time until now counts as the request's parse stage, the
    unlock as its own."""
    rights.require(right)  # an API key holds every right; a user key at most read and write
    t = lap("parse", started())
    ctx = context.current()
    if ctx is not None and ctx.user is not None:
        cv = await _as_user(engine, name, *ctx.user)
        rights.require(right)
    elif key is None:
        raise InvalidRequest("index_key is required: 64 hex characters (32 bytes)")
    else:
        cv = await engine.view(name, key)
    lap("unlock", t)
    return cv


async def _as_user(engine: Engine, name: str, user_id: str, secret: bytes) -> CachedView:
    """Looked up afresh on every request, so a revoked user is refused by every gateway at
    once; a user key names no other index than the one it was made for (401 there)."""
    context.note(index=name)
    meta = await engine.control.lookup(name)
    grant = next((u for u in meta.users if u.user_id == user_id), None)
    if grant is None:
        raise Unauthorized("invalid API key for this index")
    data_key = users.unwrap(grant, secret, meta.index_id, meta.epoch)
    held = Right(0)
    for r in grant.rights:
        held |= _RIGHTS[r]
    context.note(rights=held)
    return await engine.view_unlocked(meta, data_key)
