"""OpenAPI descriptions of the error responses every route may give."""

from __future__ import annotations

from typing import Any

from serve_app.models import ErrorResponse


def _doc(text: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": text}


CONFLICT: dict[int | str, dict[str, Any]] = {409: _doc("An index with this name exists")}
ERRORS: dict[int | str, dict[str, Any]] = {
    401: _doc("Missing or wrong X-API-Key, or wrong index_key"),
    403: _doc("A per-index user key without the permission this needs"),
    404: _doc("Unknown index"),
    422: _doc("Invalid parameters"),
    500: _doc("Internal error (message scrubbed, request id kept)"),
    503: _doc("A shard is unavailable past the retry budget"),
}
# What only a route that reads a (JSON) request body may answer, besides ERRORS.
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    408: _doc("Request body stalled or arrived too slowly"),
    413: _doc("Request body over the size limit"),
    415: _doc("Request body is not JSON: send Content-Type: application/json"),
}

BODY_ROUTE_ERRORS = {**ERRORS, **BODY_ERRORS}
