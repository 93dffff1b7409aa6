"""Two gateway replicas on different nodes agree after create, delete and retraining.

Requests go through Serve's router, which spreads them over both replicas; each step below
issues enough requests that both replicas serve some, and every answer must reflect the last
acknowledged catalog change, including on the replica that did not make it.
"""

from __future__ import annotations

import httpx

from tests.cluster.load import DIM, vector_of
from tests.cluster.support import create, gateways
from tests.integration.support import Index, error, ok

ROUNDS = 30


def top_ids(idx: Index, item: str) -> list[str]:
    results = idx.query(query_vectors=vector_of(item), top_k=5)
    return [r["id"] for r in results]


def test_delete_and_recreate_are_seen_by_every_replica(http: httpx.Client) -> None:
    assert len(gateways()) == 2
    idx = create(http, seed_items=50)
    for i in range(ROUNDS):  # both replicas cache the index's view
        assert top_ids(idx, f"s{i % 50}")[0] == f"s{i % 50}"

    ok(idx.post("indexes/delete"))
    for _ in range(ROUNDS):
        error(idx.post("vectors/query", query_vectors=vector_of("s1"), top_k=5), 404)
        error(idx.post("vectors/get", ids=["s1"]), 404)

    # Same name and key, new contents: no replica may answer from the old incarnation.
    ok(
        http.post(
            "/v1/indexes/create", json=idx.body(index_config={"type": "ivfflat", "dimension": DIM})
        )
    )
    idx.upsert([{"id": f"n{i}", "vector": vector_of(f"n{i}")} for i in range(40)])
    for i in range(ROUNDS):
        assert top_ids(idx, f"n{i % 40}")[0] == f"n{i % 40}"
        assert all(x.startswith("n") for x in top_ids(idx, f"s{i}"))
        assert idx.get([f"s{i}"]) == []
        assert idx.count() == 40

    # Re-created under another key: the old key no longer opens it anywhere.
    ok(idx.post("indexes/delete"))
    other = Index(http, idx.name, "11" * 32)
    ok(
        http.post(
            "/v1/indexes/create",
            json=other.body(index_config={"type": "ivfflat", "dimension": DIM}),
        )
    )
    for _ in range(ROUNDS):
        error(idx.post("vectors/query", query_vectors=vector_of("n1"), top_k=5), 401)
        assert other.count() == 0
    other.drop()


def test_retraining_is_seen_by_every_replica(http: httpx.Client) -> None:
    idx = create(http, seed_items=3000)
    for i in range(ROUNDS):
        assert top_ids(idx, f"s{i}")[0] == f"s{i}"
        assert idx.describe()["is_trained"] is False
    assert ok(idx.post("indexes/train", n_lists=32))["status"] == "success"
    for i in range(ROUNDS):
        described = idx.describe()
        assert described["is_trained"] is True
        assert described["index_config"]["n_lists"] == 32
        assert top_ids(idx, f"s{i * 7}")[0] == f"s{i * 7}"
    # A second training is picked up as well.
    assert ok(idx.post("indexes/train", n_lists=16))["status"] == "success"
    for i in range(ROUNDS):
        assert idx.describe()["index_config"]["n_lists"] == 16
        assert top_ids(idx, f"s{i * 11}")[0] == f"s{i * 11}"
    idx.drop()
