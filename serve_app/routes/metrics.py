"""GET /v1/metrics: the whole service's metrics in Prometheus' text format (serve_app.metrics).

Needs the API key unless ``VAULTVEC_METRICS_PUBLIC`` is set; index names appear as labels only
with ``VAULTVEC_METRICS_INDEX_LABELS``. Not in the OpenAPI document: it is for scrapers, not
for the SDKs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from serve_app import metrics
from serve_app.http import Route, engine_of, settings_of

router = APIRouter(route_class=Route)


@router.get("/metrics", include_in_schema=False)
async def service_metrics(request: Request) -> Response:
    engine, settings = engine_of(request), settings_of(request)
    own = metrics.REGISTRY.snapshot()
    report = await engine.call(engine.control.service_metrics.remote(metrics.replica_id(), own))
    text = metrics.render(report, own, settings.metrics_index_labels)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
