"""Partial updates of items in place: MongoDB's ``$set`` and ``$unset`` on metadata fields (dot
paths), and optionally new contents; the vector stays as stored.

A shard applies an update as one upsert of the items it changes (their vectors read back from
the partition), so it is written to the WAL before it is applied and is atomic per request: every
new metadata is computed first, and an item the update cannot apply to refuses the whole request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from actors.errors import InvalidRequest

OPERATORS = ("$set", "$unset")


@dataclass(frozen=True)
class Update:
    set: tuple[tuple[str, Any], ...] = ()  # (dot path, value)
    unset: tuple[str, ...] = ()
    contents: str | None = None
    set_contents: bool = False  # contents given: replace them
    max_metadata_bytes: int = 0  # the merged metadata's limit as JSON (0: none)


def _path(path: Any) -> tuple[str, ...]:
    if not isinstance(path, str) or not path:
        raise InvalidRequest(f"update: a field path must be a non-empty string, not {path!r}")
    parts = tuple(path.split("."))
    if any(not p or p.startswith("$") for p in parts):
        raise InvalidRequest(f"update: {path!r} is not a field path (a.b.c, no $ names)")
    return parts


def parse_update(doc: Any, contents: str | None, set_contents: bool, max_bytes: int) -> Update:
    """The request's update document as an :class:`Update`; 422 for a malformed one."""
    if not isinstance(doc, dict):
        raise InvalidRequest('update must be an object: {"$set": {...}, "$unset": [...]}')
    unknown = set(doc) - set(OPERATORS)
    if unknown:
        raise InvalidRequest(f"update: unknown operator {sorted(unknown)[0]!r}; use $set, $unset")
    set_doc = doc.get("$set", {})
    if not isinstance(set_doc, dict):
        raise InvalidRequest("update: $set must be an object of field paths and values")
    unset_doc = doc.get("$unset", [])
    if isinstance(unset_doc, dict):
        unset_doc = list(unset_doc)
    if not isinstance(unset_doc, list):
        raise InvalidRequest("update: $unset must be a list of field paths (or an object)")
    sets = tuple((p, v) for p, v in set_doc.items())
    paths = [_path(p) for p, _ in sets] + [_path(p) for p in unset_doc]
    for i, a in enumerate(paths):
        for b in paths[i + 1 :]:
            n = min(len(a), len(b))
            if a[:n] == b[:n]:
                raise InvalidRequest(
                    f"update: {'.'.join(a)!r} and {'.'.join(b)!r} conflict (one contains the other)"
                )
    if not paths and not set_contents:
        raise InvalidRequest("update changes nothing: give $set, $unset or contents")
    try:
        orjson.dumps(set_doc)
    except TypeError:
        raise InvalidRequest("update: $set values must be JSON") from None
    return Update(sets, tuple(unset_doc), contents, set_contents, max_bytes)


def apply(metadata: dict[str, Any] | None, update: Update, item_id: str) -> dict[str, Any]:
    """``metadata`` with ``update`` applied (a new dict; the argument is not changed)."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(metadata)) if metadata else {}
    for path, value in update.set:
        parts = path.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                at = ".".join(parts[: i + 1])
                raise InvalidRequest(
                    f"update: item {item_id!r}: cannot set {path!r}, {at!r} is not an object"
                )
            node = nxt
        node[parts[-1]] = value
    for path in update.unset:
        parts = path.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                break
            node = child
        else:
            node.pop(parts[-1], None)
    return out
