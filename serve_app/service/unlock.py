"""Opening an index for a request: with the index key the request carries (an API key's
request), or with a per-index user key (actors.storage.users) whose grant unwraps the index's
data key and says what the user may do there. Every operation on an index's data opens it here,
asking for the right it needs (serve_app.access.rights)."""

from __future__ import annotations

from actors.errors import IndexRestoring, InvalidRequest, Unauthorized
from actors.storage import users
from serve_app.access import context, rights
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.telemetry import lap, started


async def open_index(
    engine: Engine, name: str, key: str | None, right: Right, *, restore: bool = False
) -> CachedView:
    """The index's view, once the request's credentials may do ``right`` there (403 if not,
    401 for a wrong key); the time until now counts as the request's parse stage, the
    unlock as its own. An index a backup is being restored into opens only for the restore
    and its deletion (``restore``); 409 for everything else."""
    rights.require(right)  # as the gate noted: an API key all rights, a user key its grant's
    t = lap("parse", started())
    ctx = context.current()
    if ctx is not None and ctx.user is not None:
        cv = await _as_user(engine, name, ctx.user)
    elif key is None:
        raise InvalidRequest("index_key is required: 64 hex characters (32 bytes)")
    else:
        cv = await engine.view(name, key)
    if cv.view.meta.restoring and not restore:
        fresh = await engine.control.lookup(name)  # the restore may have ended since
        if fresh.restoring:
            raise IndexRestoring(
                f"index {name!r} is being restored from a backup; it answers once the restore "
                "commits (or delete it)"
            )
        engine.forget(name)
        return await open_index(engine, name, key, right)
    lap("unlock", t)
    return cv


async def _as_user(engine: Engine, name: str, user: context.User) -> CachedView:
    """The index of a user the gate verified, with the catalog entry it looked up for this
    request; a user key names no other index than the one it was made for (401 there, whether
    or not that index exists)."""
    meta = user.meta
    if name != meta.name:
        raise Unauthorized("invalid API key for this index")
    context.note(index=name)
    data_key = users.open_wrapped(user.grant, user.kek, meta.index_id, meta.epoch)
    return await engine.view_unlocked(meta, data_key)
