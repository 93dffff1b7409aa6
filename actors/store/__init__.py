"""Storage backends. Use :func:`open_store` with a URL from the configuration.

Supported URLs:

* ``file:///abs/path``, ``file://./relative``, ``file://relative`` or a plain path ->
  :class:`~actors.store.local.LocalStore`;
* ``postgresql://...`` (or ``postgres://``) -> PostgreSQL store (not in this build yet).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from actors.store.base import Store, StoreError, key_join, validate_key, validate_prefix
from actors.store.local import LocalStore

__all__ = [
    "LocalStore",
    "Store",
    "StoreError",
    "key_join",
    "open_store",
    "validate_key",
    "validate_prefix",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SUPPORTED = "file:// (or a plain path), postgresql://"


def open_store(url: str) -> Store:
    """Open the store named by ``url`` (see the module docstring for the accepted forms)."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"store URL is empty; supported: {_SUPPORTED}")
    match = _SCHEME.match(url)
    if match is None:
        return LocalStore(Path(url))
    scheme = match.group(1).lower()
    if scheme == "file":
        path = unquote(url[match.end() :])
        if not path:
            raise ValueError("file:// store URL has no path")
        return LocalStore(Path(path))
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        raise StoreError("PostgreSQL store is not installed in this build")
    raise ValueError(f"unsupported store URL scheme {scheme!r}; supported: {_SUPPORTED}")
