"""The gateway gives its heap's free pages back once it goes quiet after large requests
(actors.process.heap.IdleTrim, serve_app.http): an ingest's buffers do not stay resident after it ends,
however its last requests fall, and a steady load never waits for a trim."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from actors.process.heap import IdleTrim
from serve_app.http import trim as http

MB = 1 << 20


def test_trims_once_quiet_after_enough_was_read() -> None:
    idle = IdleTrim(10 * MB, quiet_s=1.0)
    idle.begin()
    idle.begin()
    assert idle.end(8 * MB) is None  # another request is still in flight
    mark = idle.end(4 * MB)  # the last one ends: 12 MB read since the last trim
    assert mark is not None
    assert idle.due(mark)
    assert not idle.due(mark)  # counted afresh after a trim
    idle.begin()
    assert idle.end(1 * MB) is None


def test_a_request_in_the_quiet_time_puts_the_trim_off_to_the_burst_end() -> None:
    idle = IdleTrim(10 * MB, quiet_s=1.0)
    marks = []
    for _ in range(4):  # a burst of 4 MB requests: 12 MB read after the third
        idle.begin()
        marks.append(idle.end(4 * MB))
    assert marks[:2] == [None, None]
    assert marks[2] is not None and not idle.due(marks[2])  # the fourth had begun
    assert marks[3] is not None and idle.due(marks[3])  # the burst's end: all 16 MB


def test_small_requests_never_trim() -> None:
    idle = IdleTrim(10 * MB, quiet_s=1.0)
    for _ in range(9):
        idle.begin()
        assert idle.end(1 * MB) is None


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


def test_the_gateway_trims_after_large_bodies_once_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []

    def trim(collect: bool = False) -> bool:
        trims.append(1)
        return True

    monkeypatch.setattr(http, "IDLE_TRIM", IdleTrim(4 * MB, quiet_s=0.2))
    monkeypatch.setattr(http.heap, "trim", trim)

    async def request() -> Any:
        app, messages = body_reader(MB, 3)  # 3 MB each: the threshold is crossed by the second
        queue = list(messages)
        answers: list[Any] = []

        async def receive() -> Any:
            return queue.pop(0)

        async def send(message: Any) -> None:
            answers.append(message)

        await http.tidied(app, {"type": "http"}, receive, send)
        return answers[-1]["body"]

    async def run() -> None:
        assert await request() == b"ok"
        assert await request() == b"ok"
        await asyncio.sleep(0.1)
        assert trims == []  # not quiet long enough yet
        with http.counted_call(2 * MB):  # a call of the Ray transport
            pass
        await asyncio.sleep(0.15)
        assert trims == []  # the call put it off
        for _ in range(100):  # quiet now: the trim runs in a thread of its own
            if trims:
                break
            await asyncio.sleep(0.02)
        assert trims == [1]

    asyncio.run(run())


class Node:
    """An object in a reference cycle: only the cycle collector frees it."""

    def __init__(self) -> None:
        self.me = self
        self.buffer = bytearray(MB)


def test_garbage_left_in_cycles_is_collected_before_the_trim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "IDLE_TRIM", IdleTrim(MB, quiet_s=0.05))
    monkeypatch.setattr(http.heap, "trim", lambda collect=False: True)

    async def run() -> weakref.ref[Node]:
        garbage = weakref.ref(Node())  # what a finished request left behind
        with http.counted_call(2 * MB):
            pass
        for _ in range(100):
            if garbage() is None:
                break
            await asyncio.sleep(0.02)
        return garbage

    gc.disable()  # no collection but the trim's
    try:
        assert asyncio.run(run())() is None
    finally:
        gc.enable()


def test_a_polling_thread_sees_quiet_only_after_a_whole_period_without_requests() -> None:
    idle = IdleTrim(0, quiet_s=1.0)
    assert idle.quiet()  # nothing ran
    idle.begin()
    assert not idle.quiet()  # one began
    assert not idle.quiet()  # ... and is still in flight
    assert idle.end(0) is not None
    assert not idle.quiet()  # it ended within this period
    assert idle.quiet()  # a whole period without requests
