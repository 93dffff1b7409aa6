"""Cursors of list_ids and query_metadata: ``limit`` asks for one page, ``next_cursor`` names
where the next one starts.

A cursor is the last id of its page, sealed (AES-256-GCM) with the index's data key and bound
to the index (name and id) and to the scan (its route and filter): it reveals nothing of the
index, cannot be forged, and opens for no other index, filter or key epoch. Pages go in id
order (actors.engine.idorder), so a scan returns every item present for all of it exactly
once, whatever is written meanwhile. A cursor keeps no state on the server and does not expire,
except when the index key is rotated (the new data key does not open it).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

from actors.errors import DecryptError, InvalidRequest
from actors.storage.crypto import aad, open_sealed, seal
from serve_app.gateway.engine import CachedView

_KIND = "cursor"


def _bound(cv: CachedView, route: str, filters: dict[str, Any] | None) -> bytes:
    scan = hashlib.sha256(orjson.dumps([route, filters or None], option=orjson.OPT_SORT_KEYS))
    meta = cv.view.meta
    return aad(meta.name, _KIND, part=f"{meta.index_id}/{scan.hexdigest()}")


def seal_cursor(cv: CachedView, route: str, filters: dict[str, Any] | None, last: str) -> str:
    """The cursor of the page ending at id ``last``: URL-safe base64, no padding."""
    blob = seal(cv.key, last.encode("utf-8"), _bound(cv, route, filters))
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")


def open_cursor(cv: CachedView, route: str, filters: dict[str, Any] | None, cursor: str) -> str:
    """The last id of the page ``cursor`` ends; a 422 for a cursor of another scan, index or
    key, or not a cursor at all."""
    try:
        blob = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return open_sealed(cv.key, blob, _bound(cv, route, filters)).decode("utf-8")
    except (ValueError, DecryptError):
        raise InvalidRequest(
            f"{route}: cursor is not one this index gave for this request (another index, "
            "filter or key, or changed); start the scan again without a cursor"
        ) from None
