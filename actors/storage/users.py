"""Per-index user keys (CyborgDB's RBAC users): a key scoped to one index with read, write or
both, that opens the index without its index key.

A user key is ``cdbk_<user id>_<secret>``: 8 random bytes of id (hex) and 32 of secret
(base64url). It is returned once and never stored. The catalog entry keeps per user a
:class:`~actors.types.UserGrant`:

- ``salt`` and ``verifier``: the secret's key-encryption key (KEK, HKDF of the secret under the
  salt, bound to the index id and user id) is checked against the verifier in constant time;
- ``wrapped``: the index's data key sealed under the KEK (AES-GCM; the associated data binds
  the index id, the user id, the key epoch and the rights, so a grant cannot be moved to
  another index or user, replayed from an earlier key, or widened by editing the entry);
- ``escrow``: the KEK sealed under the index's data key, so that a key rotation (which knows
  the old and the new data key, never the users' secrets) can wrap the new data key for every
  user: the holder of the index key can already read everything the KEK unwraps.

Nothing in the store opens the index without a user's secret or the index key.
"""

from __future__ import annotations

import base64
import hmac
import logging
import re
import secrets
from collections.abc import Iterable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from actors.errors import Unauthorized
from actors.storage.crypto import KEY_BYTES, aad, new_salt, open_sealed, seal
from actors.types import IndexMeta, UserGrant

log = logging.getLogger("vaultvec.users")

PREFIX = "cdbk_"
RIGHTS = ("read", "write")
_USER_KEY = re.compile(r"cdbk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_INFO_KEK = b"vaultvec/user-kek/v1|"
_INFO_VERIFY = b"vaultvec/user-verify/v1|"


def is_user_key(given: str | bytes) -> bool:
    return (given.decode("latin-1") if isinstance(given, bytes) else given).startswith(PREFIX)


def parse(given: str) -> tuple[str, bytes]:
    """(user id, secret) of a user key; Unauthorized if it is not one."""
    m = _USER_KEY.fullmatch(given)
    if m is None:
        raise Unauthorized("invalid API key")
    return m.group(1), base64.urlsafe_b64decode(m.group(2) + "=")


def _hkdf(secret: bytes, salt: bytes, info: bytes) -> bytes:
    kdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info)
    return kdf.derive(secret)


def _kek(secret: bytes, salt: bytes, index_id: str, user_id: str) -> tuple[bytes, bytes]:
    """(KEK, verifier) of a user's secret."""
    bound = f"{index_id}|{user_id}".encode()
    return _hkdf(secret, salt, _INFO_KEK + bound), _hkdf(secret, salt, _INFO_VERIFY + bound)


def _aad(index_id: str, user_id: str, epoch: int, rights: Iterable[str], what: str) -> bytes:
    return aad(
        index_id, f"user-{what}", part=f"{user_id}|{','.join(sorted(rights))}", version=epoch
    )


def normalise_rights(rights: Iterable[str]) -> tuple[str, ...]:
    given = tuple(rights)
    wanted = tuple(sorted(set(given)))
    if not wanted or any(r not in RIGHTS for r in wanted) or len(wanted) != len(given):
        raise ValueError(
            f"permissions must be a non-empty list of distinct values from {list(RIGHTS)}, "
            f"got {list(given)!r}"
        )
    return wanted


def mint(
    index_id: str, epoch: int, data_key: bytes, rights: Iterable[str]
) -> tuple[str, UserGrant]:
    """A new user of the index: (the key to hand out, once; the grant to store)."""
    user_id = secrets.token_hex(8)
    secret = secrets.token_bytes(32)
    salt = new_salt()
    rights = normalise_rights(rights)
    kek, verifier = _kek(secret, salt, index_id, user_id)
    grant = UserGrant(
        user_id=user_id,
        rights=rights,
        salt=salt,
        verifier=verifier,
        wrapped=seal(kek, data_key, _aad(index_id, user_id, epoch, rights, "wrap")),
        escrow=seal(data_key, kek, _aad(index_id, user_id, epoch, rights, "escrow")),
    )
    text = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    return f"{PREFIX}{user_id}_{text}", grant


def verify(grant: UserGrant, secret: bytes, index_id: str) -> bytes | None:
    """The grant's key-encryption key if ``secret`` is this grant's (checked in constant time),
    else None: the check a gateway makes before it reads a user's request."""
    kek, verifier = _kek(secret, grant.salt, index_id, grant.user_id)
    return kek if hmac.compare_digest(verifier, grant.verifier) else None


def unwrap(grant: UserGrant, secret: bytes, index_id: str, epoch: int) -> bytes:
    """The index's data key, if ``secret`` is this grant's; Unauthorized otherwise."""
    kek = verify(grant, secret, index_id)
    if kek is None:
        raise Unauthorized("invalid API key")
    return open_wrapped(grant, kek, index_id, epoch)


def open_wrapped(grant: UserGrant, kek: bytes, index_id: str, epoch: int) -> bytes:
    """The index's data key from the grant, with the KEK :func:`verify` gave."""
    try:
        return open_sealed(
            kek, grant.wrapped, _aad(index_id, grant.user_id, epoch, grant.rights, "wrap")
        )
    except Exception:
        raise Unauthorized("invalid API key") from None


def rewrap_all(
    meta: IndexMeta, data_key: bytes, new_epoch: int, new_key: bytes
) -> tuple[UserGrant, ...]:
    """Every user's grant for the index's next data key. A grant whose escrow does not open
    (altered in the store) is dropped and logged, not allowed to stop the rotation."""
    out = []
    for grant in meta.users:
        try:
            out.append(rewrap(grant, meta.index_id, meta.epoch, data_key, new_epoch, new_key))
        except Exception:
            log.warning(
                "dropped user %s of index id %s: its grant does not open",
                grant.user_id,
                meta.index_id,
            )
    return tuple(out)


def rewrap(
    grant: UserGrant, index_id: str, epoch: int, data_key: bytes, new_epoch: int, new_key: bytes
) -> UserGrant:
    """The grant for the index's next data key (a key rotation), through its escrow."""
    kek = open_sealed(
        data_key, grant.escrow, _aad(index_id, grant.user_id, epoch, grant.rights, "escrow")
    )
    uid, rights = grant.user_id, grant.rights
    return UserGrant(
        user_id=uid,
        rights=rights,
        salt=grant.salt,
        verifier=grant.verifier,
        wrapped=seal(kek, new_key, _aad(index_id, uid, new_epoch, rights, "wrap")),
        escrow=seal(new_key, kek, _aad(index_id, uid, new_epoch, rights, "escrow")),
    )
