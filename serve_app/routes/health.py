"""GET /v1/health: no authentication; also the no-op endpoint benchmarks compare against."""

from __future__ import annotations

from fastapi import APIRouter

from serve_app import __version__
from serve_app.http import JSON, Route
from serve_app.models import HealthResponse

router = APIRouter(route_class=Route)
_BODY = {"status": "healthy", "api_version": "v1", "version": __version__}


@router.get("/health", response_model=HealthResponse)
async def health() -> JSON:
    return JSON(_BODY)
