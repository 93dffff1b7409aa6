"""Who sends the request being served and what it touches, noted once per request.

The outermost middleware (serve_app.audit.Audit) opens a :class:`RequestContext` for each HTTP
request (and the Ray transport's calls open one each); the API-key gate names the key, the
gateway engine the index it unlocks, the routes how many items the request carries. The audit
log and the per-key metrics read it when the request ends.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class User:
    """A per-index user key the gate verified (actors.storage.users): its grant, the key that
    opens the grant, and the catalog entry of its index as looked up for this request."""

    user_id: str
    kek: bytes = field(repr=False)
    grant: Any = field(repr=False)  # actors.types.UserGrant
    meta: Any = field(repr=False)  # actors.types.IndexMeta


@dataclass
class RequestContext:
    client: str  # the client's address (serve_app.audit.client_address)
    key: str | None = None  # the API key's name (serve_app.access.keys), once the gate matched one
    limits: Any = None  # that key's serve_app.settings.Limits
    rights: Any = None  # what it may do (serve_app.access.rights.Right); None: everything
    user: User | None = None  # a per-index user key's, once the gate verified it
    index: str | None = None  # the index the request unlocked
    items: int | None = None  # items, queries or ids it carried or answered


_CONTEXT: ContextVar[RequestContext | None] = ContextVar("vaultvec_request", default=None)


def current() -> RequestContext | None:
    return _CONTEXT.get()


def open_(context: RequestContext) -> object:
    """Make ``context`` this task's; returns the token :func:`close` takes."""
    return _CONTEXT.set(context)


def close(token: object) -> None:
    _CONTEXT.reset(token)  # type: ignore[arg-type]


def note(
    *,
    key: str | None = None,
    limits: Any = None,
    index: str | None = None,
    items: int | None = None,
    rights: Any = None,
    user: User | None = None,
) -> None:
    """Record what is known now about the request this task serves (no-op outside one)."""
    context = _CONTEXT.get()
    if context is None:
        return
    if key is not None:
        context.key = key
    if limits is not None:
        context.limits = limits
    if index is not None:
        context.index = index
    if items is not None:
        context.items = items
    if rights is not None:
        context.rights = rights
    if user is not None:
        context.user = user
