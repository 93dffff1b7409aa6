"""The FastAPI app, the Gateway Serve deployment and the app builder used by ``serve run``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import faiss
import ray
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from ray import serve

from actors.constants import GATEWAY_TRIM_THRESHOLD
from actors.control.client import ControlClient
from actors.control.plane import CONTROL_NAME, NAMESPACE, ControlPlane
from actors.pool import channel
from actors.process import heap
from actors.process.cpus import node_cpus
from serve_app import __version__, audit, replica, replica_grpc
from serve_app import telemetry as metrics
from serve_app.embedder import Embedder, deployment_options
from serve_app.gateway.engine import Engine
from serve_app.http import docs, errors
from serve_app.http.direct import DirectRoutes
from serve_app.http.gate import ApiKeyGate
from serve_app.http.trim import counted_call
from serve_app.models import ErrorResponse
from serve_app.routes import backups, indexes, ray_transport, service, vectors
from serve_app.routes import batches as array_routes
from serve_app.settings import Settings

log = logging.getLogger("vaultvec.app")


TAGS = ("service", "indexes", "vectors")


def create_app() -> FastAPI:
    app = FastAPI(
        title="vaultvec",
        version=__version__,
        description="Encrypted vector-index service, a drop-in for CyborgDB's service (SDKs "
        "0.11–0.18). "
        "Every route but /v1/health needs the X-API-Key header.",
        responses={422: {"model": ErrorResponse, "description": "Invalid parameters"}},
        docs_url=None,  # served by docs.install from local assets
        redoc_url=None,
        openapi_tags=[{"name": tag} for tag in TAGS],  # the docs' order
    )
    # The data path's routes first: Serve names every request's route (for its metrics) by
    # trying the app's routes in order, as Starlette's router then does (docs/performance.md).
    # No two routes share a path, so the order decides nothing else; the docs group the routes
    # by tag.
    tagged = (
        (vectors.router, "vectors"),
        (service.health_router, "service"),
        (array_routes.router, "vectors"),
        (indexes.router, "indexes"),
        (indexes.models_router, "indexes"),
        (backups.router, "indexes"),
        (service.router, "service"),
    )
    for router, tag in tagged:
        app.include_router(router, prefix="/v1", tags=[tag])
    routers = [router for router, _ in tagged]
    errors.install(app)
    docs.install(app)
    # Inside the gate: the hottest routes answered without FastAPI's request handling.
    app.add_middleware(DirectRoutes, routes=vectors.DIRECT)
    # The API key (then the JSON content type) is checked before anything reads the body.
    app.add_middleware(
        ApiKeyGate,
        open_paths={"/v1/health", *docs.PATHS},
        open_prefixes=(docs.ASSETS + "/",),
        json_routes=json_routes(routers, "/v1"),
        open_if={"/v1/metrics": "metrics_public"},
    )
    # Every request is counted, those the gate refuses too.
    paths = {"/v1" + r.path for router in routers for r in router.routes if isinstance(r, APIRoute)}
    app.add_middleware(metrics.RequestMetrics, routes=paths | set(docs.PATHS))
    # Outermost: the request's context (who, which index) opens here and the audit log records
    # the request when it ends; the health check and the docs read nothing and are not logged.
    app.add_middleware(
        audit.Audit, unaudited={"/v1/health", *docs.PATHS, docs.ASSETS + "/"}, routes=paths
    )
    return app


def json_routes(routers: Iterable[APIRouter], prefix: str) -> set[tuple[str, str]]:
    """(METHOD, path) of every route of ``routers`` (included under ``prefix``) that reads a
    JSON body. Not from app.openapi(): a document built before Serve pickles the app leaves
    FastAPI's caches in the copy, and the copy's document then gives every request body an
    "example": {} (FastAPI tells an unset example by a sentinel object the copy does not keep).
    """
    return {
        (method, prefix + route.path)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.body_field is not None
        for method in route.methods or ()
    }


fastapi_app = create_app()


def control_plane(settings: Settings) -> Any:
    """The control-plane actor: found by name, created on first use (detached, restartable)."""
    actor = ray.remote(ControlPlane).options(
        name=CONTROL_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=settings.control_num_cpus,
        max_restarts=-1,
        max_task_retries=3,
        max_concurrency=64,
    )
    return actor.remote(settings.engine_options())


# Resources as Settings' defaults; build_app applies the configured ones.
@serve.deployment(
    ray_actor_options={"num_cpus": Settings.model_fields["gateway_num_cpus"].default},
    max_ongoing_requests=Settings.model_fields["gateway_max_ongoing_requests"].default,
)
@serve.ingress(fastapi_app)
class Gateway:
    def __init__(self, settings: dict[str, Any], embedder: Any = None) -> None:
        replica_grpc.bind_to_node_address()
        # Request bodies and results recycled in one arena, its top kept (see actors.process.heap).
        heap.configure(trim_threshold=GATEWAY_TRIM_THRESHOLD)
        s = Settings(**settings)
        if not s.api_key:
            raise ValueError("no API key configured (VAULTVEC_API_KEY)")
        # A function, not the REPLICA object: Serve pickles this class by value, and the object
        # would be copied into it instead of shared with the routes.
        engine = Engine(
            ControlClient(control_plane(s)),
            retries=s.shard_retries,
            timeout_s=s.shard_timeout_s,
            recall_sample_share=s.recall_sample_share,
        )
        channel.CHANNELS.enable(s.local_channel)  # same-node shard calls off Ray's path
        # DeploymentHandle of the Embedder (text -> vectors)
        replica.configure(s, engine, embedder)
        audit.configure(s.audit_target(), s.audit_log_max_bytes, s.audit_log_backups)
        metrics.start_reporting(engine)  # this replica's series to Ray and the control plane
        # Ray caps OMP threads at the replica's (fractional) CPUs; the coarse quantizer of a
        # large batch is worth the cores.
        faiss.omp_set_num_threads(s.gateway_threads or node_cpus())

    # -- the Ray transport: called through a DeploymentHandle by the bulk driver, no HTTP. ----
    # Callers joined the Ray cluster (token auth), i.e. are inside the trust boundary: the API
    # key is not used on this path; the index_key is required and verified as on every route.
    async def query_arrays(
        self,
        index_name: str,
        index_key: str,
        queries: Any,
        top_k: int | None = None,
        n_probes: int | None = None,
        filters: dict[str, Any] | None = None,
        greedy: bool | None = None,
        include: list[str] | None = None,
    ) -> dict[str, Any]:
        """Top-k of a (nq, d) float32 matrix, compact: see serve_app.service.matrices.handle_query."""
        with counted_call(getattr(queries, "nbytes", 0)):
            async with audit.call("ray:query_arrays"):
                return await ray_transport.handle_query(
                    index_name, index_key, queries, top_k, n_probes, filters, greedy, include
                )

    async def upsert_arrays(
        self,
        index_name: str,
        index_key: str,
        ids: list[str],
        vectors: Any,
        metadata: list[dict[str, Any] | None] | None = None,
        contents: list[str | None] | None = None,
    ) -> int:
        """Upsert rows of a (n, d) float32 matrix under ``ids``; returns the count."""
        with counted_call(getattr(vectors, "nbytes", 0)):
            async with audit.call("ray:upsert_arrays"):
                return await ray_transport.handle_upsert(
                    index_name, index_key, ids, vectors, metadata, contents
                )


# OpenMP threads that wait passively: the coarse quantizer's worker threads would otherwise
# spin between parallel regions and take the cores from the shards (a batch's coarse step
# slows down badly on busy cores; figures: docs/performance.md). Read when faiss loads, hence set
# in the replica's environment rather than in __init__; so are glibc's (actors.process.heap).
GATEWAY_ENV = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE", **heap.GATEWAY_ENV}}


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Serve application builder: ``serve run serve_app.app:build_app storage=... api_key=...``.

    ``args`` are Settings fields; anything not given comes from VAULTVEC_* variables.
    """
    settings = Settings(**(args or {}))
    as_json = settings.model_dump(mode="json")
    embedder = Embedder.options(  # type: ignore[attr-defined]
        **deployment_options(settings)
    ).bind(settings.model_dump(mode="json", exclude={"api_key"}))
    return Gateway.options(  # type: ignore[attr-defined]
        num_replicas=settings.gateway_replicas,
        max_replicas_per_node=settings.gateway_max_replicas_per_node or None,
        ray_actor_options={"num_cpus": settings.gateway_num_cpus, "runtime_env": GATEWAY_ENV},
        max_ongoing_requests=settings.gateway_max_ongoing_requests,
    ).bind(as_json, embedder)
