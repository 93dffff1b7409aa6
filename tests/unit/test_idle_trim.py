"""The gateway gives its heap's free pages back once it goes idle after large requests
(actors.heap.IdleTrim, serve_app.http.tidied): an ingest's buffers do not stay resident after
it ends, and a steady load never waits for a trim."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actors.heap import IdleTrim
from serve_app import http

MB = 1 << 20


def test_trims_once_idle_after_enough_was_read() -> None:
    idle = IdleTrim(10 * MB)
    idle.begin()
    idle.begin()
    assert not idle.end(8 * MB)  # another request is still in flight
    assert idle.end(4 * MB)  # the last one ends: 12 MB read since the last trim
    idle.begin()
    assert not idle.end(1 * MB)  # counted afresh after a trim


def test_small_requests_never_trim() -> None:
    idle = IdleTrim(10 * MB)
    for _ in range(9):
        idle.begin()
        assert not idle.end(1 * MB)


def body_reader(chunk: int, chunks: int) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent = [{"type": "http.request", "body": b"x" * chunk, "more_body": True}] * (chunks - 1)
    sent.append({"type": "http.request", "body": b"x" * chunk, "more_body": False})
    return app, sent


def test_the_gateway_trims_after_a_large_body_once_no_request_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    def trim() -> bool:
        trims.append(1)
        return True

    monkeypatch.setattr(http, "IDLE_TRIM", IdleTrim(16 * MB))
    monkeypatch.setattr(http.heap, "trim", trim)

    async def run() -> None:
        app, messages = body_reader(MB, 20)
        queue = list(messages)
        answers: list[Any] = []

        async def receive() -> Any:
            return queue.pop(0)

        async def send(message: Any) -> None:
            answers.append(message)

        await http.tidied(app, {"type": "http"}, receive, send)
        await asyncio.sleep(0.05)  # the trim runs in the loop's executor
        assert answers[-1]["body"] == b"ok"

    asyncio.run(run())
    assert trims == [1]
