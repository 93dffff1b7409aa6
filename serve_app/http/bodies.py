"""Request bodies and JSON answers: bodies read under the configured limits (size, stalls,
rate) and parsed with orjson; the answer class; the route class that reads bodies that way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Message, Receive

from actors.errors import PayloadTooLarge
from serve_app import constants, replica
from serve_app.gateway.calls import retry_stale, within

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS)


def too_large(limit: int) -> HTTPException:
    # An HTTPException: FastAPI turns anything else raised while reading the body into a 400.
    return HTTPException(PayloadTooLarge.status_code, f"request body exceeds {limit} bytes")


def too_slow(detail: str) -> HTTPException:
    return HTTPException(408, f"request body {detail}; send it at once")


class OrjsonRequest(Request):
    """Parses JSON bodies with orjson and enforces the configured body limits: its size, the
    longest gap between two of its chunks, and (past that grace) its average rate, so a client
    that trickles a body holds the gateway for seconds, not for as long as it likes."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            settings = replica.settings()
            limit = settings.max_body_bytes
            declared = self.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise too_large(limit)
            idle, rate = settings.body_idle_timeout_s, settings.body_min_rate
            clock = asyncio.get_running_loop().time
            start = clock()
            chunks = []
            size = 0
            more = not self._stream_consumed
            while more:  # the ASGI messages themselves: a small body is one message
                try:
                    message = await within(self._receive(), idle)
                except asyncio.TimeoutError:
                    raise too_slow(f"stalled for {idle:g} s") from None
                if message["type"] == "http.disconnect":
                    self._is_disconnected = True
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                more = message.get("more_body", False)
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                elapsed = clock() - start
                if elapsed > idle and size < rate * elapsed:
                    raise too_slow(f"arrived at under {rate} bytes/s")
                chunks.append(chunk)
            self._stream_consumed = True
            self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            # A large body parses in a worker thread: the event loop keeps its turns of the
            # GIL meanwhile, so one big request does not stall the others (health included).
            if len(body) > constants.INLINE_PARSE_BYTES:
                self._json = await asyncio.to_thread(orjson.loads, body)
            else:
                self._json = orjson.loads(body)
        return self._json


class Route(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            req = OrjsonRequest(request.scope, request.receive)  # caches the body: re-runnable
            return await retry_stale(lambda: handler(req))

        return route


# What FastAPI answers when reading a body fails otherwise than by its limits (a client that
# went away mid-body, say).
BODY_ERROR = HTTPException(400, "There was an error parsing the body")


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app that reads a request whose body was read already."""
    pending = True

    async def again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
