"""The client's request encoding and response decoding (JSON and compact array forms, text
queries and text-only upserts), against a small in-memory fake of the /v1 routes served through
an httpx MockTransport."""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import zlib
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from cluster.client import AsyncClient, Client, QueryResult, generate_key
from cluster.client.calls import chunks, pack
from tests.helpers import exact_knn

D_TEXT = 8  # the fake server's embedding dimension


def embed(text: str) -> np.ndarray:
    """The fake server's embedding model: a fixed random vector per text."""
    return np.random.default_rng(zlib.crc32(text.encode())).normal(size=D_TEXT)


class FakeServer:
    """Brute-force euclidean index implementing the wire formats of the real routes."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.x = np.zeros((0, 0), dtype=np.float32)
        self.meta: dict[str, Any] = {}
        self.contents: dict[str, str | None] = {}
        self.keeps_vectors = True  # False: like ivf/ivfpq, no vector in query answers
        self.paths: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.sizes: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(path)
        self.sizes.append(len(request.content))
        body = orjson.loads(request.content)
        self.bodies.append(body)
        if path in ("/v1/indexes/create", "/v1/indexes/train"):
            return httpx.Response(200, json={"status": "success", "message": ""})
        if path == "/v1/vectors/upsert":
            items = body["items"]
            vectors = [it["vector"] if "vector" in it else embed(it["contents"]) for it in items]
            self._add([it["id"] for it in items], np.array(vectors))
            for it in items:
                self.meta[it["id"]] = it.get("metadata")
                self.contents[it["id"]] = it.get("contents")
            return self._upserted(len(items))
        if path == "/v1/vectors/upsert_arrays":
            raw = base64.b64decode(body["vectors"], validate=True)
            x = np.frombuffer(raw, dtype="<f4").reshape(body["shape"])
            self._add(body["ids"], x)
            for i, m in zip(body["ids"], body.get("metadata") or [None] * len(x)):
                self.meta[i] = m
            for i, c in zip(body["ids"], body.get("contents") or [None] * len(x)):
                self.contents[i] = c
            return self._upserted(len(x))
        if path == "/v1/vectors/query":
            if ("query_vectors" in body) == ("query_contents" in body):
                return httpx.Response(422, json={"status_code": 422, "detail": "exactly one"})
            if "query_contents" in body:  # a text query: flat results
                q = embed(body["query_contents"]).astype(np.float32)
            else:
                q = np.asarray(body["query_vectors"], dtype=np.float32)
            single = q.ndim == 1
            d, idx = self._search(np.atleast_2d(q), body.get("top_k") or 100)
            include = body.get("include") or ()
            results = [
                [self._hit(j, float(dd), include) for dd, j in zip(dr, ir)]
                for dr, ir in zip(d, idx)
            ]
            return httpx.Response(200, json={"results": results[0] if single else results})
        if path == "/v1/vectors/query_arrays":
            if set(body.get("include") or ()) - {"distance", "metadata"}:  # as the real schema
                return httpx.Response(422, json={"status_code": 422, "detail": "include"})
            raw = base64.b64decode(body["query_vectors"], validate=True)
            q = np.frombuffer(raw, dtype="<f4").reshape(body["shape"])
            k = body.get("top_k") or 100
            d, idx = self._search(q, k)
            dist = np.full((len(q), k), np.inf, dtype="<f4")
            counts = [len(r) for r in idx]
            for r, dr in enumerate(d):
                dist[r, : len(dr)] = dr
            out = {
                "nq": len(q),
                "top_k": k,
                "counts": counts,
                "ids": [self.ids[j] for r in idx for j in r],
                "distances": base64.b64encode(dist.tobytes()).decode(),
                "metadata": [self.meta[self.ids[j]] or {} for r in idx for j in r],
            }
            return httpx.Response(200, json=out)
        return httpx.Response(404, json={"status_code": 404, "detail": "no route"})

    def _hit(self, j: int, distance: float, include: Any) -> dict[str, Any]:
        """One JSON result; vector and contents only when asked for, as the real route."""
        item_id = self.ids[j]
        hit = {"id": item_id, "distance": distance, "metadata": self.meta[item_id] or {}}
        if "vector" in include and self.keeps_vectors:
            hit["vector"] = self.x[j].tolist()
        if "contents" in include:
            hit["contents"] = self.contents.get(item_id)
        return hit

    def _add(self, ids: list[str], x: np.ndarray) -> None:
        self.ids += ids
        self.x = np.concatenate([self.x.reshape(-1, x.shape[1]), x.astype(np.float32)])

    def _search(self, q: np.ndarray, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        d, order = exact_knn(self.x, q, k)
        return list(d.astype(np.float32)), list(order)

    @staticmethod
    def _upserted(n: int) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "message": "", "upserted_count": n})


@pytest.fixture()
def server() -> FakeServer:
    return FakeServer()


def client_for(server: FakeServer, **kw: Any) -> Client:
    return Client("http://vv.test", "k", transport=httpx.MockTransport(server), **kw)


def data(n: int = 300, d: int = 8) -> tuple[list[str], np.ndarray]:
    x = np.random.default_rng(1).normal(size=(n, d)).astype(np.float32)
    return [f"id-{i}" for i in range(n)], x


def test_generate_key() -> None:
    key = generate_key()
    assert re.fullmatch(r"[0-9a-f]{64}", key) and key != generate_key()


def test_binary_threshold_picks_the_array_routes(server: FakeServer) -> None:
    ids, x = data()
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        assert idx.upsert(ids[:63], x[:63]) == 63
        assert idx.upsert(ids[63:], x[63:]) == len(ids) - 63
        idx.query(x[:63], top_k=3)
        idx.query(x[:64], top_k=3)
        idx.query(x[:64], top_k=3, binary=False)
        idx.query(x[:2], top_k=3, binary=True)
    assert server.paths == [
        "/v1/vectors/upsert",
        "/v1/vectors/upsert_arrays",
        "/v1/vectors/query",
        "/v1/vectors/query_arrays",
        "/v1/vectors/query",
        "/v1/vectors/query_arrays",
    ]
    # the compact array form: base64 float32 plus a shape, never CyborgDB's batch form
    assert set(server.bodies[1]) == {"index_name", "index_key", "ids", "vectors", "shape"}
    assert set(server.bodies[3]) == {"index_name", "index_key", "query_vectors", "shape", "top_k"}


def test_binary_upsert_body_round_trips(server: FakeServer) -> None:
    ids, x = data(100)
    meta = [{"n": i} if i % 2 else None for i in range(100)]
    with client_for(server) as c:
        c.index("i", "ab" * 32).upsert(ids, x.astype(np.float64), metadata=meta)
    np.testing.assert_array_equal(server.x, x)
    assert server.ids == ids and server.meta["id-1"] == {"n": 1} and server.meta["id-0"] is None


def test_binary_and_json_answers_decode_alike(server: FakeServer) -> None:
    ids, x = data()
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        idx.upsert(ids, x)
        a = idx.query(x[:80], top_k=5, binary=True)
        b = idx.query(x[:80], top_k=5, binary=False)
    assert isinstance(a, QueryResult) and a.ids.shape == (80, 5) and a.distances is not None
    assert a.distances.dtype == np.float32 and a.distances.shape == (80, 5)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.distances, b.distances, rtol=1e-6)
    assert a.ids[3, 0] == "id-3" and a.distances[3, 0] == 0
    assert (a.counts == 5).all() and a.metadata is not None and a.metadata.shape == (80, 5)


def test_short_rows_are_padded(server: FakeServer) -> None:
    ids, x = data(4)
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        idx.upsert(ids, x)
        for binary in (True, False):
            r = idx.query(x[:2], top_k=6, binary=binary)
            assert r.ids.shape == (2, 6) and list(r.counts) == [4, 4]
            assert r.ids[0, 4] is None and r.ids[0, 5] is None
            assert r.distances is not None and np.isinf(r.distances[:, 4:]).all()


def test_single_query_gives_flat_arrays(server: FakeServer) -> None:
    ids, x = data(10)
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        idx.upsert(ids, x)
        r = idx.query(x[2], top_k=3)
    assert r.ids.shape == (3,) and r.ids[0] == "id-2"
    assert r.distances is not None and r.distances.shape == (3,) and r.distances[0] == 0


def test_large_batches_are_split_and_reassembled(server: FakeServer) -> None:
    ids, x = data(500, 16)
    with client_for(server, max_request_bytes=16 * 4 * 2 * 100) as c:  # ~ 70 rows per request
        idx = c.index("i", "ab" * 32)
        assert idx.upsert(ids, x) == 500
        n_upserts = len(server.paths)
        r = idx.query(x, top_k=2)
    assert n_upserts > 5 and len(server.paths) - n_upserts > 5
    assert list(r.ids[:, 0]) == ids  # every query finds itself first, in order


@pytest.mark.parametrize(("n", "rows"), [(0, 5), (5, 5), (6, 5), (10_000, 5622), (999, 70)])
def test_split_requests_are_as_few_and_as_even_as_the_limit_allows(n: int, rows: int) -> None:
    parts = chunks(n, rows)
    sizes = [p.stop - p.start for p in parts]
    assert len(parts) == -(-n // rows)
    assert [i for p in parts for i in range(p.start, p.stop)] == list(range(n))
    assert not sizes or (max(sizes) <= rows and max(sizes) - min(sizes) <= 1)


def test_vectors_must_be_one_or_two_dimensional(server: FakeServer) -> None:
    with client_for(server) as c, pytest.raises(ValueError):
        c.index("i", "ab" * 32).query(np.zeros((2, 2, 2)))
    with client_for(server) as c, pytest.raises(ValueError, match="ids"):
        c.index("i", "ab" * 32).upsert(["a"], np.zeros((2, 2)))


def test_duplicate_ids_across_split_requests_are_refused(server: FakeServer) -> None:
    from cluster.client.errors import InvalidRequestError

    ids, x = data(200)
    ids[150] = ids[3]
    with client_for(server, max_request_bytes=2000) as c, pytest.raises(InvalidRequestError):
        c.index("i", "ab" * 32).upsert(ids, x)
    assert server.paths == []  # refused before anything was sent


# -- text queries and text-only upserts -----------------------------------------------------
TEXTS = [f"note {i}: {'chest pain' if i % 3 else 'fever'} day {i}" for i in range(100)]


def test_text_upsert_sends_items_without_vectors(server: FakeServer) -> None:
    ids = [f"t{i}" for i in range(100)]
    meta = [{"n": i} if i % 2 else None for i in range(100)]
    with client_for(server) as c:  # 100 items: past binary_threshold, still the JSON route
        assert c.index("i", "ab" * 32).upsert(ids, metadata=meta, contents=TEXTS) == 100
    assert server.paths == ["/v1/vectors/upsert"]
    body = server.bodies[0]
    assert body["index_name"] == "i" and body["index_key"] == "ab" * 32
    assert body["items"][0] == {"id": "t0", "contents": TEXTS[0]}
    assert body["items"][1] == {"id": "t1", "contents": TEXTS[1], "metadata": {"n": 1}}
    assert all("vector" not in it for it in body["items"])
    assert server.ids == ids


def test_text_upsert_splits_by_encoded_size(server: FakeServer) -> None:
    ids = [f"t{i}" for i in range(100)]
    texts = [t * (1 + i % 7) for i, t in enumerate(TEXTS)]  # rows of different sizes
    with client_for(server, max_request_bytes=2000) as c:
        assert c.index("i", "ab" * 32).upsert(ids, contents=texts) == 100
    assert len(server.paths) > 3 and set(server.paths) == {"/v1/vectors/upsert"}
    assert max(server.sizes) <= 2000
    sent = [it for b in server.bodies for it in b["items"]]
    assert [it["id"] for it in sent] == ids and [it["contents"] for it in sent] == texts


@pytest.mark.parametrize(("sizes", "limit"), [([], 10), ([3, 3, 3], 6), ([9, 1, 1, 20, 2], 10)])
def test_pack_keeps_order_and_the_limit(sizes: list[int], limit: int) -> None:
    parts = pack(sizes, limit)
    assert [i for p in parts for i in range(p.start, p.stop)] == list(range(len(sizes)))
    assert all(sum(sizes[p]) <= limit or p.stop - p.start == 1 for p in parts)
    assert all(sum(sizes[a]) + sizes[b.start] > limit for a, b in itertools.pairwise(parts))


def test_text_query_sends_query_contents_and_gives_flat_results(server: FakeServer) -> None:
    ids = [f"t{i}" for i in range(30)]
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        idx.upsert(ids, contents=TEXTS[:30])
        r = idx.query(
            contents=TEXTS[4], top_k=3, n_probes=2, filters={"n": {"$gt": 1}}, rerank_mult=20
        )
    assert server.paths[-1] == "/v1/vectors/query"
    assert server.bodies[-1] == {
        "index_name": "i",
        "index_key": "ab" * 32,
        "query_contents": TEXTS[4],
        "top_k": 3,
        "n_probes": 2,
        "rerank_mult": 20,
        "filters": {"n": {"$gt": 1}},
    }
    assert r.ids.shape == (3,) and r.ids[0] == "t4" and list(r.counts) == [3]
    assert r.distances is not None and r.distances.shape == (3,) and r.distances[0] == 0


def test_async_text_query_and_upsert(server: FakeServer) -> None:
    async def go() -> QueryResult:
        transport = httpx.MockTransport(server)
        async with AsyncClient("http://vv.test", "k", transport=transport) as c:
            idx = c.index("i", "ab" * 32)
            assert await idx.upsert(["a", "b"], contents=["fever", "cough"]) == 2
            return await idx.query(contents="cough", top_k=2)

    r = asyncio.run(go())
    assert server.bodies[0]["items"] == [
        {"id": "a", "contents": "fever"},
        {"id": "b", "contents": "cough"},
    ]
    assert server.bodies[1]["query_contents"] == "cough" and "query_vectors" not in server.bodies[1]
    assert list(r.ids) == ["b", "a"]


def test_text_arguments_are_checked_before_sending(server: FakeServer) -> None:
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        with pytest.raises(ValueError, match="exactly one"):
            idx.query(top_k=3)
        with pytest.raises(ValueError, match="exactly one"):
            idx.query(np.zeros(D_TEXT), contents="fever")
        with pytest.raises(ValueError, match="binary"):
            idx.query(contents="fever", binary=True)
        with pytest.raises(TypeError, match="str"):
            idx.query(contents=["fever", "cough"])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="contents"):
            idx.upsert(["a"])
        with pytest.raises(ValueError, match="'b' has neither"):
            idx.upsert(["a", "b"], contents=["fever", None])
        with pytest.raises(ValueError, match="binary"):
            idx.upsert(["a"], contents=["fever"], binary=True)
    assert server.paths == []


# -- explicit keyword arguments of train and create_index ----------------------------------
def test_train_sends_its_parameters_and_refuses_unknown_ones(server: FakeServer) -> None:
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        assert idx.train(n_lists=256, max_iters=5, tolerance=0.0) == "success"
        assert idx.train() == "success"
        with pytest.raises(TypeError, match="n_list"):
            idx.train(n_list=256)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            idx.train(256)  # type: ignore[misc]
    assert server.paths == ["/v1/indexes/train"] * 2
    ref = {"index_name": "i", "index_key": "ab" * 32}
    assert server.bodies == [{**ref, "n_lists": 256, "max_iters": 5, "tolerance": 0.0}, ref]


def test_create_index_sends_its_parameters_and_refuses_unknown_ones(server: FakeServer) -> None:
    with client_for(server) as c:
        c.create_index(
            "docs",
            "ab" * 32,
            index_type="ivfpq",
            dimension=384,
            metric="cosine",
            pq_dim=48,
            pq_bits=8,
            n_lists=64,
            embedding_model="all-MiniLM-L6-v2",
            n_shards=2,
        )
        with pytest.raises(TypeError, match="n_list"):
            c.create_index("docs", "ab" * 32, n_list=64)  # type: ignore[call-arg]
        c.create_index("half", "ab" * 32, index_type="ivf", sq_bits=16)
        with pytest.raises(TypeError, match="type"):
            c.create_index("docs", "ab" * 32, type="ivf")  # type: ignore[call-arg]
    assert server.paths == ["/v1/indexes/create"] * 2
    assert server.bodies[0] == {
        "index_name": "docs",
        "index_key": "ab" * 32,
        "index_config": {
            "type": "ivfpq",
            "dimension": 384,
            "pq_dim": 48,
            "pq_bits": 8,
            "n_lists": 64,
        },
        "metric": "cosine",
        "embedding_model": "all-MiniLM-L6-v2",
        "n_shards": 2,
    }
    assert server.bodies[1]["index_config"] == {"type": "ivf", "sq_bits": 16}


def test_async_train_and_create_refuse_unknown_keywords(server: FakeServer) -> None:
    async def go() -> None:
        transport = httpx.MockTransport(server)
        async with AsyncClient("http://vv.test", "k", transport=transport) as c:
            idx = await c.create_index("t", "ab" * 32, embedding_model="all-MiniLM-L6-v2")
            assert await idx.train(n_lists=8) == "success"
            with pytest.raises(TypeError, match="n_list"):
                await idx.train(n_list=8)  # type: ignore[call-arg]
            with pytest.raises(TypeError, match="embeding_model"):
                await c.create_index("t", "ab" * 32, embeding_model="x")  # type: ignore[call-arg]

    asyncio.run(go())
    assert server.paths == ["/v1/indexes/create", "/v1/indexes/train"]
    assert server.bodies[0] == {
        "index_name": "t",
        "index_key": "ab" * 32,
        "index_config": {},
        "embedding_model": "all-MiniLM-L6-v2",
    }
    assert server.bodies[1]["n_lists"] == 8


# -- vector and contents in query results ---------------------------------------------------
def with_contents(server: FakeServer, n: int = 100) -> tuple[list[str], np.ndarray, list[Any]]:
    """``n`` items in one upsert (the array route from 64), every third without contents."""
    ids, x = data(n)
    texts = [None if i % 3 == 0 else f"text {i}" for i in range(n)]
    with client_for(server) as c:
        c.index("i", "ab" * 32).upsert(ids, x, contents=texts)
    assert len(server.paths) == 1
    return ids, x, texts


def test_query_results_carry_vector_and_contents_when_asked(server: FakeServer) -> None:
    ids, x, texts = with_contents(server)
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        plain = idx.query(x[:80], top_k=4)  # 80 >= binary_threshold: the array route
        r = idx.query(x[:80], top_k=4, include=["distance", "vector", "contents"])
    assert server.paths[1:] == ["/v1/vectors/query_arrays", "/v1/vectors/query"]
    assert server.bodies[-1]["include"] == ["distance", "vector", "contents"]
    assert plain.vectors is None and plain.contents is None
    assert r.vectors is not None and r.contents is not None
    assert r.vectors.shape == r.contents.shape == r.ids.shape == (80, 4)
    np.testing.assert_array_equal(r.ids, plain.ids)
    for q in range(80):
        for j, item_id in enumerate(r.ids[q]):
            row = ids.index(item_id)
            assert r.vectors[q, j].dtype == np.float32
            np.testing.assert_array_equal(r.vectors[q, j], x[row])
            assert r.contents[q, j] == texts[row]  # None for items stored without contents
    assert r.contents[0, 0] is None and r.contents[1, 0] == "text 1"


def test_single_and_text_queries_give_flat_vector_and_contents(server: FakeServer) -> None:
    _, x, _ = with_contents(server, 10)
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        r = idx.query(x[2], top_k=3, include=["vector", "contents"])
        t = idx.query(contents="fever", top_k=2, include=["contents"])
    assert r.vectors is not None and r.contents is not None
    assert r.ids.shape == r.vectors.shape == r.contents.shape == (3,)
    assert r.ids[0] == "id-2" and r.contents[0] == "text 2"
    np.testing.assert_array_equal(r.vectors[0], x[2])
    assert t.vectors is None and t.contents is not None and t.contents.shape == (2,)
    assert server.bodies[-1]["include"] == ["contents"]


def test_padding_and_vectorless_indexes_leave_none(server: FakeServer) -> None:
    _, x, _ = with_contents(server, 4)
    server.keeps_vectors = False  # as ivf/ivfpq: the answer has no vector
    with client_for(server) as c:
        r = c.index("i", "ab" * 32).query(x[:2], top_k=6, include=["vector", "contents"])
    assert r.vectors is not None and r.contents is not None  # asked for: always arrays
    assert r.vectors.shape == (2, 6) and all(v is None for v in r.vectors.ravel())
    assert list(r.counts) == [4, 4] and r.contents[0, 4] is None and r.contents[0, 5] is None


def test_split_queries_reassemble_vector_and_contents(server: FakeServer) -> None:
    ids, x, texts = with_contents(server, 300)
    with client_for(server, max_request_bytes=8 * 20 * 40) as c:  # ~ 35 JSON rows per request
        r = c.index("i", "ab" * 32).query(x, top_k=1, include=["vector", "contents"])
    assert len(server.paths) > 5 and set(server.paths[1:]) == {"/v1/vectors/query"}
    assert r.vectors is not None and r.contents is not None
    assert list(r.ids[:, 0]) == ids and list(r.contents[:, 0]) == texts
    np.testing.assert_array_equal(np.stack(r.vectors[:, 0]), x)


def test_binary_with_vector_or_contents_is_refused_before_sending(server: FakeServer) -> None:
    _, x = data(80)
    with client_for(server) as c:
        idx = c.index("i", "ab" * 32)
        with pytest.raises(ValueError, match="cannot return vector"):
            idx.query(x, top_k=3, include=["vector"], binary=True)
        with pytest.raises(ValueError, match="cannot return contents"):
            idx.query(x[0], top_k=3, include=["distance", "contents"], binary=True)
    assert server.paths == []


def test_async_query_carries_vector_and_contents(server: FakeServer) -> None:
    _, x, texts = with_contents(server)

    async def go() -> QueryResult:
        transport = httpx.MockTransport(server)
        async with AsyncClient("http://vv.test", "k", transport=transport) as c:
            return await c.index("i", "ab" * 32).query(
                x[:70], top_k=2, include=["vector", "contents"]
            )

    r = asyncio.run(go())
    assert server.paths[-1] == "/v1/vectors/query"
    assert r.vectors is not None and r.contents is not None
    np.testing.assert_array_equal(np.stack(r.vectors[:, 0]), x[:70])
    assert list(r.contents[:, 0]) == texts[:70]
