"""One error handler: every failure becomes ``{"status_code": n, "detail": "..."}``.

Validation errors keep pydantic's location and message but drop the offending input, so no
key, vector or content ever appears in an error body. Unexpected errors are logged with a
request id and answered with a scrubbed 500 carrying that id.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from actors.control.client import cause
from actors.errors import InternalError, Unavailable, VaultvecError
from serve_app.gateway.calls import SHARD_ERRORS

log = logging.getLogger("vaultvec.errors")


def error_response(
    status: int,
    detail: str,
    errors: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {"status_code": status, "detail": detail}
    if errors:
        body["errors"] = errors
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "X-API-Key"}
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def scrub_validation(errors: Any) -> list[dict[str, Any]]:
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        out.append(
            {
                "loc": loc,
                "msg": err.get("msg", "invalid value"),
                "type": err.get("type", "value_error"),
            }
        )
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(VaultvecError)
    async def _vaultvec(_: Request, exc: VaultvecError) -> Response:
        return error_response(exc.status_code, exc.detail, exc.errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        raw = exc.errors()
        errors = scrub_validation(raw)
        first = errors[0] if errors else {"loc": [], "msg": "invalid request", "type": ""}
        if first["type"] == "json_invalid":
            at = first["loc"][0] if first["loc"] else "?"
            # The parser's own reason (orjson's messages never quote the input).
            reason = str((raw[0].get("ctx") or {}).get("error") or "malformed JSON")
            hint = "; NaN and Infinity are not JSON numbers" if "JSON value" in reason else ""
            detail = f"request body is not valid JSON at character {at}: {reason}{hint}"
            return error_response(422, detail, errors)
        where = ".".join(first["loc"]) or "body"
        return error_response(422, f"{where}: {first['msg']}", errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:  # Allow: the methods of every route of the path, not one's
            methods = allowed_methods(request.app, request.url.path)
            if methods:
                exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
        return response_for(exc)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        return response_for(exc)


def allowed_methods(app: FastAPI, path: str) -> set[str]:
    """The methods the OpenAPI document lists for ``path`` (its templates matched one segment
    per parameter): Starlette's own 405 names those of the first route of the path only."""
    table = getattr(app.state, "allowed_methods", None)
    if table is None:
        table = app.state.allowed_methods = [
            (re.compile(re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(template))), set(ops))
            for template, ops in app.openapi()["paths"].items()
        ]
    methods: set[str] = set()
    for pattern, ops in table:
        if pattern.fullmatch(path):
            methods |= {m.upper() for m in ops}
    return methods


def response_for(exc: Exception) -> Response:
    """``exc`` answered as the app's handlers answer it: an HTTP exception with its status and
    headers (a 405 carries Allow), anything else as :func:`api_error` makes it."""
    if isinstance(exc, StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)
    err = api_error(exc)
    return error_response(err.status_code, err.detail, err.errors)


def api_error(exc: BaseException) -> VaultvecError:
    """Any exception as the API error every transport answers with: a VaultvecError (also one
    a shard raised) as it is, a shard outage as 503, anything else as a scrubbed 500 whose
    request id is logged here with the exception."""
    failure = cause(exc)
    if isinstance(failure, VaultvecError):
        return failure
    if isinstance(exc, SHARD_ERRORS):
        return Unavailable("a shard of this index is unavailable; retry later")
    request_id = uuid.uuid4().hex[:12]
    log.error("internal error (request %s): %s", request_id, type(failure).__name__, exc_info=exc)
    return InternalError(f"{InternalError.default_detail} (request id {request_id})")
