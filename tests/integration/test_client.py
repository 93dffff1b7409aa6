"""The Python client (sync and async) against the real server over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from cluster.client import AsyncClient, Client, generate_key
from cluster.client.errors import (
    AuthenticationError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidRequestError,
)
from tests.helpers import clustered, exact_knn
from tests.integration.conftest import API_KEY, Service
from tests.integration.support import unique_name

D = 12


@pytest.fixture()
def vv(service: Service) -> Iterator[Client]:
    with Client(service.url, API_KEY) as c:
        yield c


def test_index_lifecycle(vv: Client) -> None:
    name, key = unique_name("client"), generate_key()
    idx = vv.create_index(name, key, dimension=D)
    try:
        assert name in vv.list_indexes()
        with pytest.raises(IndexExistsError) as exists:
            vv.create_index(name, generate_key())
        assert exists.value.status_code == 409 and name in exists.value.detail

        x = clustered(400, D, n_clusters=8, seed=2)
        ids = [f"i{j}" for j in range(400)]
        meta = [{"j": j} for j in range(400)]
        contents = [f"doc {j}" for j in range(400)]
        assert idx.upsert(ids[:10], x[:10], meta[:10], contents[:10]) == 10  # JSON route
        assert idx.upsert(ids[10:], x[10:], meta[10:], contents[10:]) == 390  # array route
        assert idx.num_vectors() == 400 and sorted(idx.list_ids()) == sorted(ids)
        desc = idx.describe()
        assert desc["index_name"] == name and desc["num_vectors"] == 400

        q = x[::20] + 0.05
        res = idx.query(q, top_k=5)  # untrained: exact search
        exact_d, exact_rows = exact_knn(x, q, 5)
        assert res.ids.shape == (20, 5) and res.distances is not None
        np.testing.assert_allclose(res.distances, exact_d, rtol=1e-4, atol=1e-4)
        assert res.ids[0, 0] == ids[exact_rows[0, 0]]
        assert res.metadata is not None and res.metadata[0, 0] == {"j": int(exact_rows[0, 0])}
        json_res = idx.query(q, top_k=5, binary=False)
        np.testing.assert_array_equal(res.ids, json_res.ids)
        np.testing.assert_allclose(res.distances, json_res.distances)

        one = idx.query(x[7], top_k=3, include=["distance"])
        assert one.ids.shape == (3,) and one.ids[0] == "i7" and one.metadata is None
        # vector and contents: only the JSON answer has them, even for a batch of 64+
        full = idx.query(x[:80], top_k=2, include=["distance", "vector", "contents"])
        assert full.vectors is not None and full.contents is not None and full.metadata is None
        assert full.vectors.shape == full.contents.shape == (80, 2)
        for row, (hit, vec, text) in enumerate(
            zip(full.ids[:, 0], full.vectors[:, 0], full.contents[:, 0])
        ):
            assert hit == ids[row] and text == contents[row]
            np.testing.assert_array_equal(vec, x[row])
        assert one.vectors is None and one.contents is None

        got = idx.get(["i3", "nope", "i1"])
        assert [g["id"] for g in got] == ["i3", "i1"]
        np.testing.assert_array_equal(got[0]["vector"], x[3])
        assert got[0]["contents"] == "doc 3" and got[0]["metadata"] == {"j": 3}

        assert idx.delete(["i3", "i4", "absent"]) == 2 and idx.num_vectors() == 398
        assert idx.train(n_lists=4, max_iters=5) in ("success", "in_progress")
        with pytest.raises(TypeError):
            idx.train(n_list=4)  # type: ignore[call-arg]
    finally:
        idx.drop()
    with pytest.raises(IndexNotFoundError):
        idx.describe()


def test_typed_errors_carry_the_server_detail(vv: Client, service: Service) -> None:
    name, key = unique_name("client"), generate_key()
    idx = vv.create_index(name, key, dimension=D)
    try:
        with pytest.raises(InvalidRequestError) as bad:
            idx.query(np.ones((3, D + 1)), top_k=2)
        assert (
            bad.value.detail == f"query_vectors has dimension {D + 1}, the index has dimension {D}"
        )
        with pytest.raises(InvalidRequestError, match="NaN"):
            idx.upsert(["a"] * 70, np.full((70, D), np.nan))  # array route
        with pytest.raises(InvalidRequestError, match="more than once"):
            idx.upsert(["a", "a"], np.ones((2, D)))
        with pytest.raises(AuthenticationError):
            vv.index(name, generate_key()).num_vectors()
        with Client(service.url, "wrong-api-key") as other, pytest.raises(AuthenticationError):
            other.index(name, key).num_vectors()
        with pytest.raises(IndexNotFoundError):
            vv.index(unique_name("missing"), key).query(np.ones(D))
    finally:
        idx.drop()


def test_large_batches_split_across_requests(service: Service) -> None:
    x = clustered(3000, D, seed=4)
    ids = [str(j) for j in range(3000)]
    with Client(service.url, API_KEY, max_request_bytes=20_000) as c:  # ~290 rows per request
        idx = c.create_index(unique_name("client"), generate_key(), dimension=D)
        try:
            assert idx.upsert(ids, x) == 3000
            res = idx.query(x, top_k=1, include=["distance"])
            assert list(res.ids[:, 0]) == ids
        finally:
            idx.drop()


def test_async_client(service: Service) -> None:
    x = clustered(500, D, seed=6)

    async def go() -> None:
        async with AsyncClient(service.url, API_KEY, concurrency=3) as c:
            idx = await c.create_index(unique_name("aclient"), generate_key(), dimension=D)
            try:
                assert await idx.upsert([str(j) for j in range(500)], x) == 500
                parts = await asyncio.gather(
                    *(idx.query(x[s : s + 100], top_k=1) for s in range(0, 500, 100))
                )
                assert [p.ids[0, 0] for p in parts] == ["0", "100", "200", "300", "400"]
                assert await idx.num_vectors() == 500
                assert (await idx.describe())["num_vectors"] == 500
                with pytest.raises(InvalidRequestError, match="dimension"):
                    await idx.query(np.ones((80, D + 2)))
                assert idx.name in await c.list_indexes()
            finally:
                await idx.drop()

    asyncio.run(go())


def test_text_search(vv: Client) -> None:
    """create_index(embedding_model=...), text-only upserts and query(contents=...)."""
    from serve_app.embedder import DEFAULT_MODEL, builtin_models, runtime_installed

    if not (runtime_installed() and DEFAULT_MODEL in builtin_models()):
        pytest.skip("embeddings extra not installed")
    docs = {
        "gzip": "gzip is a command-line tool that compresses files to save disk space",
        "bread": "knead the dough, let it rise for an hour, then bake the loaf at 220 degrees",
        "whale": "blue whales are the largest animals that have ever lived in the ocean",
        "rain": "heavy rain and strong winds are forecast for tomorrow afternoon",
    }
    idx = vv.create_index(unique_name("ctext"), generate_key(), embedding_model=DEFAULT_MODEL)
    try:
        meta = [{"topic": name} for name in docs]
        assert idx.upsert(list(docs), metadata=meta, contents=list(docs.values())) == 4
        assert idx.describe()["embedding_model"] == DEFAULT_MODEL
        res = idx.query(contents="the biggest creature in the sea", top_k=2)
        assert res.ids.shape == (2,) and res.ids[0] == "whale"
        assert res.metadata is not None and res.metadata[0] == {"topic": "whale"}
        assert res.distances is not None and res.distances[0] <= res.distances[1]
        got = idx.get(["rain"], include=["contents"])
        assert [g["id"] for g in got] == ["rain"] and got[0]["contents"] == docs["rain"]
    finally:
        idx.drop()


def test_async_text_query(service: Service) -> None:
    from serve_app.embedder import DEFAULT_MODEL, builtin_models, runtime_installed

    if not (runtime_installed() and DEFAULT_MODEL in builtin_models()):
        pytest.skip("embeddings extra not installed")

    async def go() -> None:
        async with AsyncClient(service.url, API_KEY) as c:
            name = unique_name("actext")
            idx = await c.create_index(name, generate_key(), embedding_model=DEFAULT_MODEL)
            try:
                texts = ["a cat chased a mouse", "file your income tax return before April"]
                assert await idx.upsert(["cat", "tax"], contents=texts) == 2
                res = await idx.query(contents="which pet hunts mice", top_k=1)
                assert list(res.ids) == ["cat"]
            finally:
                await idx.drop()

    asyncio.run(go())
