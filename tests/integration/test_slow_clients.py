"""Slow clients cannot take the service down: connections that trickle a body (with a key or
without) neither starve /v1/health nor authenticated traffic, and each is cut off by the
body-read deadline. Loopback only; bounded in connections and time."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.integration.conftest import API_KEY, BODY_IDLE_TIMEOUT_S, Service
from tests.integration.support import Index, ok

KEYED = 80  # more than the 64 requests a gateway used to take in at once
UNKEYED = 20
DECLARED = 100_000  # bytes each slow client announces and never finishes sending


async def open_trickle(host: str, port: int, key: str | None, path: str) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection(host, port)
    headers = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {DECLARED}",
    ]
    if key is not None:
        headers.append(f"X-API-Key: {key}")
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + b'{"index_name": "')
    await writer.drain()
    writer.reader = reader  # type: ignore[attr-defined]
    return writer


async def trickle(writer: asyncio.StreamWriter, until: float) -> None:
    """One byte now and then: slower than any deadline allows, faster than the idle gap."""
    try:
        while time.monotonic() < until:
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(BODY_IDLE_TIMEOUT_S / 3)
    except (ConnectionError, OSError):
        return  # the server cut it off


async def status_of(writer: asyncio.StreamWriter, timeout: float) -> int | None:
    """The status the server answered the slow client with (None: none within ``timeout``)."""
    try:
        line = await asyncio.wait_for(writer.reader.readline(), timeout)  # type: ignore[attr-defined]
    except (asyncio.TimeoutError, ConnectionError, OSError):
        return None
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 else None


@pytest.mark.slow
def test_trickling_bodies_neither_starve_others_nor_stay(service: Service, make_index) -> None:
    idx: Index = make_index(dimension=4)
    idx.upsert([{"id": "a", "vector": [1.0, 0.0, 0.0, 0.0]}])
    url = urlsplit(service.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80

    async def scenario() -> tuple[list[float], list[int | None]]:
        writers = []  # with a valid key (held until the deadline), then without one
        for key in [API_KEY] * KEYED + [None] * UNKEYED:
            writers.append(await open_trickle(host, port, key, "/v1/vectors/query"))
        until = time.monotonic() + 3 * BODY_IDLE_TIMEOUT_S
        tricklers = [asyncio.create_task(trickle(w, until)) for w in writers]
        latencies = []
        async with httpx.AsyncClient(
            base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=10
        ) as client:
            for _ in range(5):
                t = time.monotonic()
                assert (await client.get("/v1/health")).status_code == 200
                body = idx.body(query_vectors=[1.0, 0.0, 0.0, 0.0], top_k=1)
                r = await client.post("/v1/vectors/query", json=body)
                assert r.status_code == 200 and r.json()["results"][0]["id"] == "a"
                latencies.append(time.monotonic() - t)
                await asyncio.sleep(0.5)
        statuses = await asyncio.gather(
            *(status_of(w, 4 * BODY_IDLE_TIMEOUT_S + 10) for w in writers)
        )
        for task in tricklers:
            task.cancel()
        for w in writers:
            w.close()
        return latencies, list(statuses)

    latencies, statuses = asyncio.run(scenario())
    assert max(latencies) < 2, latencies
    # With a key: 408 once the body stops arriving fast enough. Without one: 401 at once.
    assert statuses == [408] * KEYED + [401] * UNKEYED, statuses
    ok(httpx.get(f"{service.url}/v1/health"))
