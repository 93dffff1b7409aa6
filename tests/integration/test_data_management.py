"""Managing data beyond CyborgDB: delete, update and count by filter, and cursors, over HTTP
and the Python client, on sharded and unsharded indexes, checked against the plain-Python
filter oracle."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from cluster.client import Client, generate_key
from tests.integration.conftest import API_KEY
from tests.integration.support import Index, error, ok, unique_name
from tests.unit.filter_oracle import matches

N, DIM = 600, 8
FILTERS: list[dict[str, Any]] = [
    {"cat": 3},
    {"grp": {"$in": [1, 2]}, "flag": True},
    {"$or": [{"score": {"$gt": 0.8}}, {"tags": "red"}]},
    {"name": {"$regex": "^item-1"}},
    {"missing": {"$exists": True}},
]


def make_items(seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(N):
        meta: dict[str, Any] = {
            "cat": i % 7,
            "grp": i % 4,
            "flag": bool(i % 3 == 0),
            "score": float(rng.random()),
            "tags": ["red", "blue"][: i % 3],
            "name": f"item-{i}",
        }
        items.append({"id": f"i{i}", "vector": rng.random(DIM).tolist(), "metadata": meta})
    return items


@pytest.fixture(params=[1, 3], ids=["unsharded", "sharded"])
def loaded(request, http: httpx.Client):
    idx = Index(http, unique_name("dm"), generate_key())
    ok(http.post("/v1/indexes/create", json=idx.body(dimension=DIM, n_shards=request.param)))
    items = make_items()
    idx.upsert(items)
    yield idx, {it["id"]: it["metadata"] for it in items}
    idx.drop()


def count(idx: Index, flt: dict[str, Any] | None) -> int:
    body = {} if flt is None else {"filters": flt}
    return ok(idx.post("vectors/count", **body))["count"]


def test_count_by_filter_is_exact(loaded) -> None:
    idx, docs = loaded
    assert count(idx, None) == count(idx, {}) == N == idx.count()
    for flt in FILTERS:
        assert count(idx, flt) == sum(matches(m, flt) for m in docs.values()), flt


def test_delete_by_filter_deletes_what_the_filter_matches(loaded) -> None:
    idx, docs = loaded
    alive = dict(docs)
    for flt in FILTERS[:3]:
        want = {i for i, m in alive.items() if matches(m, flt)}
        assert ok(idx.post("vectors/delete", filters=flt))["deleted_count"] == len(want)
        for i in want:
            alive.pop(i)
        assert set(idx.list_ids()) == set(alive)
        assert count(idx, flt) == 0
    # with ids: only those of the ids the filter matches
    some = [*sorted(alive)[:40], "unknown"]
    flt = {"grp": 0}
    want = {i for i in some if i in alive and matches(alive[i], flt)}
    r = ok(idx.post("vectors/delete", ids=some, filters=flt))
    assert r["deleted_count"] == len(want)
    assert not want & set(idx.list_ids())
    left = idx.count()
    assert ok(idx.post("vectors/delete", all=True))["deleted_count"] == left
    assert idx.count() == 0


def test_delete_by_filter_misuse_is_a_422(http: httpx.Client, make_index) -> None:
    idx = make_index(dimension=2)
    idx.upsert([{"id": "a", "vector": [0.0, 1.0], "metadata": {"k": 1}}])
    for body, words in (
        ({}, "give ids, filters"),
        ({"filters": {}}, '"all": true'),
        ({"all": True, "filters": {"k": 1}}, "without ids or filters"),
        ({"filters": {"k": {"$bad": 1}}}, "$bad"),
    ):
        assert words in str(error(idx.post("vectors/delete", **body), 422)), body
    assert idx.count() == 1


@contextlib.contextmanager
def client_index(service, items: list[dict[str, Any]]) -> Iterator[Any]:
    """A two-shard index holding ``items``, through the Python client; dropped afterwards."""
    with Client(service.url, API_KEY) as vv:
        idx = vv.create_index(unique_name("dmc"), generate_key(), dimension=DIM, n_shards=2)
        try:
            idx.upsert(
                [it["id"] for it in items],
                np.array([it["vector"] for it in items]),
                metadata=[it["metadata"] for it in items],
            )
            yield idx
        finally:
            idx.drop()


def test_python_client_count_and_delete_by_filter(service) -> None:
    items = make_items(1)
    with client_index(service, items) as idx:
        flt = {"cat": {"$lte": 2}}
        want = sum(matches(it["metadata"], flt) for it in items)
        assert idx.count(flt) == want and idx.count() == N
        fives = sum(it["metadata"]["cat"] == 5 for it in items)
        assert idx.update(filters={"cat": 5}, set={"seen": True}, unset=["tags"]) == fives
        assert idx.count({"seen": True}) == fives and idx.count({"tags": "red"}) > 0
        assert idx.delete(filters=flt) == want
        assert idx.count() == N - want and idx.count(flt) == 0
        assert idx.delete(["i1", "i700"]) == (0 if matches(items[1]["metadata"], flt) else 1)


def test_update_changes_metadata_and_contents_in_place(loaded) -> None:
    idx, docs = loaded
    before = {g["id"]: g for g in idx.get(sorted(docs)[:50], include=["vector", "metadata"])}
    flt = {"cat": 2}
    want = {i for i, m in docs.items() if matches(m, flt)}
    r = ok(
        idx.post(
            "vectors/update",
            filters=flt,
            update={"$set": {"status.reviewed": True, "grp": 9}, "$unset": ["tags"]},
            contents="checked",
        )
    )
    assert r["updated_count"] == len(want)
    assert count(idx, {"grp": 9}) == len(want) == count(idx, {"status.reviewed": True})
    after = {
        g["id"]: g for g in idx.get(sorted(docs)[:50], include=["vector", "metadata", "contents"])
    }
    for i, g in after.items():
        assert g["vector"] == before[i]["vector"]  # the vector as stored, untouched
        if i in want:
            m = dict(docs[i], grp=9, status={"reviewed": True})
            m.pop("tags")
            assert g["metadata"] == m and g["contents"] == "checked"
        else:
            assert g["metadata"] == docs[i]
    # by ids, and ids with a filter
    r = ok(idx.post("vectors/update", ids=["i1", "i2", "nope"], update={"$set": {"x": 1}}))
    assert r["updated_count"] == 2
    r = ok(
        idx.post(
            "vectors/update", ids=["i1", "i2"], filters={"x": 1, "cat": 1}, update={"$unset": ["x"]}
        )
    )
    assert r["updated_count"] == 1 and count(idx, {"x": 1}) == 1
    # the update applies to none if it cannot apply to one: name is a string, not an object
    r = idx.post("vectors/update", all=True, update={"$set": {"name.first": "a"}})
    assert "is not an object" in error(r, 422)["detail"]
    assert count(idx, {"name.first": {"$exists": True}}) == 0
    for body, words in (
        ({"ids": ["i1"], "update": {"$inc": {"a": 1}}}, "unknown operator"),
        ({"ids": ["i1"], "update": {}}, "changes nothing"),
        ({"update": {"$set": {"a": 1}}}, "give ids, filters"),
        ({"filters": {}, "update": {"$set": {"a": 1}}}, '"all": true'),
    ):
        assert words in str(error(idx.post("vectors/update", **body), 422)), body


def scan(idx: Index, route: str, limit: int, between=None, **fields: Any) -> list[dict[str, Any]]:
    """Every page of a scan (rows of query_metadata, or ids of list_ids as rows)."""
    rows: list[dict[str, Any]] = []
    cursor = None
    for page_no in range(10_000):
        body = ok(idx.post(route, limit=limit, **fields, **({"cursor": cursor} if cursor else {})))
        page = (
            body["results"]
            if route.endswith("query_metadata")
            else [{"id": i} for i in body["ids"]]
        )
        assert body["count"] == len(page) <= limit
        rows += page
        cursor = body["next_cursor"]
        if cursor is None:
            return rows
        assert len(page) == limit
        if between is not None:
            between(page_no)
    raise AssertionError("the scan did not end")


def test_cursors_page_through_every_item_in_id_order(loaded) -> None:
    idx, docs = loaded
    everything = scan(idx, "vectors/list_ids", 64)
    assert [r["id"] for r in everything] == sorted(docs)
    flt = {"grp": {"$in": [1, 2]}}
    rows = scan(idx, "vectors/query_metadata", 50, filters=flt, include=["metadata"])
    assert [r["id"] for r in rows] == sorted(i for i, m in docs.items() if matches(m, flt))
    assert all(r["metadata"] == docs[r["id"]] for r in rows)
    # without limit: the answer as before, no cursor
    assert "next_cursor" not in ok(idx.post("vectors/list_ids"))
    assert "next_cursor" not in ok(idx.post("vectors/query_metadata", filters=flt))
    # a page holding the last item says so: no empty page after it
    assert len(scan(idx, "vectors/list_ids", N)) == N


def test_a_scan_under_writes_returns_every_item_present_throughout_once(loaded) -> None:
    idx, docs = loaded
    ordered = sorted(docs)
    removed: set[str] = set()
    added: set[str] = set()

    def write(page_no: int) -> None:
        # ahead of and behind the cursor: new items, deletes, and items rewritten in place
        new = [f"i{page_no}-new-{j}" for j in range(5)] + [f"a-new-{page_no}"]
        idx.upsert([{"id": i, "vector": [0.5] * DIM, "metadata": {"cat": 1}} for i in new])
        added.update(new)
        gone = ordered[page_no * 37 % N : page_no * 37 % N + 3]
        idx.delete_ids(gone)
        removed.update(gone)
        kept = [i for i in ordered[::41] if i not in removed]
        idx.upsert([{"id": i, "vector": [0.25] * DIM, "metadata": docs[i]} for i in kept])

    rows = scan(idx, "vectors/query_metadata", 40, between=write)
    got = [r["id"] for r in rows]
    assert len(got) == len(set(got)), "an item came twice"
    assert got == sorted(got)
    assert set(docs) - removed <= set(got), "an item present for the whole scan was missed"
    assert set(got) <= set(docs) | added


def test_cursor_misuse_is_a_422(loaded, make_index) -> None:
    idx, _ = loaded
    body = ok(idx.post("vectors/query_metadata", filters={"cat": 3}, limit=5))
    cursor = body["next_cursor"]
    for route, fields, words in (
        ("vectors/list_ids", {"cursor": cursor}, "cursor needs limit"),
        (
            "vectors/query_metadata",
            {"filters": {"cat": 4}, "limit": 5, "cursor": cursor},
            "start the scan again",
        ),
        ("vectors/list_ids", {"limit": 5, "cursor": cursor}, "start the scan again"),
        (
            "vectors/query_metadata",
            {"filters": {"cat": 3}, "limit": 5, "cursor": cursor[:-4]},
            "start the scan again",
        ),
        ("vectors/query_metadata", {"limit": 5, "top_k": 3}, "does not combine"),
        ("vectors/query_metadata", {"limit": 5, "order_by": "cat"}, "does not combine"),
        ("vectors/list_ids", {"limit": 0}, "limit"),
        ("vectors/list_ids", {"limit": 10_001}, "limit"),
    ):
        assert words in str(error(idx.post(route, **fields), 422)), (route, fields)
    other = make_index(dimension=DIM)
    other.upsert([{"id": "i1", "vector": [0.0] * DIM, "metadata": {"cat": 3}}])
    r = other.post("vectors/query_metadata", filters={"cat": 3}, limit=5, cursor=cursor)
    assert "start the scan again" in error(r, 422)["detail"]
    # the cursor is sealed: the id it ends at is not in it
    last = body["ids"][-1]
    assert last not in cursor and last.encode().hex() not in cursor


def test_python_client_scan(service) -> None:
    items = make_items(2)
    with client_index(service, items) as idx:
        rows = list(idx.scan({"cat": 2}, include=["metadata", "vector"], page_size=7))
        want = sorted(it["id"] for it in items if it["metadata"]["cat"] == 2)
        assert [r["id"] for r in rows] == want
        by_id = {it["id"]: it for it in items}
        assert all(r["metadata"] == by_id[r["id"]]["metadata"] for r in rows)
        np.testing.assert_allclose(
            [r["vector"] for r in rows], [by_id[i]["vector"] for i in want], rtol=1e-6
        )
        assert [r["id"] for r in idx.scan(page_size=1000)] == sorted(by_id)
