"""The storage contract every vaultvec backend implements.

A store holds two kinds of objects under '/'-separated keys:

* **blobs** — whole values replaced atomically by :meth:`Store.put`;
* **logs** — append-only sequences of records (:meth:`Store.append` / :meth:`Store.read_log`).

Blobs and logs live in separate namespaces (the same key may name both); ``delete``,
``delete_prefix`` and ``list`` cover both. Stores only ever see ciphertext: callers seal data
with :mod:`actors.storage.crypto` before handing it over. Writes are durable when they return.
"""

from __future__ import annotations

import builtins
import re
from typing import Protocol, runtime_checkable

_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,255}")
_PARTIAL_SEGMENT = re.compile(r"[A-Za-z0-9._-]{0,255}")


class StoreError(Exception):
    """An I/O or integrity problem in a store (message names the key, never the contents)."""


def _bad(kind: str, value: object, why: str) -> ValueError:
    return ValueError(
        f"invalid store {kind} {value!r}: {why}; keys are '/'-separated segments of "
        "[A-Za-z0-9._-] (no empty, '.' or '..' segments, no leading '/')"
    )


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid store key, else raise ``ValueError``."""
    if not isinstance(key, str):
        raise _bad("key", key, "not a string")
    for segment in key.split("/"):
        if _SEGMENT.fullmatch(segment) is None:
            raise _bad("key", key, "bad or empty segment")
        if segment in (".", ".."):
            raise _bad("key", key, "'.' and '..' segments are not allowed")
    return key


def validate_prefix(prefix: str) -> str:
    """Validate a listing prefix: complete key segments, then an optional partial segment.

    ``""`` (everything), ``"idx/"`` and ``"idx/shard-"`` are all valid prefixes.
    """
    if not isinstance(prefix, str):
        raise _bad("prefix", prefix, "not a string")
    if prefix == "":
        return prefix
    *complete, partial = prefix.split("/")
    if complete:
        try:
            validate_key("/".join(complete))
        except ValueError:
            raise _bad("prefix", prefix, "bad or empty segment") from None
    if _PARTIAL_SEGMENT.fullmatch(partial) is None:
        raise _bad("prefix", prefix, "bad characters")
    return prefix


def key_join(*parts: str) -> str:
    """Join key parts with '/' and validate the result: ``key_join("idx", "shard-0", "wal")``."""
    return validate_key("/".join(parts))


@runtime_checkable
class Store(Protocol):
    """Blob + append-only-log storage. Implementations must be safe to use from many threads."""

    def get(self, key: str) -> bytes | None:
        """The blob stored under ``key``, or ``None``."""
        ...

    def put(self, key: str, data: bytes | bytearray) -> None:
        """Store a blob atomically (readers see old or new, never partial) and durably."""
        ...

    def delete(self, key: str) -> None:
        """Remove the blob and the log named ``key``; a missing key is not an error."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Remove every blob and log whose key starts with ``prefix``; return how many."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Sorted, de-duplicated keys of blobs and logs starting with ``prefix``."""
        ...

    def append(self, key: str, record: bytes) -> None:
        """Append one record to the log ``key``, durably, before returning."""
        ...

    def read_log(self, key: str) -> builtins.list[bytes]:
        """All complete records of the log ``key`` in append order (``[]`` if none).

        A torn final record (crash mid-append) is dropped silently; damage before the tail
        raises :class:`StoreError`.
        """
        ...

    def close(self) -> None:
        """Release resources (open files, connections)."""
        ...
