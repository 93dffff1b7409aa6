"""BM25 full-text and hybrid search over HTTP (CyborgDB 0.18): full_text fields from
text_fields or metadata_schema, query_metadata(text) ranked as the reference BM25 ranks,
hybrid query(text) fused by weighted reciprocal rank fusion, filters on both legs, sharded
answers equal to unsharded ones, and a clear 422 for every misuse."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from cluster.client import generate_key
from serve_app.gateway.fulltext import fuse
from tests.integration.support import Index, error, ok, unique_name
from tests.unit.bm25_oracle import oracle

TOPICS = {
    "ocean": "whale ocean sea wave coral tide shark salt",
    "bread": "bread bake oven flour yeast dough crust loaf",
    "space": "planet orbit rocket star galaxy moon launch comet",
    "music": "guitar song melody chord drum rhythm choir piano",
}
N, DIM = 240, 16


def corpus() -> tuple[list[dict[str, Any]], np.ndarray]:
    rng = np.random.default_rng(7)
    names = list(TOPICS)
    centres = rng.standard_normal((len(names), DIM)).astype(np.float32) * 3
    items, vectors = [], []
    for i in range(N):
        t = i % len(names)
        words = TOPICS[names[t]].split() + TOPICS[names[(t + 1) % len(names)]].split()[:2]
        body = " ".join(rng.choice(words, size=int(rng.integers(3, 14))))
        title = " ".join(rng.choice(TOPICS[names[t]].split(), size=2))
        v = centres[t] + rng.standard_normal(DIM).astype(np.float32)
        meta = {"body": body, "title": title, "topic": names[t], "n": i}
        if i % 17 == 0:
            meta.pop("title")  # some items lack a field
        items.append({"id": f"d{i:03d}", "vector": v.tolist(), "metadata": meta})
        vectors.append(v)
    return items, np.asarray(vectors)


def create(http: httpx.Client, n_shards: int, **fields: Any) -> Index:
    idx = Index(http, unique_name("ft"), generate_key())
    body = idx.body(dimension=DIM, n_shards=n_shards, **fields)
    ok(http.post("/v1/indexes/create", json=body))
    return idx


@pytest.fixture(scope="module")
def indexes(http: httpx.Client):
    """The same items in a one-shard and a three-shard index with two full_text fields."""
    items, _ = corpus()
    made = [
        create(http, 1, text_fields=["body"], metadata_schema={"title": {"full_text": True}}),
        create(http, 3, text_fields=["body", "title"], bm25_k1=1.2, bm25_b=0.75),
    ]
    for idx in made:
        idx.upsert(items)
    yield made
    for idx in made:
        idx.drop()


def test_describe_reports_full_text_fields_and_bm25(indexes: list[Index]) -> None:
    for idx in indexes:
        d = idx.describe()
        assert d["bm25"] == {"k1": 1.2, "b": 0.75, "analyzer_version": "vaultvec-en-1"}
        assert d["metadata_schema"]["body"] == {
            "filterable": False,
            "pattern": False,
            "full_text": True,
        }
        assert d["metadata_schema"]["title"]["full_text"] is True


@pytest.mark.parametrize(
    "text,fields,weights,require_all",
    [
        ("whale ocean", None, None, False),
        ("baking breads in the oven", ["body"], None, False),
        ("rocket moon", ["title", "body"], [2.0, 0.5], False),
        ("guitar drum piano", None, None, True),
    ],
)
def test_query_metadata_ranks_as_the_reference_bm25(
    indexes: list[Index],
    text: str,
    fields: list[str] | None,
    weights: list[float] | None,
    require_all: bool,
) -> None:
    items, _ = corpus()
    docs = {it["id"]: it["metadata"] for it in items}
    searched = fields or ["body", "title"]
    want = oracle(docs, searched, weights or [1.0] * len(searched), text, require_all)
    want_order = sorted(want, key=lambda i: (-want[i], i))
    answers = []
    for idx in indexes:
        extra: dict[str, Any] = {"require_all_terms": require_all}
        if fields is not None:
            extra["text_fields"] = fields
        if weights is not None:
            extra["text_field_weights"] = weights
        body = ok(idx.post("vectors/query_metadata", text=text, **extra))
        assert body["ids"] == want_order
        for row in body["results"]:
            assert row["score"] == pytest.approx(want[row["id"]], rel=1e-9)
        answers.append(body)
    assert answers[0] == answers[1]  # sharded equals unsharded, scores to the last bit


def test_query_metadata_text_with_filter_top_k_and_include(indexes: list[Index]) -> None:
    items, _ = corpus()
    docs = {it["id"]: it["metadata"] for it in items}
    keep = {i for i, m in docs.items() if m["n"] % 2 == 0}
    want = oracle(docs, ["body", "title"], [1.0, 1.0], "shark coral", allowed=keep)
    want_order = sorted(want, key=lambda i: (-want[i], i))[:5]
    for idx in indexes:
        flt = {"n": {"$in": sorted(docs[i]["n"] for i in keep)}}
        body = ok(
            idx.post(
                "vectors/query_metadata",
                text="shark coral",
                filters=flt,
                top_k=5,
                include=["metadata"],
            )
        )
        assert body["ids"] == want_order
        assert all(r["metadata"] == docs[r["id"]] and "score" in r for r in body["results"])


def test_hybrid_query_fuses_both_legs(indexes: list[Index]) -> None:
    items, vectors = corpus()
    docs = {it["id"]: it["metadata"] for it in items}
    ids = [it["id"] for it in items]
    q = vectors[5] + 0.1
    text, k, window = "flour dough", 5, 3
    # each leg's own answer, then the fusion computed here
    d = np.linalg.norm(vectors - q, axis=1)
    vector_leg = [ids[j] for j in np.lexsort((ids, d))[: k * window]]
    bm25 = oracle(docs, ["body", "title"], [1.0, 1.0], text)
    text_leg = sorted(bm25, key=lambda i: (-bm25[i], i))[: k * window]
    for alpha in (0.5, 0.2, 1.0, 0.0):
        want = fuse(vector_leg, text_leg, alpha, 60.0, k)
        for idx in indexes:
            got = idx.query(query_vectors=q.tolist(), text=text, top_k=k, alpha=alpha, greedy=True)
            assert [(r["id"], pytest.approx(r["score"])) for r in got] == want, alpha
            assert all("distance" not in r and isinstance(r["metadata"], dict) for r in got)


def test_hybrid_filters_apply_to_both_legs_and_batches_fuse_per_row(
    indexes: list[Index],
) -> None:
    _, vectors = corpus()
    flt = {"topic": "bread"}
    for idx in indexes:
        got = idx.query(
            query_vectors=[vectors[0].tolist(), vectors[1].tolist()],
            text="whale ocean bread",
            filters=flt,
            top_k=4,
            include=["metadata", "contents"],
            greedy=True,
        )
        assert len(got) == 2
        for row in got:
            assert len(row) == 4
            assert all(r["metadata"]["topic"] == "bread" for r in row)
            scores = [r["score"] for r in row]
            assert scores == sorted(scores, reverse=True)


def test_text_search_misuse_is_a_clear_422(http: httpx.Client, indexes: list[Index]) -> None:
    idx = indexes[0]
    _, vectors = corpus()
    v = vectors[0].tolist()
    cases = [
        (dict(text="x", text_fields=["topic"]), "not a full_text field"),
        (dict(text="x", text_fields=["body"], text_field_weights=[1.0, 2.0]), "weights"),
        (dict(text="x", alpha=1.5), "alpha"),
        (dict(text="x", rrf_k=0), "rrf_k"),
        (dict(text="x", window_mult=0), "window_mult"),
    ]
    for fields, words in cases:
        detail = str(error(idx.post("vectors/query", query_vectors=v, **fields), 422))
        assert words in detail, (fields, detail)
    # without text the knobs leave the query a plain vector query, as CyborgDB's do
    plain_hits = idx.query(query_vectors=v, alpha=0.3, window_mult=2, top_k=3)
    assert all("distance" in h and "score" not in h for h in plain_hits)
    r = idx.post("vectors/query_metadata", text="bread", order_by="n")
    assert "order_by" in error(r, 422)["detail"]
    plain = create(http, 1)
    try:
        plain.upsert([{"id": "a", "vector": v, "metadata": {"body": "bread"}}])
        r = plain.post("vectors/query_metadata", text="bread")
        assert "no full_text field" in error(r, 422)["detail"]
        r = plain.post("vectors/query", query_vectors=v, text="bread")
        assert "no full_text field" in error(r, 422)["detail"]
    finally:
        plain.drop()
    for body, words in (
        ({"bm25_k1": 1.5}, "need a full_text field"),
        ({"metadata_schema": {"t": {"full_text": True, "pattern": True}}}, "excludes pattern"),
    ):
        name = unique_name("ft")
        r = http.post(
            "/v1/indexes/create",
            json={"index_name": name, "index_key": generate_key(), "dimension": 2, **body},
        )
        assert words in error(r, 422)["detail"]


def test_full_text_postings_follow_updates_deletes_and_restart_free_reads(
    http: httpx.Client,
) -> None:
    idx = create(http, 2, text_fields=["body"])
    try:
        idx.upsert(
            [
                {"id": "a", "vector": [0.0] * DIM, "metadata": {"body": "red apple"}},
                {"id": "b", "vector": [1.0] * DIM, "metadata": {"body": "green apple pie"}},
            ]
        )
        rows = ok(idx.post("vectors/query_metadata", text="apple"))["ids"]
        assert rows == ["a", "b"]
        idx.upsert([{"id": "a", "vector": [0.0] * DIM, "metadata": {"body": "pear"}}])
        idx.delete_ids(["b"])
        assert ok(idx.post("vectors/query_metadata", text="apple"))["ids"] == []
        assert ok(idx.post("vectors/query_metadata", text="pears"))["ids"] == ["a"]
    finally:
        idx.drop()


def test_python_client_text_search(service, indexes: list[Index]) -> None:
    """The project's client: create with text_fields, query_metadata(text=...) and a hybrid
    query(text=...) with scores, the batch one fused row by row."""
    from cluster.client import Client
    from tests.integration.conftest import API_KEY

    items, vectors = corpus()
    with Client(service.url, API_KEY) as vv:
        idx = vv.create_index(
            unique_name("ftc"), generate_key(), dimension=DIM, text_fields=["body", "title"]
        )
        try:
            idx.upsert(
                [it["id"] for it in items], vectors, metadata=[it["metadata"] for it in items]
            )
            assert idx.describe()["bm25"]["k1"] == 1.2
            rows = idx.query_metadata(text="rocket moon", top_k=5)
            want = ok(indexes[0].post("vectors/query_metadata", text="rocket moon", top_k=5))
            assert rows == want["results"]
            one = idx.query(vectors[3], top_k=4, text="guitar", greedy=True)
            http_one = indexes[0].query(
                query_vectors=vectors[3].tolist(), top_k=4, text="guitar", greedy=True
            )
            assert one.ids.tolist() == [r["id"] for r in http_one]
            assert one.scores.tolist() == pytest.approx([r["score"] for r in http_one])
            assert one.distances is None
            batch = idx.query(vectors[:100], top_k=4, text="guitar", greedy=True)
            assert batch.ids.shape == (100, 4) and batch.scores.shape == (100, 4)
            assert batch.ids[3].tolist() == one.ids.tolist()
        finally:
            idx.drop()
