"""The one place that decides who may do what: every operation of the service layer asks
:func:`require` for the right it needs, against the request's context (serve_app.access.context).

An API key holds every right (what an index's data it may reach is still decided by the index key
the request carries); a user key (CyborgDB's per-index users) will hold read, write or both, for
one index. A request without the right is a 403.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Flag, auto

from actors.errors import Forbidden
from serve_app.access import context


class Right(Flag):
    READ = auto()  # query, get, list, count, describe
    WRITE = auto()  # upsert, delete items
    MANAGE = auto()  # create, delete, train an index; rotate its key


ALL = Right.READ | Right.WRITE | Right.MANAGE
OPEN = Right(0)  # no right beyond opening the index: any of its users may (describe)
_NAMED = {"read": Right.READ, "write": Right.WRITE}


def of(names: Iterable[str]) -> Right:
    """The rights a per-index user's grant names (``read``, ``write``)."""
    held = Right(0)
    for name in names:
        held |= _NAMED[name]
    return held


def require(right: Right) -> None:
    """Raise :class:`Forbidden` unless the request's credentials hold ``right`` (outside a
    request, nothing is refused: tests and in-process callers)."""
    ctx = context.current()
    if ctx is None or ctx.rights is None or right in ctx.rights:
        return
    who = f"API key {ctx.key!r}" if ctx.key else "these credentials"
    raise Forbidden(f"{who} may not {(right.name or str(right)).lower()} here")
