"""serve_app.http.direct.DirectRoutes: a direct route answers a valid body with the route's own answer,
its errors as the app's handlers answer them, and leaves every body that does not parse or
validate to the app behind it, with the same bytes (so each such 422 is FastAPI's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from fastapi import HTTPException
from pydantic import BaseModel
from starlette.responses import Response

from actors.errors import IndexNotFound
from serve_app import replica
from serve_app.http.direct import DirectRoutes
from serve_app.settings import Settings


class Body(BaseModel):
    name: str
    n: int = 1


class Fallback:
    """The app behind the direct routes: records the bodies it read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies.append(b"".join(chunks))
        await Response(b'{"from":"app"}', status_code=422, media_type="application/json")(
            scope, receive, send
        )


async def answer(body: Body) -> Response:
    if body.name == "teapot":
        raise HTTPException(418, "short and stout", headers={"X-Spout": "yes"})
    if body.name == "missing":
        raise IndexNotFound("index 'missing' does not exist")
    if body.name == "broken":
        raise RuntimeError("a bug")
    return Response(orjson.dumps({"name": body.name, "n": body.n}), media_type="application/json")


@pytest.fixture()
def direct() -> Iterator[tuple[DirectRoutes, Fallback]]:
    with replica.configured(Settings(api_key=["k"], max_body_bytes=1024)):
        fallback = Fallback()
        yield DirectRoutes(fallback, {("POST", "/v1/x"): (Body, answer)}), fallback


def call(
    app: Any, body: bytes, path: str = "/v1/x", chunk: int = 0, gone_after: int = 0
) -> tuple[int, bytes]:
    """(status, body) of POST ``path``; the body in chunks of ``chunk`` bytes, the client
    gone after ``gone_after`` of them (0: it stays)."""
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    parts = parts or [b""]
    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "root_path": ""}
    sent: list[dict[str, Any]] = []
    given = 0

    async def receive() -> dict[str, Any]:
        nonlocal given
        given += 1
        if gone_after and given > gone_after:
            return {"type": "http.disconnect"}
        part = parts.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(parts)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_valid_body_gets_the_routes_own_answer(direct: tuple[DirectRoutes, Fallback]) -> None:
    app, fallback = direct
    assert call(app, b'{"name": "a", "n": 3}') == (200, b'{"name":"a","n":3}')
    assert call(app, b'{"name": "b"}', chunk=3) == (200, b'{"name":"b","n":1}')  # in pieces
    assert fallback.bodies == []


@pytest.mark.parametrize("body", [b'{"name": "a",', b"[1, 2]", b'{"n": 1}', b'{"name": 1}', b""])
def test_what_does_not_parse_or_validate_goes_to_the_app_with_its_bytes(
    direct: tuple[DirectRoutes, Fallback], body: bytes
) -> None:
    app, fallback = direct
    assert call(app, body, chunk=4) == (422, b'{"from":"app"}')
    assert fallback.bodies == [body]


def test_errors_are_answered_as_the_apps_handlers_answer_them(
    direct: tuple[DirectRoutes, Fallback],
) -> None:
    app, fallback = direct
    status, body = call(app, b'{"name": "missing"}')
    assert (status, orjson.loads(body)) == (
        404,
        {"status_code": 404, "detail": "index 'missing' does not exist"},
    )
    status, body = call(app, b'{"name": "broken"}')
    detail = orjson.loads(body)["detail"]
    assert status == 500 and "request id" in detail and "a bug" not in detail
    status, body = call(app, b'{"name": "' + b"x" * 2000 + b'"}')  # over max_body_bytes
    assert status == 413 and orjson.loads(body)["status_code"] == 413
    status, body = call(app, b'{"name": "teapot"}')
    assert (status, orjson.loads(body)["detail"]) == (418, "short and stout")
    # a client gone mid-body: what FastAPI answers it
    status, body = call(app, b'{"name": "abcdef"}', chunk=4, gone_after=2)
    assert (status, orjson.loads(body)["detail"]) == (400, "There was an error parsing the body")
    assert fallback.bodies == []


def test_other_routes_go_to_the_app(direct: tuple[DirectRoutes, Fallback]) -> None:
    app, fallback = direct
    assert call(app, b'{"name": "a"}', path="/v1/y")[0] == 422
    assert fallback.bodies == [b'{"name": "a"}']
