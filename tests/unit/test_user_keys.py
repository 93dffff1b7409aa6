"""Per-index user keys (actors.storage.users): a key opens its own index's data key and nothing
else; the stored grant holds nothing that opens it without the user's secret."""

from __future__ import annotations

import dataclasses
import secrets

import pytest

from actors.errors import Unauthorized
from actors.storage import users
from actors.types import IndexMeta, UserGrant

DATA_KEY = secrets.token_bytes(32)


def test_a_user_key_unwraps_its_index_data_key() -> None:
    api_key, grant = users.mint("ix1", 0, DATA_KEY, ["write", "read"])
    assert api_key.startswith("cdbk_") and grant.rights == ("read", "write")
    user_id, secret = users.parse(api_key)
    assert user_id == grant.user_id
    assert users.unwrap(grant, secret, "ix1", 0) == DATA_KEY


def test_the_grant_holds_neither_the_key_nor_the_secret() -> None:
    api_key, grant = users.mint("ix1", 0, DATA_KEY, ["read"])
    _, secret = users.parse(api_key)
    stored = b"".join(v for v in dataclasses.astuple(grant) if isinstance(v, bytes))
    assert DATA_KEY not in stored and secret not in stored


@pytest.mark.parametrize(
    "tamper",
    [
        lambda g, s: (dataclasses.replace(g, rights=("read", "write")), s, "ix1", 0),  # widened
        lambda g, s: (g, s, "ix2", 0),  # another index
        lambda g, s: (g, s, "ix1", 1),  # a later key epoch
        lambda g, s: (g, secrets.token_bytes(32), "ix1", 0),  # a guessed secret
        lambda g, s: (dataclasses.replace(g, user_id="0" * 16), s, "ix1", 0),  # another user
    ],
    ids=["widened-rights", "other-index", "other-epoch", "wrong-secret", "other-user"],
)
def test_a_grant_opens_only_as_minted(tamper: object) -> None:
    api_key, grant = users.mint("ix1", 0, DATA_KEY, ["read"])
    _, secret = users.parse(api_key)
    args = tamper(grant, secret)  # type: ignore[operator]
    with pytest.raises(Unauthorized):
        users.unwrap(*args)


def test_verify_checks_the_secret_alone() -> None:
    api_key, grant = users.mint("ix1", 0, DATA_KEY, ["read"])
    _, secret = users.parse(api_key)
    assert users.verify(grant, secret, "ix1")
    assert not users.verify(grant, secrets.token_bytes(32), "ix1")
    assert not users.verify(grant, secret, "ix2")


def test_a_grant_altered_in_the_store_is_dropped_by_a_rotation_not_fatal() -> None:
    _, good = users.mint("ix1", 0, DATA_KEY, ["read"])
    _, bad = users.mint("ix1", 0, DATA_KEY, ["write"])
    bad = dataclasses.replace(bad, escrow=bad.escrow[:-1] + bytes([bad.escrow[-1] ^ 1]))
    meta = IndexMeta("docs", "ix1", b"s" * 16, b"v" * 32, users=(good, bad))
    moved = users.rewrap_all(meta, DATA_KEY, 1, secrets.token_bytes(32))
    assert [g.user_id for g in moved] == [good.user_id]


def test_key_rotation_rewraps_without_the_users_secret() -> None:
    api_key, grant = users.mint("ix1", 3, DATA_KEY, ["read"])
    new_key = secrets.token_bytes(32)
    moved = users.rewrap(grant, "ix1", 3, DATA_KEY, 4, new_key)
    _, secret = users.parse(api_key)
    assert users.unwrap(moved, secret, "ix1", 4) == new_key
    with pytest.raises(Unauthorized):
        users.unwrap(moved, secret, "ix1", 3)


@pytest.mark.parametrize("rights", [[], ["admin"], ["read", "read"], ["Read"]])
def test_permissions_are_a_non_empty_set_of_read_and_write(rights: list[str]) -> None:
    with pytest.raises(ValueError, match="permissions"):
        users.mint("ix1", 0, DATA_KEY, rights)


@pytest.mark.parametrize("given", ["cdbk_", "cdbk_zz_abc", "key-123", "cdbk_" + "0" * 16 + "_x"])
def test_malformed_user_keys_are_401(given: str) -> None:
    with pytest.raises(Unauthorized):
        users.parse(given)


def test_grants_survive_the_catalog_entry_round_trip() -> None:
    from actors.storage import persistence

    _, grant = users.mint("ix1", 0, DATA_KEY, ["read"])
    meta = IndexMeta("docs", "ix1", b"s" * 16, b"v" * 32, users=(grant,))
    raw = persistence.meta_document(meta)
    assert persistence.read_meta(raw).users == (grant,)
    assert isinstance(persistence.read_meta(raw).users[0], UserGrant)
