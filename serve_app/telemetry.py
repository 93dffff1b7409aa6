"""The gateway's metrics: requests by route and status, their latency, the time each stage of a
request took, and the whole service's view in Prometheus' text format (GET /v1/metrics).

Recording (per request, on the event loop): :class:`RequestMetrics`, the outermost ASGI layer,
stamps the start, holds a :class:`Timer` in a context variable for the request, and records the
route (its path template; anything else is ``other``), the status and every stage the service
and the engine noted with :func:`lap` (parse, unlock, embed, plan, search, merge, fetch, encode,
write). A stage noted twice (a re-planned search) adds up. Nothing about the request's contents
is kept: labels are route paths, status codes and stage names.

Reporting: every gateway replica pushes its series to the control plane every
serve_app.constants.METRICS_EXPORT_S (and mirrors them to Ray's per-node export,
actors.metrics.RayExport); a scrape sends this replica's own and gets the others', the control
plane's and each pool actor's (actors.metrics.ServiceReport), sums them (:func:`render`) and
writes the text with prometheus_client.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from time import perf_counter
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors import metrics as m
from actors.constants import LATENCY_BUCKETS, STAGE_BUCKETS
from actors.errors import VaultvecError
from serve_app import constants

OTHER = "other"  # the route label of paths the app does not serve


class Timer:
    __slots__ = ("stages", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.stages: dict[str, float] = {}


_TIMER: ContextVar[Timer | None] = ContextVar("vaultvec_request_timer", default=None)


def now() -> float:
    return perf_counter()


def lap(stage: str, since: float) -> float:
    """Add the time from ``since`` to now to the request's ``stage``; returns now (the start of
    the next stage). Outside a request (or after :func:`detach`) it only tells the time."""
    t = perf_counter()
    timer = _TIMER.get()
    if timer is not None:
        stages = timer.stages
        stages[stage] = stages.get(stage, 0.0) + (t - since)
    return t


def started() -> float:
    """When the request started (now outside a request): the parse stage runs from there."""
    timer = _TIMER.get()
    return perf_counter() if timer is None else timer.start


def detach() -> None:
    """Stop noting stages in this task (a background task copied the request's context)."""
    _TIMER.set(None)


def current() -> Timer | None:
    """The timer of the request this task serves (None outside a request)."""
    return _TIMER.get()


@contextmanager
def measuring() -> Iterator[Timer]:
    """Note this task's stages in a timer of their own, for work done for several requests at
    once (a batch of single queries: :func:`share` then gives each request the stages)."""
    timer = Timer(perf_counter())
    token = _TIMER.set(timer)
    try:
        yield timer
    finally:
        _TIMER.reset(token)


def share(measured: Timer, timers: Iterable[Timer | None]) -> None:
    """Add the stages of ``measured`` to each of ``timers`` (the requests it worked for)."""
    for timer in timers:
        if timer is not None:
            for stage, spent in measured.stages.items():
                timer.stages[stage] = timer.stages.get(stage, 0.0) + spent


# -- this replica's series -----------------------------------------------------------------
REGISTRY = m.Registry()
REQUESTS = REGISTRY.counter(
    "vaultvec_requests_total", "requests answered, by route and status", ("route", "status")
)
DURATION = REGISTRY.histogram(
    "vaultvec_request_duration_seconds",
    "time from a request's arrival to its answer, by route",
    ("route",),
    LATENCY_BUCKETS,
)
STAGES = REGISTRY.histogram(
    "vaultvec_request_stage_seconds",
    "time spent in each stage of a request, by route",
    ("route", "stage"),
    STAGE_BUCKETS,
)
_STATUS = {code: str(code) for code in range(100, 600)}


def record(route: str, status: int, seconds: float, stages: dict[str, float]) -> None:
    REQUESTS.inc((route, _STATUS.get(status, "500")))
    DURATION.observe((route,), seconds)
    for stage, spent in stages.items():
        STAGES.observe((route, stage), spent)


class StatusSend:
    """An ASGI ``send`` that notes the status the app answers (500 until it answers one)."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class RequestMetrics:
    """Pure ASGI middleware recording every HTTP request (outermost: API-key refusals, 404s and
    405s count too). ``routes``: the paths the app serves (the route label's values)."""

    def __init__(self, app: ASGIApp, routes: Collection[str]) -> None:
        self.app = app
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timer = Timer(perf_counter())
        token = _TIMER.set(timer)
        sender = StatusSend(send)
        try:
            await self.app(scope, receive, sender)
        finally:
            _TIMER.reset(token)
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            route = path if path in self.routes else OTHER
            record(route, sender.status, perf_counter() - timer.start, timer.stages)


class track:
    """``async with track("ray:query_arrays"):`` records a call that did not come over HTTP
    (the Ray transport) as a request of that route: 200, or the error's status."""

    __slots__ = ("route", "timer", "token")

    def __init__(self, route: str) -> None:
        self.route = route

    async def __aenter__(self) -> None:
        self.timer = Timer(perf_counter())
        self.token = _TIMER.set(self.timer)

    async def __aexit__(self, kind: type[BaseException] | None, exc: Any, tb: Any) -> None:
        _TIMER.reset(self.token)
        status = 200 if exc is None else exc.status_code if isinstance(exc, VaultvecError) else 500
        record(self.route, status, perf_counter() - self.timer.start, self.timer.stages)


def recall_families(engine: Any) -> list[m.Family]:
    """Per index (by id) the served-recall window of automatic probing at this replica
    (serve_app.gateway.probing): its sum and size, so replicas merge into one estimate."""
    total: dict[str, float] = {}
    size: dict[str, float] = {}
    sampled: dict[str, float] = {}
    if engine is not None:
        for index_id, state in engine.monitor.states():
            served = list(state.served)
            total[index_id], size[index_id] = sum(served), len(served)
            sampled[index_id] = state.sampled
    idx = (m.INDEX_ID,)
    return [
        m.gauge(RECALL_SUM, "", idx, m.keyed(total)),
        m.gauge(RECALL_SIZE, "", idx, m.keyed(size)),
        m.Family(
            "vaultvec_index_recall_sampled_queries_total",
            "counter",
            "queries measured exactly to estimate recall (since the index's last training)",
            idx,
            (),
            m.keyed(sampled),
        ),
        m.single("vaultvec_gateway_replicas", "gateway replicas reporting", 1),
    ]


RECALL_SUM = m.INTERNAL + "recall_sum"
RECALL_SIZE = m.INTERNAL + "recall_size"


def replica_id() -> str:
    """This process's name in the control plane's table of reports (never a label)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_actor_id() or os.getpid())
    except Exception:
        return str(os.getpid())


_REPORTING: set[bool] = set()  # non-empty once this process reports


def start_reporting(engine: Any) -> None:
    """Add the replica's recall collector, mirror its series to Ray and push them to the
    control plane every METRICS_EXPORT_S (from the exporter's thread; fire and forget). Once per
    process, with the replica's engine (serve_app.gateway.engine.Engine)."""
    if _REPORTING:
        return
    _REPORTING.add(True)
    REGISTRY.collector(lambda: recall_families(engine))
    me = replica_id()

    def push(families: list[m.Family]) -> None:
        engine.control.report_metrics(me, families)

    m.export_to_ray(REGISTRY, constants.METRICS_EXPORT_S, push)


# -- the whole service's view --------------------------------------------------------------
def service_families(report: m.ServiceReport, own: list[m.Family]) -> dict[str, m.Family]:
    return m.merge([own, *report.gateways, report.control, *report.pools])


def by_index(
    families: dict[str, m.Family], names: dict[str, str], index_labels: bool
) -> list[m.Family]:
    """Families with their internal ``index_id`` label resolved: to ``index`` = the index's
    name when ``index_labels`` (series of deleted indexes dropped), else summed over indexes.
    Adds the derived families: indexes by state, per index unlocked, the recall estimate."""
    loaded = families.get("vaultvec_index_partitions_loaded")
    unlocked = {k[0] for k, v in (loaded.series.items() if loaded else ()) if v > 0}
    unlocked &= names.keys()
    out = [
        m.gauge(
            "vaultvec_indexes",
            "indexes, by state (unlocked: some partition decrypted in memory)",
            ("state",),
            {("unlocked",): len(unlocked), ("locked",): len(names) - len(unlocked)},
        )
    ]
    if index_labels:
        out.append(
            m.gauge(
                "vaultvec_index_unlocked",
                "1 while some partition of the index is decrypted in memory",
                ("index",),
                {(name,): float(i in unlocked) for i, name in names.items()},
            )
        )
    total = families.pop(RECALL_SUM, None)
    size = families.pop(RECALL_SIZE, None)
    for f in families.values():
        if m.INDEX_ID not in f.labels:
            out.append(f)
        elif index_labels:
            out.append(named(f, names))
        else:
            out.append(m.without_label(f, m.INDEX_ID))
    if total is not None and size is not None:
        out.append(recall_estimate(total, size, names, index_labels))
    return out


def named(f: m.Family, names: dict[str, str]) -> m.Family:
    at = f.labels.index(m.INDEX_ID)
    labels = (*f.labels[:at], "index", *f.labels[at + 1 :])
    series = {
        (*k[:at], names[k[at]], *k[at + 1 :]): v for k, v in f.series.items() if k[at] in names
    }
    return m.Family(f.name, f.kind, f.help, labels, f.buckets, series)


def recall_estimate(
    total: m.Family, size: m.Family, names: dict[str, str], index_labels: bool
) -> m.Family:
    """Recall@k of automatically probed answers, measured on sampled queries (the last ones per
    index and replica): per index, or over every index."""
    help = "estimated recall of automatic probing (served answers measured against exact ones)"
    if index_labels:
        t, n = named(total, names), named(size, names)
        values = {k: t.series[k] / v for k, v in n.series.items() if v > 0}
        return m.gauge("vaultvec_index_recall_estimate", help, ("index",), values)
    t, n = m.without_label(total, m.INDEX_ID), m.without_label(size, m.INDEX_ID)
    count = n.series.get((), 0.0)
    values = {(): t.series.get((), 0.0) / count} if count > 0 else {}
    return m.gauge("vaultvec_index_recall_estimate", help, (), values)


def render(report: m.ServiceReport, own: list[m.Family], index_labels: bool) -> bytes:
    """The Prometheus text of the whole service."""
    families = service_families(report, own)
    out = by_index(families, report.names, index_labels)
    out.append(
        m.single(
            "vaultvec_pool_unreachable",
            "pool actors that did not answer this scrape",
            report.pools_unreachable,
        )
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(out))
    return generate_latest(registry)


class _Collector:
    def __init__(self, families: Iterable[m.Family]) -> None:
        self.families = sorted(families, key=lambda f: f.name)

    def collect(self) -> Iterable[Metric]:
        for f in self.families:
            yield to_prometheus(f)


def to_prometheus(f: m.Family) -> Metric:
    labels = list(f.labels)
    if f.kind == "counter":
        counter = CounterMetricFamily(f.name, f.help, labels=labels)
        for k, v in sorted(f.series.items()):
            counter.add_metric(list(k), v)
        return counter
    if f.kind == "gauge":
        g = GaugeMetricFamily(f.name, f.help, labels=labels)
        for k, v in sorted(f.series.items()):
            g.add_metric(list(k), v)
        return g
    h = HistogramMetricFamily(f.name, f.help, labels=labels)
    bounds = [floatToGoString(b) for b in f.buckets] + ["+Inf"]
    for k, (counts, sums) in sorted(f.series.items()):
        cumulative, buckets = 0, []
        for le, n in zip(bounds, counts):
            cumulative += n
            buckets.append((le, cumulative))
        h.add_metric(list(k), buckets, sum(sums))
    return h
