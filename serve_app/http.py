"""HTTP plumbing shared by the routers: orjson bodies, the body-size limit, API-key auth."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import HTTPException, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader
from starlette.responses import Response

from actors.errors import PayloadTooLarge, Unauthorized
from serve_app.engine import retry_stale

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS)


def too_large(limit: int) -> HTTPException:
    # An HTTPException: FastAPI turns anything else raised while reading the body into a 400.
    return HTTPException(PayloadTooLarge.status_code, f"request body exceeds {limit} bytes")


class OrjsonRequest(Request):
    """Parses JSON bodies with orjson and enforces the configured body-size limit."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            limit = REPLICA.settings.max_body_bytes
            declared = self.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise too_large(limit)
            chunks = []
            size = 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
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
    """FastAPI dependency: the X-API-Key header must match one of the configured keys.

    ``async`` so FastAPI runs it on the event loop instead of a threadpool hop per request."""
    if not given:
        raise Unauthorized("missing X-API-Key header")
    keys: list[str] = REPLICA.settings.api_key
    ok = False
    for key in keys:  # compare against every key: timing does not reveal which matched
        ok |= hmac.compare_digest(given.encode(), key.encode())
    if not ok:
        raise Unauthorized("invalid API key")


class _Replica:
    """Per-process state of a gateway replica (Serve runs each replica in its own process and
    hands it a copy of the FastAPI app, so app.state is not a reliable place for it)."""

    settings: Any = None
    engine: Any = None
    embedder: Any = None  # DeploymentHandle of the Embedder deployment (None: no text search)


REPLICA = _Replica()


def configure_replica(settings: Any, engine: Any, embedder: Any = None) -> None:
    REPLICA.settings = settings
    REPLICA.engine = engine
    REPLICA.embedder = embedder


def engine_of(request: Request) -> Any:
    return REPLICA.engine


def settings_of(request: Request) -> Any:
    return REPLICA.settings


def embedder_of(request: Request) -> Any:
    return REPLICA.embedder
