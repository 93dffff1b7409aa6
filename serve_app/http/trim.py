"""The gateway's memory between requests: freed buffers kept at the top of its heap while busy,
given back to the system once requests are over (actors.process.heap.IdleTrim)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Iterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.process import heap
from serve_app import constants

# The gateway keeps freed memory at the top of its heap while busy (actors.process.heap): once
# requests have read IDLE_TRIM_AFTER_BYTES and none has begun for IDLE_TRIM_QUIET_S
# (serve_app.constants), it gives the free pages back (an ingest's buffers: docs/performance.md,
# Footprint). The Ray transport's calls count too.
IDLE_TRIM = heap.IdleTrim(constants.IDLE_TRIM_AFTER_BYTES, quiet_s=constants.IDLE_TRIM_QUIET_S)


def request_ended(read_bytes: int) -> None:
    """After ``IDLE_TRIM.begin()``, on the event loop: a trim is checked once quiet."""
    mark = IDLE_TRIM.end(read_bytes)
    if mark is not None:
        asyncio.get_running_loop().call_later(IDLE_TRIM.quiet_s, _trim_if_due, mark)


@contextlib.contextmanager
def counted_call(read_bytes: int) -> Iterator[None]:
    """A call of the Ray transport, whose arguments came to ``read_bytes``, counted like a
    request (on the event loop)."""
    IDLE_TRIM.begin()
    try:
        yield
    finally:
        request_ended(read_bytes)


def _trim_if_due(mark: int) -> None:
    if IDLE_TRIM.due(mark):
        # Garbage first, here on the loop (finalizers of asyncio objects expect its thread):
        # buffers that finished requests left in reference cycles are freed only by a
        # collection, which a quiet process does not start. malloc_trim walks the whole heap:
        # off the loop.
        gc.collect()
        threading.Thread(target=heap.trim, name="vaultvec-trim", daemon=True).start()


async def tidied(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app`` for the request, counting the body bytes it reads (:data:`IDLE_TRIM`)."""
    read = 0

    async def counted() -> Message:
        nonlocal read
        message = await receive()
        read += len(message.get("body", b""))
        return message

    IDLE_TRIM.begin()
    try:
        await app(scope, counted, send)
    finally:
        request_ended(read)
