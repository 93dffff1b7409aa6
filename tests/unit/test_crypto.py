"""Unit tests for actors.storage.crypto: key parsing, derivation, verifier, AAD and AES-GCM sealing."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import constants
from actors.errors import DecryptError, InvalidRequest
from actors.storage import crypto
from actors.storage.crypto import (
    KEY_BYTES,
    SALT_BYTES,
    IndexKeys,
    aad,
    derive_keys,
    new_salt,
    open_sealed,
    parse_index_key,
    seal,
    verify,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
SALT = b"\x07" * SALT_BYTES
AAD = aad("idx", "shard", 3, "vectors", 7)


def _hkdf_reference(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    """RFC 5869 HKDF-SHA256 for one 32-byte block, independent of the cryptography package."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


# -- parse_index_key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["ab" * 32, "AB" * 32, "aB" * 32, "0123456789abcdefABCDEF" * 2 + "00" * 10]
)
def test_parse_index_key_accepts_64_hex(text: str) -> None:
    assert parse_index_key(text) == bytes.fromhex(text)
    assert len(parse_index_key(text)) == KEY_BYTES


@pytest.mark.parametrize(
    "text",
    [
        "a" * 63,
        "a" * 65,
        "",
        "g" * 64,
        "zz" * 32,
        " " + "a" * 63,
        "a" * 62 + " a",
        "a" * 64 + "\n",
        "0x" + "a" * 62,
        "ａ" * 64,  # full-width, not ASCII hex
    ],
)
def test_parse_index_key_rejects_without_echo(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_index_key(text)
    assert info.value.detail == "index_key must be 64 hex characters (32 bytes)"
    if text.strip():
        assert text not in str(info.value)
        assert text.strip()[:8] not in str(info.value)


def test_parse_index_key_rejects_non_string() -> None:
    with pytest.raises(InvalidRequest):
        parse_index_key(b"a" * 64)  # type: ignore[arg-type]


def test_new_salt() -> None:
    a, b = new_salt(), new_salt()
    assert len(a) == len(b) == SALT_BYTES
    assert a != b


# -- derivation and verifier -----------------------------------------------------------------


def test_derive_keys_matches_rfc5869_reference() -> None:
    keys = derive_keys(KEY, "idx", SALT)
    assert keys.data_key == _hkdf_reference(KEY, SALT, b"vaultvec/data/v1")
    verify_key = _hkdf_reference(KEY, SALT, b"vaultvec/verify/v1")
    expected = hmac.new(verify_key, b"vaultvec/verifier/v1|idx", hashlib.sha256).digest()
    assert keys.verifier == expected
    assert len(keys.data_key) == len(keys.verifier) == 32
    assert keys.data_key != verify_key


def test_derive_keys_is_cached_and_deterministic() -> None:
    a = derive_keys(KEY, "idx", SALT)
    assert derive_keys(bytes(KEY), "idx", bytes(SALT)) is a
    crypto._derived.clear()
    b = derive_keys(KEY, "idx", SALT)
    assert b is not a and b == a


def test_derive_cache_is_bounded_and_has_no_raw_keys() -> None:
    crypto._derived.clear()
    for i in range(constants.KEY_CACHE_SIZE + 10):
        derive_keys(i.to_bytes(32, "big"), "idx", SALT)
    assert len(crypto._derived._data) == constants.KEY_CACHE_SIZE
    derive_keys(KEY, "idx", SALT)
    for cache_key in crypto._derived._data:
        assert KEY not in cache_key


def test_derive_keys_rejects_wrong_key_length() -> None:
    with pytest.raises(ValueError):
        derive_keys(b"short", "idx", SALT)


def test_verifier_differs_per_name_salt_and_key() -> None:
    base = derive_keys(KEY, "idx", SALT)
    variants = [
        derive_keys(KEY, "idx2", SALT),
        derive_keys(KEY, "IDX", SALT),
        derive_keys(KEY, "idx", b"\x08" * SALT_BYTES),
        derive_keys(OTHER_KEY, "idx", SALT),
    ]
    for other in variants:
        assert other.verifier != base.verifier
        assert other.data_key != base.verifier
        assert verify(base, base.verifier)
        assert not verify(other, base.verifier)
        assert not verify(base, other.verifier)
    # name changes only the verifier; salt and key change the data key too
    assert variants[0].data_key == base.data_key
    assert variants[2].data_key != base.data_key
    assert variants[3].data_key != base.data_key


def test_verify_rejects_garbage() -> None:
    keys = derive_keys(KEY, "idx", SALT)
    assert not verify(keys, b"")
    assert not verify(keys, keys.verifier[:-1])
    assert not verify(keys, keys.verifier + b"\x00")


def test_index_keys_repr_hides_key_bytes() -> None:
    keys = derive_keys(KEY, "idx", SALT)
    for text in (repr(keys), str(keys), f"{keys}", repr([keys])):
        assert "redacted" in text
        for secret in (keys.data_key, keys.verifier):
            assert secret.hex() not in text
            assert repr(secret) not in text
            assert secret.hex()[:8] not in text
    assert IndexKeys(b"a", b"b").__repr__() == repr(keys)


# -- aad -------------------------------------------------------------------------------------


def test_aad_defaults_and_types() -> None:
    assert aad("idx", "meta") == aad("idx", "meta", -1, "", 0)
    assert isinstance(aad("idx", "meta"), bytes)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("ab", "c"), ("a", "bc")),
        (("a", "b", -1, "c"), ("a", "b", -1, "", 0)),
        (("a", "b", 1, "", 0), ("a", "b", 0, "", 1)),
        (("a|b", "c"), ("a", "b|c")),
        (("", "ab"), ("ab", "")),
    ],
)
def test_aad_is_unambiguous(a: tuple, b: tuple) -> None:
    assert aad(*a) != aad(*b)


@given(
    st.tuples(
        st.text(max_size=8),
        st.text(max_size=8),
        st.integers(-2, 2),
        st.text(max_size=8),
        st.integers(0, 3),
    ),
    st.tuples(
        st.text(max_size=8),
        st.text(max_size=8),
        st.integers(-2, 2),
        st.text(max_size=8),
        st.integers(0, 3),
    ),
)
def test_aad_injective(a: tuple, b: tuple) -> None:
    assert (aad(*a) == aad(*b)) == (a == b)


def test_aad_rejects_out_of_range_ints() -> None:
    with pytest.raises(ValueError):
        aad("idx", "k", version=2**63)


# -- seal / open -----------------------------------------------------------------------------


@pytest.mark.parametrize("plaintext", [b"", b"x", b"hello world" * 100, os.urandom(1 << 16)])
def test_round_trip(plaintext: bytes) -> None:
    key = derive_keys(KEY, "idx", SALT).data_key
    blob = seal(key, plaintext, AAD)
    assert len(blob) == len(plaintext) + 12 + 16
    if len(plaintext) >= 16:  # shorter strings turn up in random bytes by chance
        assert plaintext not in blob
    assert open_sealed(key, blob, AAD) == plaintext


def test_round_trip_accepts_buffers() -> None:
    blob = seal(KEY, memoryview(b"abc"), AAD)  # type: ignore[arg-type]
    assert open_sealed(KEY, memoryview(bytearray(blob)), AAD) == b"abc"  # type: ignore[arg-type]
    assert open_sealed(KEY, bytearray(blob), AAD) == b"abc"  # type: ignore[arg-type]


def test_large_blob_round_trip() -> None:
    plaintext = os.urandom(1 << 20) * 52  # 52 MiB
    blob = seal(KEY, plaintext, AAD)
    assert open_sealed(KEY, blob, AAD) == plaintext


def test_nonces_differ() -> None:
    a, b = seal(KEY, b"same", AAD), seal(KEY, b"same", AAD)
    assert a[:12] != b[:12]
    assert a != b


def test_wrong_key_fails() -> None:
    blob = seal(KEY, b"secret", AAD)
    with pytest.raises(DecryptError):
        open_sealed(OTHER_KEY, blob, AAD)


@pytest.mark.parametrize(
    "wrong",
    [
        {"index_name": "idy"},
        {"kind": "meta"},
        {"shard": 4},
        {"part": "ids"},
        {"version": 8},
    ],
    ids=lambda d: next(iter(d)),
)
def test_wrong_aad_field_fails(wrong: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "index_name": "idx",
        "kind": "shard",
        "shard": 3,
        "part": "vectors",
        "version": 7,
    }
    assert aad(**fields) == AAD
    blob = seal(KEY, b"secret", AAD)
    with pytest.raises(DecryptError):
        open_sealed(KEY, blob, aad(**{**fields, **wrong}))


def test_flipped_byte_fails_everywhere() -> None:
    blob = seal(KEY, b"some plaintext", AAD)
    for i in range(len(blob)):  # nonce, ciphertext and tag
        damaged = bytearray(blob)
        damaged[i] ^= 0x01
        with pytest.raises(DecryptError):
            open_sealed(KEY, bytes(damaged), AAD)


@pytest.mark.parametrize("length", [0, 1, 11, 12, 27, 28, 29, -1])
def test_truncated_blob_fails(length: int) -> None:
    blob = seal(KEY, b"some plaintext", AAD)
    with pytest.raises(DecryptError) as info:
        open_sealed(KEY, blob[:length], AAD)
    assert info.value.detail == "stored data failed authentication"


def test_decrypt_error_with_bad_data_key() -> None:
    blob = seal(KEY, b"x", AAD)
    with pytest.raises(DecryptError):
        open_sealed(b"short", blob, AAD)


def test_cipher_cache_is_bounded() -> None:
    crypto._ciphers.clear()
    for i in range(constants.KEY_CACHE_SIZE + 5):
        seal(i.to_bytes(32, "big"), b"x", AAD)
    assert len(crypto._ciphers._data) == constants.KEY_CACHE_SIZE


@given(st.lists(st.binary(max_size=70), max_size=6), st.binary(max_size=20))
def test_sealing_pieces_is_sealing_them_joined(pieces: list[bytes], associated: bytes) -> None:
    """A snapshot chunk sealed from the pieces it spans opens as if sealed whole."""
    key = bytes(range(32))
    blob = crypto.seal_pieces(key, [memoryview(p) for p in pieces], associated)
    assert len(blob) == len(crypto.seal(key, b"".join(pieces), associated))
    assert crypto.open_sealed(key, bytes(blob), associated) == b"".join(pieces)
    with pytest.raises(DecryptError):
        crypto.open_sealed(key, bytes(blob), associated + b"x")
