"""In-process metrics: cheap counters and histograms recorded on hot paths, reported as plain
data (:class:`Family`) that crosses Ray, merged across processes, and mirrored to Ray's per-node
metrics export (``ray.util.metrics``) by a background thread (:class:`RayExport`).

Recording costs a dict look-up and a few list increments (no Ray call, no lock in the gateway's
single event-loop thread; the multi-threaded pool actor passes a lock). Ray's own recording
costs far more per call, so it is done off the request path: every ``period_s`` the
exporter sends each counter's increase, each gauge's value and, per histogram bucket, the
observations added since the last pass (each at the mean of that bucket's new values, which lies
inside the bucket: Ray's buckets, sums and counts equal the in-process ones).

Labels hold route templates, status codes, stage names, shard numbers and (inside the service
only) index ids; Ray's export never gets an ``index_id`` label: such families are summed over
it first. No label carries a key, an item id, a vector, contents or metadata.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from actors import constants

log = logging.getLogger("vaultvec.metrics")

Labels = tuple[str, ...]
# A histogram series: observations and their sum per bucket (the last bucket is +Inf).
HistogramRow = tuple[tuple[int, ...], tuple[float, ...]]

INDEX_ID = "index_id"  # internal label: mapped to index names or summed away before export
INTERNAL = "vaultvec_internal_"  # families only the gateway's scrape reads (not sent to Ray)


@dataclass(frozen=True)
class Family:
    """One metric family as one process reports it: ``series`` maps label values (in the order
    of ``labels``) to a number (counter, gauge) or a :data:`HistogramRow`."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    series: dict[Labels, Any] = field(default_factory=dict)

    def same_shape(self, other: Family) -> bool:
        return (self.kind, self.labels, self.buckets) == (other.kind, other.labels, other.buckets)


def gauge(name: str, help: str, labels: tuple[str, ...], values: dict[Labels, Any]) -> Family:
    """A computed gauge family (collectors build these)."""
    return Family(name, "gauge", help, labels, (), {k: float(v) for k, v in values.items()})


def single(name: str, help: str, value: float, kind: str = "gauge") -> Family:
    """A computed family of one unlabelled series."""
    return Family(name, kind, help, (), (), {(): float(value)})


def keyed(values: Mapping[str, float]) -> dict[Labels, float]:
    """``{label value: number}`` as series of a one-label family."""
    return {(k,): float(v) for k, v in values.items()}


class Counter:
    __slots__ = ("family", "series")

    def __init__(self, family: Family) -> None:
        self.family = family
        self.series: dict[Labels, float] = family.series

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        series = self.series
        series[labels] = series.get(labels, 0.0) + amount


class Histogram:
    __slots__ = ("bounds", "family", "series", "size")

    def __init__(self, family: Family) -> None:
        self.family = family
        self.bounds = family.buckets
        self.size = len(family.buckets) + 1
        self.series: dict[Labels, tuple[list[int], list[float]]] = family.series

    def observe(self, labels: Labels, value: float) -> None:
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = ([0] * self.size, [0.0] * self.size)
        at = bisect_left(self.bounds, value)  # Prometheus buckets: value <= bound
        row[0][at] += 1
        row[1][at] += value


class Registry:
    """The recorders of one process and the collectors that compute gauges when asked."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self.lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
        self._recorded: list[Family] = []
        self._collectors: list[Callable[[], Iterable[Family]]] = []

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        family = Family(name, "counter", help, labels)
        self._recorded.append(family)
        return Counter(family)

    def histogram(
        self, name: str, help: str, labels: tuple[str, ...], buckets: Sequence[float]
    ) -> Histogram:
        family = Family(name, "histogram", help, labels, tuple(buckets))
        self._recorded.append(family)
        return Histogram(family)

    def collector(self, collect: Callable[[], Iterable[Family]]) -> None:
        """Add a function computing gauge families at each snapshot."""
        self._collectors.append(collect)

    def snapshot(self) -> list[Family]:
        """Every family now, as plain data (copies: safe to send while recording goes on; each
        copy is one C-level dict or list copy, atomic under the GIL)."""
        out = []
        with self.lock:
            for f in self._recorded:
                items = list(dict(f.series).items())
                if f.kind == "histogram":
                    series = {k: (tuple(c), tuple(s)) for k, (c, s) in items}
                    out.append(replace(f, series=series))
                else:
                    out.append(replace(f, series=dict(items)))
        for collect in self._collectors:
            try:
                out.extend(collect())
            except Exception:  # a report without one collector's gauges beats no report
                log.exception("metrics collector failed")
        return out


# -- merging ---------------------------------------------------------------------------------
def combine(kind: str, a: Any, b: Any) -> Any:
    """Two series' values summed (histogram rows bucket by bucket)."""
    if kind != "histogram":
        return a + b
    return (
        tuple(x + y for x, y in zip(a[0], b[0])),
        tuple(x + y for x, y in zip(a[1], b[1])),
    )


def merge(reports: Iterable[Iterable[Family]]) -> dict[str, Family]:
    """Families of several processes summed per label set. A family whose labels or buckets
    differ from the first of its name (another vaultvec version during an upgrade) is left out."""
    merged: dict[str, Family] = {}
    for report in reports:
        for f in report:
            into = merged.get(f.name)
            if into is None:
                merged[f.name] = replace(f, series=dict(f.series))
            elif into.same_shape(f):
                for labels, value in f.series.items():
                    have = into.series.get(labels)
                    into.series[labels] = value if have is None else combine(f.kind, have, value)
    return merged


def without_label(f: Family, label: str) -> Family:
    """``f`` summed over ``label`` (``f`` itself if it has no such label)."""
    if label not in f.labels:
        return f
    at = f.labels.index(label)
    out = Family(f.name, f.kind, f.help, f.labels[:at] + f.labels[at + 1 :], f.buckets)
    for labels, value in f.series.items():
        key = labels[:at] + labels[at + 1 :]
        have = out.series.get(key)
        out.series[key] = value if have is None else combine(f.kind, have, value)
    return out


def histogram_row(values: Sequence[float], buckets: Sequence[float]) -> HistogramRow:
    """The row of a histogram holding ``values`` (for families computed, not recorded)."""
    counts = [0] * (len(buckets) + 1)
    sums = [0.0] * (len(buckets) + 1)
    for v in values:
        at = bisect_left(buckets, v)
        counts[at] += 1
        sums[at] += v
    return tuple(counts), tuple(sums)


# -- Ray's per-node export -------------------------------------------------------------------
def bucket_value(mean: float, buckets: Sequence[float], at: int) -> float:
    """``mean`` held inside bucket ``at`` ((lower, upper]) against rounding."""
    if at < len(buckets):
        mean = min(mean, buckets[at])
    if at > 0 and mean <= buckets[at - 1]:
        mean = math.nextafter(buckets[at - 1], math.inf)
    return mean


class RayExport:
    """Mirrors a registry into ``ray.util.metrics`` every ``period_s`` from a daemon thread
    (Ray's metrics agent on each node then serves them, prefixed ``ray_``)."""

    def __init__(
        self,
        registry: Registry,
        period_s: float = 5.0,
        also: Callable[[list[Family]], None] | None = None,
    ) -> None:
        self.registry = registry
        self.period_s = period_s
        self.also = also
        self._metrics: dict[str, Any] = {}
        self._last: dict[str, dict[Labels, Any]] = {}
        self._tags: dict[tuple[str, Labels], dict[str, str]] = {}

    def start(self) -> None:
        threading.Thread(target=self._run, name="vaultvec-metrics-export", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            try:
                self.flush()
            except Exception:  # never let the loop die
                log.exception("metrics export to Ray failed")

    def flush(self) -> None:
        families = self.registry.snapshot()
        if self.also is not None:
            self.also(families)
        for f in families:
            if not f.name.startswith(INTERNAL):
                self._send(without_label(f, INDEX_ID))

    def _metric(self, f: Family) -> Any:
        from ray.util import metrics as ray_metrics

        m = self._metrics.get(f.name)
        if m is None:
            if f.kind == "counter":
                m = ray_metrics.Counter(f.name.removesuffix("_total"), f.help, f.labels)
            elif f.kind == "histogram":
                m = ray_metrics.Histogram(f.name, f.help, list(f.buckets), f.labels)
            else:
                m = ray_metrics.Gauge(f.name, f.help, f.labels)
            self._metrics[f.name] = m
        return m

    def _tag(self, f: Family, labels: Labels) -> dict[str, str]:
        tags = self._tags.get((f.name, labels))
        if tags is None:
            tags = self._tags[(f.name, labels)] = dict(zip(f.labels, labels))
        return tags

    def _send(self, f: Family) -> None:
        m = self._metric(f)
        last = self._last.get(f.name, {})
        if f.kind == "gauge":
            for labels in last.keys() - f.series.keys():  # gone: zero, not a stale value
                m.set(0.0, self._tag(f, labels))
            for labels, value in f.series.items():
                m.set(float(value), self._tag(f, labels))
        elif f.kind == "counter":
            for labels, value in f.series.items():
                delta = value - last.get(labels, 0.0)
                if delta > 0:
                    m.inc(delta, self._tag(f, labels))
        else:
            for labels, (counts, sums) in f.series.items():
                before = last.get(labels)
                tags = self._tag(f, labels)
                for at, (n, s) in enumerate(zip(counts, sums)):
                    dn = n - (before[0][at] if before else 0)
                    if dn > 0:
                        ds = s - (before[1][at] if before else 0.0)
                        value = bucket_value(ds / dn, f.buckets, at)
                        for i in range(dn):
                            m.observe(value, tags)
                            if i % constants.EXPORT_YIELD_EVERY == constants.EXPORT_YIELD_EVERY - 1:
                                time.sleep(0)  # let the event loop have the GIL meanwhile
        self._last[f.name] = f.series


_EXPORTS: dict[int, RayExport] = {}


def export_to_ray(
    registry: Registry,
    period_s: float = 5.0,
    also: Callable[[list[Family]], None] | None = None,
) -> None:
    """Start mirroring ``registry`` to Ray once per process (no-op outside Ray); ``also`` gets
    each pass's snapshot too."""
    import ray

    if id(registry) in _EXPORTS or not ray.is_initialized():
        return
    export = _EXPORTS[id(registry)] = RayExport(registry, period_s, also)
    export.start()


# -- the control plane's part ----------------------------------------------------------------
@dataclass(frozen=True)
class ServiceReport:
    """What the control plane answers a gateway's scrape: the other gateway replicas' latest
    reports, its own series, each reachable pool actor's, and index id -> name (the gateway
    labels by name only where its settings allow)."""

    gateways: list[list[Family]]
    control: list[Family]
    pools: list[list[Family]]
    names: dict[str, str]
    pools_unreachable: int = 0


class ControlMetrics:
    """The control plane's series (training runs, catalog gauges from ``catalog``) and the
    gateway replicas' latest reports."""

    def __init__(self, catalog: Callable[[], Iterable[Family]]) -> None:
        self.registry = Registry(threading.Lock())
        self.trainings = self.registry.counter(
            "vaultvec_index_trainings_total",
            "training runs ended, by outcome",
            (INDEX_ID, "outcome"),
        )
        self.training_s = self.registry.histogram(
            "vaultvec_index_training_seconds",
            "duration of training runs",
            (INDEX_ID,),
            constants.TRAINING_BUCKETS,
        )
        self.registry.collector(catalog)
        self._gateways: dict[str, tuple[float, list[Family]]] = {}
        export_to_ray(self.registry)

    def training(self, index_id: str, seconds: float, ok: bool) -> None:
        with self.registry.lock:
            self.trainings.inc((index_id, "success" if ok else "error"))
            self.training_s.observe((index_id,), seconds)

    def gateway(self, replica: str, families: list[Family]) -> None:
        self._gateways[replica] = (time.monotonic(), families)

    def gateways_except(self, replica: str) -> list[list[Family]]:
        now = time.monotonic()
        for name, (at, _) in list(self._gateways.items()):
            if now - at > constants.GATEWAY_STALE_S:
                self._gateways.pop(name, None)
        return [f for name, (_, f) in list(self._gateways.items()) if name != replica]
