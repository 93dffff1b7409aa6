"""Key handling and authenticated encryption for everything vaultvec stores.

* A client supplies a 32-byte *index key* (64 hex characters) with every request.
* Per index, HKDF-SHA256 (salted with a random per-index salt) derives two independent
  subkeys: ``data_key`` (AES-256-GCM key for blobs) and a verify subkey, from which the
  *verifier* — an HMAC over the index name — is computed. The verifier is stored next to the
  index so a wrong key is rejected up front instead of surfacing as a decryption failure.
* Every blob is sealed as ``nonce(12) || AES-GCM ciphertext+tag`` with associated data from
  :func:`aad`, which binds the blob to its index, kind, shard, part and version so a blob moved
  or replayed elsewhere fails authentication.

Derivations and ``AESGCM`` objects are kept in small bounded LRU caches (thread-safe), so the
per-request cost is a SHA-256 of the key plus a dict lookup. Raw key bytes are never used as
cache keys and never appear in reprs or error messages.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from actors import constants
from actors.errors import DecryptError, InvalidRequest

KEY_BYTES = 32
SALT_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
_BLOCK = 16  # AES's block

_INFO_DATA = b"vaultvec/data/v1"
_INFO_VERIFY = b"vaultvec/verify/v1"
_VERIFIER_LABEL = b"vaultvec/verifier/v1|"
_AAD_LABEL = b"vaultvec/aad/v1"
_HEX_KEY = re.compile(r"[0-9A-Fa-f]{64}")

K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A tiny thread-safe bounded LRU cache."""

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
                return value
        value = create()  # outside the lock: a racing duplicate computation is harmless
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def parse_index_key(value: str) -> bytes:
    """Parse a client-supplied index key: exactly 64 hex characters -> 32 bytes.

    The error message never echoes the supplied value.
    """
    if not isinstance(value, str) or _HEX_KEY.fullmatch(value) is None:
        raise InvalidRequest("index_key must be 64 hex characters (32 bytes)")
    return bytes.fromhex(value)


def new_salt() -> bytes:
    """A fresh random per-index salt."""
    return os.urandom(SALT_BYTES)


@dataclass(frozen=True, repr=False)
class IndexKeys:
    """Keys derived for one index. Never shows key bytes in its repr."""

    data_key: bytes
    verifier: bytes

    def __repr__(self) -> str:
        return "IndexKeys(data_key=<redacted>, verifier=<redacted>)"


def _hkdf(index_key: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(index_key)


def _derive(index_key: bytes, index_name: str, salt: bytes) -> IndexKeys:
    data_key = _hkdf(index_key, salt, _INFO_DATA)
    verify_key = _hkdf(index_key, salt, _INFO_VERIFY)
    verifier = hmac.new(
        verify_key, _VERIFIER_LABEL + index_name.encode("utf-8"), hashlib.sha256
    ).digest()
    return IndexKeys(data_key=data_key, verifier=verifier)


_derived: _LRU[tuple[bytes, str, bytes], IndexKeys] = _LRU(constants.KEY_CACHE_SIZE)
_ciphers: _LRU[bytes, AESGCM] = _LRU(constants.KEY_CACHE_SIZE)


def derive_keys(index_key: bytes, index_name: str, salt: bytes) -> IndexKeys:
    """Derive (cached) the data key and verifier of ``index_name`` from the client's key."""
    if len(index_key) != KEY_BYTES:
        raise ValueError(f"index key must be {KEY_BYTES} bytes")
    salt = bytes(salt)
    cache_key = (hashlib.sha256(index_key).digest(), index_name, salt)
    return _derived.get_or_create(cache_key, lambda: _derive(bytes(index_key), index_name, salt))


def fingerprint(key: bytes) -> bytes:
    """A digest that names a key in an in-memory cache without holding the key itself."""
    return hashlib.sha256(bytes(key)).digest()


def verify(keys: IndexKeys, stored_verifier: bytes) -> bool:
    """Constant-time check that ``keys`` match the verifier stored with the index."""
    return hmac.compare_digest(keys.verifier, bytes(stored_verifier))


def aad(index_name: str, kind: str, shard: int = -1, part: str = "", version: int = 0) -> bytes:
    """Associated data binding a blob to its index, kind, shard, part and version.

    Encoding: a version label, then each string as a 4-byte big-endian length + UTF-8 bytes and
    each integer as a signed 8-byte big-endian value, in a fixed order — unambiguous.
    """
    out = bytearray(_AAD_LABEL)
    try:
        for text in (index_name, kind):
            raw = text.encode("utf-8")
            out += struct.pack(">I", len(raw)) + raw
        out += struct.pack(">q", shard)
        raw = part.encode("utf-8")
        out += struct.pack(">I", len(raw)) + raw
        out += struct.pack(">q", version)
    except struct.error as exc:
        raise ValueError(f"aad field out of range: {exc}") from None
    return bytes(out)


def _cipher(data_key: bytes) -> AESGCM:
    data_key = bytes(data_key)
    return _ciphers.get_or_create(hashlib.sha256(data_key).digest(), lambda: AESGCM(data_key))


def seal(data_key: bytes, plaintext: bytes | bytearray | memoryview, associated: bytes) -> bytes:
    """Encrypt: ``12-byte random nonce || AES-256-GCM ciphertext || 16-byte tag``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + _cipher(data_key).encrypt(nonce, plaintext, associated)


def seal_pieces(
    data_key: bytes, pieces: Sequence[bytes | bytearray | memoryview], associated: bytes
) -> bytearray:
    """:func:`seal` of the pieces' concatenation, encrypted piece by piece into one buffer:
    the same blob, without the pieces joined first or the ciphertext copied after the nonce."""
    total = sum(len(p) for p in pieces)
    nonce = os.urandom(NONCE_BYTES)
    out = bytearray(NONCE_BYTES + total + TAG_BYTES)
    out[:NONCE_BYTES] = nonce
    encryptor = Cipher(algorithms.AES(bytes(data_key)), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(associated)
    at = NONCE_BYTES
    with memoryview(out) as view:
        for piece in pieces:
            if len(piece):  # update_into wants a block's room less one byte beyond the piece:
                end = at + len(piece) + _BLOCK - 1  # within the tag's place, after the last
                at += encryptor.update_into(piece, view[at:end])
        encryptor.finalize()
        view[at:] = encryptor.tag
    return out


def open_sealed(data_key: bytes, blob: bytes, associated: bytes) -> bytes:
    """Decrypt a blob made by :func:`seal`; raise :class:`DecryptError` on any failure."""
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise DecryptError()
    view = memoryview(blob)
    try:
        return _cipher(data_key).decrypt(view[:NONCE_BYTES], view[NONCE_BYTES:], associated)
    except (InvalidTag, ValueError, TypeError, OverflowError):
        raise DecryptError() from None
