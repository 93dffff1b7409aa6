"""CyborgDB 0.18's metadata_schema and the $regex/$contains operators over HTTP: stored and
echoed by describe, enforced by query_metadata, advisory for query with a vector."""

from __future__ import annotations

from collections.abc import Callable

from cluster.client import generate_key
from tests.integration.support import Index, error, ok, unique_name
from tests.unit.filter_oracle import matches

TITLES = ["alpha", "Alps", "beta", "gamma", "alphabet soup"]
SCHEMA = {"title": {"filterable": True, "pattern": True}, "blob": {"filterable": False}}


def test_schema_is_echoed_and_enforced_by_query_metadata(
    http, make_index: Callable[..., Index]
) -> None:
    idx = Index(http, unique_name("sc"), generate_key())
    ok(http.post("/v1/indexes/create", json=idx.body(dimension=2, metadata_schema=SCHEMA)))
    try:
        described = idx.describe()["metadata_schema"]
        assert described == {
            "title": {"filterable": True, "pattern": True, "full_text": False},
            "blob": {"filterable": False, "pattern": False, "full_text": False},
        }
        items = [
            {"id": t, "vector": [float(i), 1.0], "metadata": {"title": t, "blob": i, "n": i}}
            for i, t in enumerate(TITLES)
        ]
        idx.upsert(items)
        for flt in (
            {"title": {"$regex": "^al"}},
            {"title": {"$regex": "^al", "$options": "i"}},
            {"title": {"$contains": "ph"}},
            {"title": {"$not": {"$regex": "a$"}}},
        ):
            body = ok(idx.post("vectors/query_metadata", filters=flt))
            want = {it["id"] for it in items if matches(it["metadata"], flt)}
            assert set(body["ids"]) == want, flt
        # query_metadata: no condition on a non-filterable field, patterns on pattern fields only
        assert (
            "not filterable"
            in error(idx.post("vectors/query_metadata", filters={"blob": 1}), 422)["detail"]
        )
        r = idx.post("vectors/query_metadata", filters={"n": {"$regex": "1"}})
        assert "pattern field" in error(r, 422)["detail"]
        # query with a vector filters every field, as CyborgDB's does
        hits = idx.query(query_vectors=[0.0, 1.0], top_k=5, filters={"blob": {"$gte": 3}})
        assert {h["id"] for h in hits} == {"gamma", "alphabet soup"}
    finally:
        idx.drop()


def test_a_hostile_or_invalid_pattern_is_a_422_or_answered_at_once(
    make_index: Callable[..., Index],
) -> None:
    idx = make_index(dimension=2)
    idx.upsert([{"id": "long", "vector": [1.0, 0.0], "metadata": {"s": "a" * 60_000 + "!"}}])
    # exponential for a backtracking engine; RE2 answers in time linear in the value
    assert idx.query(query_vectors=[1.0, 0.0], filters={"s": {"$regex": "^(a+)+$"}}) == []
    for bad in ({"$regex": r"(\w)\1"}, {"$regex": "(?=a)"}, {"$regex": "a" * 1025}):
        r = idx.post("vectors/query", query_vectors=[1.0, 0.0], filters={"s": bad})
        assert "regular expression" in error(r, 422)["detail"] or "1024" in r.text


def test_a_malformed_schema_is_a_422(http) -> None:
    body = {
        "index_name": unique_name("sc"),
        "index_key": "ab" * 32,
        "dimension": 2,
        "metadata_schema": {"t": {"pattern": True, "filterable": False}},
    }
    assert (
        "pattern needs filterable"
        in error(http.post("/v1/indexes/create", json=body), 422)["detail"]
    )
