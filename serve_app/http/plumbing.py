"""HTTP plumbing shared by the routers: orjson bodies, the body-size limit, API-key auth."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import threading
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Mapping
from typing import Any

import orjson
from fastapi import HTTPException, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.errors import PayloadTooLarge
from actors.process import heap
from serve_app.access import context, keys
from serve_app.access.limits import RateLimiter
from serve_app.gateway.engine import retry_stale, within
from serve_app.http.errors import error_response, response_for
from serve_app.settings import NO_LIMITS, Limits

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS)


def too_large(limit: int) -> HTTPException:
    # An HTTPException: FastAPI turns anything else raised while reading the body into a 400.
    return HTTPException(PayloadTooLarge.status_code, f"request body exceeds {limit} bytes")


INLINE_PARSE_BYTES = 1 << 20  # ~3 ms of orjson parsing


def too_slow(detail: str) -> HTTPException:
    return HTTPException(408, f"request body {detail}; send it at once")


class OrjsonRequest(Request):
    """Parses JSON bodies with orjson and enforces the configured body limits: its size, the
    longest gap between two of its chunks, and (past that grace) its average rate, so a client
    that trickles a body holds the gateway for seconds, not for as long as it likes."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            settings = REPLICA.settings
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
            if len(body) > INLINE_PARSE_BYTES:
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


API_KEY_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="the service API key")


async def require_api_key(given: str | None = Security(API_KEY_HEADER)) -> None:
    """OpenAPI marker of the X-API-Key security scheme (SDK generators read it); checks nothing.

    The key is checked by ``ApiKeyGate`` from the headers, before the body is read; a route
    dependency runs only after FastAPI has read and parsed the whole body."""


def over_rate(name: str, limits: Limits, wait: int) -> Response:
    return error_response(
        429,
        f"API key {name!r} is over its rate of {limits.rate_limit_rps:g} requests/s "
        f"(rate_limit_rps): retry after {wait} s",
        headers={"Retry-After": str(wait)},
    )


_MEDIA_TYPE = re.compile(rb"[A-Za-z0-9!#$&^_.+-]{1,64}/[A-Za-z0-9!#$&^_.+-]{1,64}")


def is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def not_json_detail(content_type: bytes | None) -> str:
    media = (content_type or b"").split(b";", 1)[0].strip()
    if not media:
        sent = "no Content-Type"
    elif _MEDIA_TYPE.fullmatch(media):  # named back only when it is a plain type/subtype
        sent = f"Content-Type {media.decode()}"
    else:
        sent = "an invalid Content-Type"
    return f"request body must be JSON, got {sent}: send Content-Type: application/json"


class ApiKeyGate:
    """Pure ASGI middleware: the API key, then the JSON content type, from the headers alone.

    Runs before any route, so a request with a missing or wrong X-API-Key is answered 401, and
    then a body that is not ``application/json`` 415, without the app reading a byte of the
    body (DESIGN §3). ``open_paths`` (GET /v1/health, the docs), paths under
    ``open_prefixes`` and the paths of ``open_if`` whose setting (a Settings field name) is on
    pass unchecked. The content type is checked only for ``json_routes``
    ((method, path) of the routes that read a JSON body): any other request goes on to the
    app's 404 or 405 (with Allow), whatever its body."""

    def __init__(
        self,
        app: ASGIApp,
        open_paths: Collection[str] = (),
        open_prefixes: tuple[str, ...] = (),
        json_routes: Collection[tuple[str, str]] = (),
        open_if: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = open_prefixes
        self.json_routes = frozenset(json_routes)
        self.open_if = dict(open_if or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.is_open(scope):
            await self.app(scope, receive, send)
            return
        given = content_type = None
        for name, value in scope["headers"]:
            if name == b"x-api-key" and given is None:
                given = value
            elif name == b"content-type" and content_type is None:
                content_type = value
        key = keys.match(given, REPLICA.keys) if given else None
        if not given:
            refusal = error_response(401, "missing X-API-Key header")
        elif key is None:
            refusal = error_response(401, "invalid API key")
        elif wait := REPLICA.limiter.wait(key.name):
            context.note(key=key.name)
            refusal = over_rate(key.name, REPLICA.limiter.limits(key.name), wait)
        elif (scope["method"], self.path(scope)) in self.json_routes and not is_json(content_type):
            context.note(key=key.name)
            refusal = error_response(415, not_json_detail(content_type))
        else:
            context.note(key=key.name, limits=REPLICA.limiter.limits(key.name))
            await tidied(self.app, scope, receive, send)
            return
        await refusal(scope, receive, send)  # sends the answer only: never calls receive()

    def is_open(self, scope: Scope) -> bool:
        path = self.path(scope)
        if path in self.open_paths or path.startswith(self.open_prefixes):
            return True
        setting = self.open_if.get(path)
        return setting is not None and bool(getattr(REPLICA.settings, setting, False))

    @staticmethod
    def path(scope: Scope) -> str:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return path


Answer = Callable[[Any], Awaitable[Response]]


class DirectRoutes:
    """Pure ASGI middleware (inside :class:`ApiKeyGate`): the routes of ``routes`` ((method,
    path) -> (the body's pydantic model, the route's answer to a validated body)) answered
    without FastAPI's routing, dependency solving and request handling, which cost a single
    query about 0.2 ms of the gateway's CPU (docs/performance.md). The body is read under the
    same limits (:class:`OrjsonRequest`), parsed and validated with the route's own model, and
    the route's own answer runs (once more if the index was re-created meanwhile, as
    :class:`Route` does); its errors are answered as the app's error handlers answer them. A
    body that does not parse or validate goes on to FastAPI, with the bytes already read, so
    every such 422 is FastAPI's own."""

    def __init__(self, app: ASGIApp, routes: Mapping[tuple[str, str], tuple[Any, Answer]]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http":
            route = self.routes.get((scope["method"], ApiKeyGate.path(scope)))
        if route is None:
            await self.app(scope, receive, send)
            return
        model, answer = route
        request = OrjsonRequest(scope, receive)
        body = None
        try:
            data = await request.json()
        except orjson.JSONDecodeError:
            pass
        except Exception as exc:  # over the body's limits (413, 408); the client went (400)
            http = exc if isinstance(exc, StarletteHTTPException) else BODY_ERROR
            await response_for(http)(scope, receive, send)
            return
        else:
            with contextlib.suppress(ValidationError):
                body = model.model_validate(data)
        if body is None:  # FastAPI's own 422, from the same bytes
            await self.app(scope, replay(await request.body(), receive), send)
            return
        try:
            response = await retry_stale(lambda: answer(body))
        except Exception as exc:
            response = response_for(exc)
        await response(scope, receive, send)


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


# The gateway keeps freed memory at the top of its heap while busy (actors.process.heap): once requests
# have read a megabyte or more and none has begun for a second, it gives the free pages back
# (an ingest's buffers: docs/performance.md, Footprint). The Ray transport's calls count too.
IDLE_TRIM = heap.IdleTrim(1 << 20, quiet_s=1.0)


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
        # collection, which a quiet process does not start. malloc_trim walks the whole heap
        # (milliseconds): off the loop.
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


class _Replica:
    """Per-process state of a gateway replica (Serve runs each replica in its own process and
    hands it a copy of the FastAPI app, so app.state is not a reliable place for it)."""

    settings: Any = None
    engine: Any = None
    embedder: Any = None  # DeploymentHandle of the Embedder deployment (None: no text search)
    keys: tuple[keys.ApiKey, ...] = ()
    limiter: RateLimiter = RateLimiter(lambda name: NO_LIMITS)


REPLICA = _Replica()


def configure_replica(settings: Any, engine: Any, embedder: Any = None) -> None:
    REPLICA.settings = settings
    REPLICA.engine = engine
    REPLICA.embedder = embedder
    if settings is None:  # unconfigured (tests put an earlier state back)
        REPLICA.keys, REPLICA.limiter = (), RateLimiter(lambda name: NO_LIMITS)
        return
    REPLICA.keys = settings.api_keys()
    REPLICA.limiter = RateLimiter(settings.limits, settings.gateway_replicas)


def engine_of(request: Request) -> Any:
    return REPLICA.engine


def settings_of(request: Request) -> Any:
    return REPLICA.settings


def embedder_of(request: Request) -> Any:
    return REPLICA.embedder
