"""The service's own routes: GET /v1/health (no authentication; also the no-op request the
benchmarks compare against) and GET /v1/metrics (the whole service's metrics in Prometheus'
text format, serve_app.telemetry).

/v1/metrics needs the API key unless ``VAULTVEC_METRICS_PUBLIC`` is set; index names appear as
labels only with ``VAULTVEC_METRICS_INDEX_LABELS``. It is not in the OpenAPI document: it is for
scrapers, not for the SDKs. The two are separate routers: the app puts health early among its
routes and metrics last (serve_app.app, the routes' order).
"""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from serve_app import __version__
from serve_app import telemetry as metrics
from serve_app.access import rights
from serve_app.access.rights import Right
from serve_app.http.bodies import JSON, Route
from serve_app.models import HealthResponse
from serve_app.replica import services

health_router = APIRouter(route_class=Route)
router = APIRouter(route_class=Route)
#: The CyborgDB service release whose API vaultvec answers: CyborgDB's tools read ``version``
#: (cyborgdb-migrate 0.18 accepts servers 0.18.* only); vaultvec's own is ``vaultvec_version``.
CYBORGDB_API = "0.18.0"
_BODY = {
    "status": "healthy",
    "api_version": "v1",
    "version": CYBORGDB_API,
    "vaultvec_version": __version__,
}


@health_router.get("/health", response_model=HealthResponse)
async def health() -> JSON:
    return JSON(_BODY)


@router.get("/metrics", include_in_schema=False)
async def service_metrics() -> Response:
    rights.require(Right.MANAGE)  # the operator's: every key's and index's activity
    svc = services()
    engine, settings = svc.engine, svc.settings
    own = metrics.REGISTRY.snapshot()
    report = await engine.control.service_metrics(metrics.replica_id(), own)
    text = metrics.render(report, own, settings.metrics_index_labels)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
