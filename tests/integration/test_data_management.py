"""Managing data beyond CyborgDB: delete and count by filter, over HTTP and the Python client,
on sharded and unsharded indexes, checked against the plain-Python filter oracle."""

from __future__ import annotations

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


def test_python_client_count_and_delete_by_filter(service) -> None:
    items = make_items(1)
    with Client(service.url, API_KEY) as vv:
        idx = vv.create_index(unique_name("dmc"), generate_key(), dimension=DIM, n_shards=2)
        try:
            idx.upsert(
                [it["id"] for it in items],
                np.array([it["vector"] for it in items]),
                metadata=[it["metadata"] for it in items],
            )
            flt = {"cat": {"$lte": 2}}
            want = sum(matches(it["metadata"], flt) for it in items)
            assert idx.count(flt) == want and idx.count() == N
            fives = sum(it["metadata"]["cat"] == 5 for it in items)
            assert idx.update(filters={"cat": 5}, set={"seen": True}, unset=["tags"]) == fives
            assert idx.count({"seen": True}) == fives and idx.count({"tags": "red"}) > 0
            assert idx.delete(filters=flt) == want
            assert idx.count() == N - want and idx.count(flt) == 0
            assert idx.delete(["i1", "i700"]) == (0 if matches(items[1]["metadata"], flt) else 1)
        finally:
            idx.drop()


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
