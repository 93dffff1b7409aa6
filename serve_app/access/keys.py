"""The service's API keys: each with a name, which the audit log, the metrics and the quotas use
(the key itself is never logged).

Configured as ``name:key`` entries (``--api-key-file`` lines, or comma-separated in
``VAULTVEC_API_KEY``); an entry without a name is named by a fingerprint of the key,
``key-<first 8 hex digits of its SHA-256>`` — a hash that reveals nothing of a random key (a
weak one can be tested against it offline: name weak keys, or better, do not use them).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from actors.storage.users import PREFIX as USER_KEY_PREFIX

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret, in any log or traceback
        return f"ApiKey({self.name!r})"


def fingerprint(secret: str) -> str:
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def parse(entry: str) -> ApiKey:
    """One configured entry: ``name:key`` or a bare key."""
    name, sep, secret = entry.partition(":")
    if (secret if sep else entry).startswith(USER_KEY_PREFIX):
        raise ValueError(
            f"an API key may not start with {USER_KEY_PREFIX!r}: that prefix names per-index "
            "user keys"
        )
    if not sep:
        return ApiKey(fingerprint(entry), entry.encode())
    if not NAME.fullmatch(name):
        raise ValueError(
            f"API key name {name[:64]!r} is not 1-64 letters, digits, '_', '.' or '-' "
            "(entries are name:key)"
        )
    if not secret:
        raise ValueError(f"API key {name!r} has no key after the colon")
    return ApiKey(name, secret.encode())


def parse_all(entries: Iterable[str]) -> tuple[ApiKey, ...]:
    keys = tuple(parse(e) for e in entries)
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise ValueError("API key names must be distinct")
    if len({k.secret for k in keys}) != len(keys):
        raise ValueError("the same API key is configured twice")
    return keys


def match(given: bytes, keys: Sequence[ApiKey]) -> ApiKey | None:
    """The configured key equal to ``given``, compared against every key in constant time per
    key (the timing tells neither whether nor which key matched)."""
    found = None
    for key in keys:
        if hmac.compare_digest(given, key.secret):
            found = key
    return found
