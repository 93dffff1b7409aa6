"""The hottest routes answered before FastAPI's routing (a query's body read, parsed and
validated with the route's own model, then the route's own answer)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.gateway.calls import retry_stale
from serve_app.http.bodies import BODY_ERROR, OrjsonRequest, replay
from serve_app.http.errors import response_for
from serve_app.http.gate import ApiKeyGate

Answer = Callable[[Any], Awaitable[Response]]


class DirectRoutes:
    """Pure ASGI middleware (inside :class:`ApiKeyGate`): the routes of ``routes`` ((method,
    path) -> (the body's pydantic model, the route's answer to a validated body)) answered
    without FastAPI's routing, dependency solving and request handling, which cost a single
    query a sizeable share of the gateway's CPU (figures: docs/performance.md). The body is
    read under the same limits (:class:`OrjsonRequest`), parsed and validated with the route's
    own model, and the route's own answer runs (once more if the index was re-created
    meanwhile, as :class:`Route` does); its errors are answered as the app's error handlers
    answer them. A body that does not parse or validate goes on to FastAPI, with the bytes
    already read, so every such 422 is FastAPI's own."""

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
