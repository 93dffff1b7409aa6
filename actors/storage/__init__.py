"""Storage backends. Use :func:`open_store` with a URL from the configuration.

Supported URLs:

* ``file:///abs/path``, ``file://./relative``, ``file://relative`` or a plain path ->
  :class:`~actors.storage.local.LocalStore`;
* ``postgresql://user:password@host:port/dbname?...`` (or ``postgres://``) ->
  :class:`~actors.storage.postgres.PostgresStore` (needs the ``postgres`` extra: psycopg 3 and
  psycopg-pool; its URL parameters are described in :mod:`actors.storage.postgres`).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from actors.storage.base import Store, StoreError, key_join, validate_key, validate_prefix
from actors.storage.local import LocalStore

__all__ = [
    "LocalStore",
    "Store",
    "StoreError",
    "key_join",
    "open_store",
    "redact_url",
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
        try:
            from actors.storage.postgres import PostgresStore
        except ImportError as exc:
            raise StoreError(
                f"the PostgreSQL store needs psycopg 3 and psycopg-pool ({exc.name or exc} is "
                'missing): pip install "vaultvec[postgres]"'
            ) from None
        return PostgresStore(url)
    raise ValueError(f"unsupported store URL scheme {scheme!r}; supported: {_SUPPORTED}")


def redact_url(url: str) -> str:
    """``url`` fit for logs and banners: a password (in the authority or a ``password=``
    parameter) replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs])
    return urlunsplit(parts._replace(netloc=netloc, query=query))
