"""The client's error mapping and retry policy, against an httpx MockTransport (no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from cluster.client import AsyncClient, Client, Retry
from cluster.client import clients as client_mod
from cluster.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidRequestError,
    PayloadTooLargeError,
    ServerError,
    UnavailableError,
    VaultvecClientError,
)

Handler = Callable[[httpx.Request], httpx.Response]


def error(status: int, detail: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"status_code": status, "detail": detail, **extra})


def counting(responses: list[Any]) -> tuple[Handler, list[httpx.Request]]:
    """A handler answering (or raising) the given items in turn, recording the requests."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses[min(len(seen), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return handler, seen


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the client's backoff sleeps instead of sleeping."""
    slept: list[float] = []
    monkeypatch.setattr(client_mod, "pause", slept.append)

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr(client_mod, "apause", fake_sleep)
    return slept


def make(handler: Handler, **kw: Any) -> Client:
    return Client("http://vv.test", "api-key", transport=httpx.MockTransport(handler), **kw)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (401, AuthenticationError),
        (404, IndexNotFoundError),
        (409, IndexExistsError),
        (413, PayloadTooLargeError),
        (422, InvalidRequestError),
        (500, ServerError),
        (502, ServerError),
    ],
)
def test_typed_exception_per_status_no_retry(
    status: int, cls: type[VaultvecClientError], sleeps: list[float]
) -> None:
    handler, seen = counting([error(status, f"detail for {status}", errors=[{"loc": ["x"]}])])
    with make(handler) as c, pytest.raises(cls) as info:
        c.list_indexes()
    assert info.value.status_code == status
    assert info.value.detail == f"detail for {status}"
    assert info.value.errors == [{"loc": ["x"]}]
    assert str(status) in str(info.value)
    assert len(seen) == 1 and sleeps == []  # only 503 and connection errors are retried


def test_non_json_error_body_keeps_text(sleeps: list[float]) -> None:
    handler, _ = counting([httpx.Response(500, text="upstream exploded")])
    with make(handler) as c, pytest.raises(ServerError, match="upstream exploded"):
        c.health()


def test_503_is_retried_then_succeeds(sleeps: list[float]) -> None:
    ok = httpx.Response(200, json={"indexes": ["a"]})
    handler, seen = counting([error(503, "shard down"), error(503, "shard down"), ok])
    with make(handler, retry=Retry(attempts=5, backoff_s=0.1, max_backoff_s=1.0)) as c:
        assert c.list_indexes() == ["a"]
    assert len(seen) == 3 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2  # full jitter under the cap


def test_503_gives_up_with_the_server_detail(sleeps: list[float]) -> None:
    handler, seen = counting([error(503, "a shard of this index is unavailable")])
    with make(handler, retry=Retry(attempts=4)) as c, pytest.raises(UnavailableError) as info:
        c.list_indexes()
    assert info.value.detail == "a shard of this index is unavailable"
    assert len(seen) == 4 and len(sleeps) == 3


def test_retry_after_is_honoured_but_capped(sleeps: list[float]) -> None:
    busy = httpx.Response(
        503, json={"status_code": 503, "detail": "busy"}, headers={"Retry-After": "3"}
    )
    never = httpx.Response(
        503, json={"status_code": 503, "detail": "busy"}, headers={"Retry-After": "60"}
    )
    ok = httpx.Response(200, json={"indexes": []})
    handler, _ = counting([busy, never, ok])
    with make(handler, retry=Retry(attempts=5, backoff_s=0.01, max_backoff_s=5.0)) as c:
        c.list_indexes()
    assert sleeps[0] >= 3 and sleeps[1] == 5.0


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("server disconnected"),
        httpx.ReadError("reset"),
    ],
)
def test_connection_errors_are_retried(exc: Exception, sleeps: list[float]) -> None:
    handler, seen = counting([exc, exc, httpx.Response(200, json={"indexes": ["x"]})])
    with make(handler) as c:
        assert c.list_indexes() == ["x"]
    assert len(seen) == 3 and len(sleeps) == 2


def test_connection_errors_give_up(sleeps: list[float]) -> None:
    handler, seen = counting([httpx.ConnectError("refused")])
    with make(handler, retry=Retry(attempts=3)) as c, pytest.raises(ConnectionFailedError):
        c.list_indexes()
    assert len(seen) == 3


def test_timeouts_are_not_retried(sleeps: list[float]) -> None:
    handler, seen = counting([httpx.ReadTimeout("slow")])
    with make(handler) as c, pytest.raises(httpx.ReadTimeout):
        c.list_indexes()
    assert len(seen) == 1 and sleeps == []


def test_backoff_is_jittered_and_bounded() -> None:
    r = Retry(attempts=10, backoff_s=0.2, max_backoff_s=2.0)
    for attempt in range(10):
        cap = min(2.0, 0.2 * 2**attempt)
        samples = [r.delay(attempt) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert len(set(samples)) > 150  # jittered, not a fixed schedule
    assert max(r.delay(30) for _ in range(100)) <= 2.0


def test_requests_carry_the_api_key_and_orjson_bodies(sleeps: list[float]) -> None:
    handler, seen = counting([httpx.Response(200, json={"status": "success", "message": "ok"})])
    with make(handler) as c:
        idx = c.create_index("docs", "ab" * 32, dimension=4, metric="cosine", n_shards=3)
    req = seen[0]
    assert req.headers["X-API-Key"] == "api-key"
    assert req.url.path == "/v1/indexes/create"
    body = orjson.loads(req.content)
    assert body == {
        "index_name": "docs",
        "index_key": "ab" * 32,
        "index_config": {"dimension": 4},
        "metric": "cosine",
        "n_shards": 3,
    }
    assert "ab" * 32 not in repr(idx)


def test_connections_are_pooled() -> None:
    """One httpx client per Client: every call reuses it (keep-alive)."""
    handler, seen = counting([httpx.Response(200, json={"indexes": []})])
    with make(handler) as c:
        pool = c.http
        for _ in range(3):
            c.list_indexes()
        assert c.http is pool and len(seen) == 3


def test_async_client_retries_and_raises_typed(sleeps: list[float]) -> None:
    ok = httpx.Response(200, json={"result": 7})
    handler, seen = counting([error(503, "down"), httpx.ConnectError("refused"), ok])

    async def go() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncClient("http://vv.test", "k", transport=transport) as c:
            assert await c.index("i", "ab" * 32).num_vectors() == 7
        handler2, _ = counting([error(404, "index 'i' not found")])
        async with AsyncClient("http://vv.test", "k", transport=httpx.MockTransport(handler2)) as c:
            with pytest.raises(IndexNotFoundError, match="not found"):
                await c.index("i", "ab" * 32).describe()

    asyncio.run(go())
    assert len(seen) == 3 and len(sleeps) == 2
