"""Per-index user keys over HTTP (CyborgDB 0.17's RBAC routes): minted by the index key's holder,
each opening only its own index with its own key alone, read-only users refused every write,
revocation immediate, and a key rotation keeping every user working."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.integration.conftest import Service
from tests.integration.support import Index, error, ok

VECTORS = {f"u{i}": [float(i), float(i % 3), 1.0] for i in range(12)}


@pytest.fixture()
def index(make_index: Callable[..., Index]) -> Index:
    idx = make_index(dimension=3)
    idx.upsert(
        [{"id": k, "vector": v, "metadata": {"n": i}} for i, (k, v) in enumerate(VECTORS.items())]
    )
    return idx


@pytest.fixture()
def as_user(service: Service) -> Iterator[Callable[[str], httpx.Client]]:
    made: list[httpx.Client] = []

    def client(api_key: str) -> httpx.Client:
        c = httpx.Client(base_url=service.url, headers={"X-API-Key": api_key}, timeout=60)
        made.append(c)
        return c

    yield client
    for c in made:
        c.close()


def mint(index: Index, *permissions: str) -> dict[str, str]:
    r = index.client.post(
        f"/v1/indexes/{index.name}/users",
        json={"permissions": list(permissions), "index_key": index.key},
    )
    return ok(r)  # type: ignore[no-any-return]


def users_of(index: Index) -> dict[str, list[str]]:
    r = index.client.get(f"/v1/indexes/{index.name}/users", headers={"X-Index-Key": index.key})
    return {u["user_id"]: u["permissions"] for u in ok(r)["users"]}


def query(c: httpx.Client, name: str, vector: list[float]) -> httpx.Response:
    body = {"index_name": name, "index_key": None, "query_vectors": vector, "top_k": 3}
    return c.post("/v1/vectors/query", json=body)


def test_a_read_only_user_reads_without_the_index_key_and_may_not_write(
    index: Index, as_user: Callable[[str], httpx.Client]
) -> None:
    user = mint(index, "read")
    assert user["api_key"].startswith("cdbk_") and users_of(index) == {user["user_id"]: ["read"]}
    reader = as_user(user["api_key"])
    results = ok(query(reader, index.name, VECTORS["u4"]))["results"]
    assert results[0]["id"] == "u4"
    got = ok(reader.post("/v1/vectors/get", json={"index_name": index.name, "ids": ["u1"]}))
    assert [g["id"] for g in got["results"]] == ["u1"]
    assert ok(reader.post("/v1/indexes/describe", json={"index_name": index.name}))[
        "num_vectors"
    ] == len(VECTORS)
    for route, body in [
        ("vectors/upsert", {"items": [{"id": "x", "vector": [1.0, 1.0, 1.0]}]}),
        ("vectors/delete", {"ids": ["u1"]}),
        ("indexes/delete", {}),
        ("indexes/train", {}),
    ]:
        r = reader.post(f"/v1/{route}", json={"index_name": index.name, **body})
        assert r.status_code == 403, (route, r.text)
    assert index.count() == len(VECTORS)  # nothing written


def test_a_write_only_user_writes_and_describes_but_may_not_read(
    index: Index, as_user: Callable[[str], httpx.Client]
) -> None:
    writer = as_user(mint(index, "write")["api_key"])
    item = {"id": "w1", "vector": [9.0, 9.0, 9.0]}
    ok(writer.post("/v1/vectors/upsert", json={"index_name": index.name, "items": [item]}))
    assert index.get(["w1"])[0]["id"] == "w1"
    ok(writer.post("/v1/indexes/describe", json={"index_name": index.name}))
    assert query(writer, index.name, [9.0, 9.0, 9.0]).status_code == 403


def test_a_user_key_opens_no_other_index_and_manages_nothing(
    index: Index, make_index: Callable[..., Index], as_user: Callable[[str], httpx.Client]
) -> None:
    other = make_index(dimension=3)
    other.upsert([{"id": "o", "vector": [1.0, 2.0, 3.0]}])
    user = as_user(mint(index, "read", "write")["api_key"])
    error(query(user, other.name, [1.0, 2.0, 3.0]), 401)
    error(user.get("/v1/indexes/list"), 403)
    error(user.post("/v1/indexes/create", json={"index_name": "x", "index_key": "ab" * 32}), 403)
    error(user.post(f"/v1/indexes/{index.name}/users", json={"permissions": ["read"]}), 403)
    error(user.get("/v1/metrics"), 403)  # the operator's
    # another name is a 401 whether or not such an index exists: names are not probed
    error(query(user, index.name + "-missing", [1.0, 2.0, 3.0]), 401)


def test_revoked_at_once_and_malformed_keys_are_401(
    index: Index, as_user: Callable[[str], httpx.Client]
) -> None:
    user = mint(index, "read")
    reader = as_user(user["api_key"])
    ok(query(reader, index.name, VECTORS["u1"]))
    r = index.client.delete(
        f"/v1/indexes/{index.name}/users/{user['user_id']}", headers={"X-Index-Key": index.key}
    )
    assert r.status_code == 204
    assert users_of(index) == {}
    error(query(reader, index.name, VECTORS["u1"]), 401)  # the very next request
    r = index.client.delete(
        f"/v1/indexes/{index.name}/users/{user['user_id']}", headers={"X-Index-Key": index.key}
    )
    error(r, 404)
    forged = user["api_key"][:-4] + ("AAAA" if not user["api_key"].endswith("AAAA") else "BBBB")
    error(query(as_user(forged), index.name, VECTORS["u1"]), 401)
    error(query(as_user("cdbk_nonsense"), index.name, VECTORS["u1"]), 401)


def test_a_made_up_user_key_is_refused_before_the_body_is_read(
    index: Index, as_user: Callable[[str], httpx.Client]
) -> None:
    """Well formed but no one's: a 401 at the gate, on every route, whatever follows."""
    made_up = "cdbk_" + "0" * 16 + "_" + "A" * 43
    c = as_user(made_up)
    for r in (
        c.get("/v1/metrics"),
        c.get("/v1/embedding-models"),
        c.get("/v1/indexes/list"),
        c.post("/v1/vectors/upsert", content=b"x" * (8 << 20)),  # refused, not read
        query(c, index.name, VECTORS["u1"]),
    ):
        error(r, 401)
    stolen_id = mint(index, "read")["user_id"]  # a real user id with a guessed secret
    error(query(as_user(f"cdbk_{stolen_id}_" + "B" * 43), index.name, VECTORS["u1"]), 401)


def test_managing_users_needs_the_index_key(index: Index) -> None:
    wrong = secrets.token_hex(32)
    r = index.client.post(
        f"/v1/indexes/{index.name}/users", json={"permissions": ["read"], "index_key": wrong}
    )
    error(r, 401)
    r = index.client.get(f"/v1/indexes/{index.name}/users", headers={"X-Index-Key": wrong})
    error(r, 401)
    for bad in ([], ["admin"], ["read", "read"]):
        r = index.client.post(
            f"/v1/indexes/{index.name}/users", json={"permissions": bad, "index_key": index.key}
        )
        error(r, 422)


def test_users_keep_working_across_a_key_rotation(
    index: Index, as_user: Callable[[str], httpx.Client]
) -> None:
    reader = as_user(mint(index, "read")["api_key"])
    new_key = secrets.token_hex(32)
    ok(index.post("indexes/rotate_key", new_index_key=new_key))
    index.key = new_key
    results = ok(query(reader, index.name, VECTORS["u7"]))["results"]
    assert results[0]["id"] == "u7"
    assert list(users_of(index).values()) == [["read"]]


def test_the_user_key_is_never_stored(index: Index, service: Service) -> None:
    user = mint(index, "read", "write")
    secret_part = user["api_key"].rsplit("_", 1)[1]
    for path in service.storage.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert user["api_key"].encode() not in data and secret_part.encode() not in data, path
