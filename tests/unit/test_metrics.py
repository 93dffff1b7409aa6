"""Metrics without Ray: recording, merging across processes, the Ray mirror's arithmetic, the
per-index labelling rule, the Prometheus text, and the ASGI recording of requests."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from actors import metrics as m
from serve_app import telemetry as sm

BUCKETS = (0.001, 0.01, 0.1)


def test_histogram_buckets_are_upper_inclusive_with_sums() -> None:
    reg = m.Registry()
    h = reg.histogram("vaultvec_t_seconds", "t", ("route",), BUCKETS)
    for v in (0.0005, 0.001, 0.002, 0.1, 7.0):
        h.observe(("a",), v)
    (family,) = reg.snapshot()
    counts, sums = family.series[("a",)]
    assert counts == (2, 1, 1, 1)  # 0.001 itself falls in le=0.001, as Prometheus counts
    assert sums == pytest.approx((0.0015, 0.002, 0.1, 7.0))


def test_snapshot_is_a_copy() -> None:
    reg = m.Registry()
    c = reg.counter("vaultvec_t_total", "t", ("status",))
    c.inc(("200",))
    (before,) = reg.snapshot()
    c.inc(("200",), 2)
    c.inc(("500",))
    assert before.series == {("200",): 1.0}
    assert reg.snapshot()[0].series == {("200",): 3.0, ("500",): 1.0}


def test_merge_sums_processes_and_skips_a_family_of_another_shape() -> None:
    a = [
        m.Family("c_total", "counter", "", ("r",), (), {("x",): 1.0}),
        m.Family("h", "histogram", "", (), (1.0,), {(): ((1, 0), (0.5, 0.0))}),
    ]
    b = [
        m.Family("c_total", "counter", "", ("r",), (), {("x",): 2.0, ("y",): 5.0}),
        m.Family("h", "histogram", "", (), (1.0,), {(): ((0, 2), (0.0, 6.0))}),
    ]
    odd = [m.Family("c_total", "counter", "", ("other",), (), {("z",): 100.0})]
    merged = m.merge([a, b, odd])
    assert merged["c_total"].series == {("x",): 3.0, ("y",): 5.0}
    assert merged["h"].series == {(): ((1, 2), (0.5, 6.0))}
    assert a[0].series == {("x",): 1.0}  # inputs untouched


def test_without_label_sums_over_it() -> None:
    f = m.Family("g", "gauge", "", (m.INDEX_ID, "state"), (), {("i1", "a"): 1.0, ("i2", "a"): 2.0})
    out = m.without_label(f, m.INDEX_ID)
    assert out.labels == ("state",) and out.series == {("a",): 3.0}
    assert m.without_label(out, m.INDEX_ID) is out


class FakeRayMetric:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", value, tags))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("set", value, tags))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", value, tags))


class FakeExport(m.RayExport):
    def __init__(self, registry: m.Registry) -> None:
        super().__init__(registry)
        self.fakes: dict[str, FakeRayMetric] = {}

    def _metric(self, f: m.Family) -> Any:
        return self.fakes.setdefault(f.name, FakeRayMetric())


@given(
    st.lists(st.floats(min_value=0, max_value=1.0, allow_nan=False), max_size=40),
    st.integers(0, 40),
)
def test_ray_mirror_sends_each_bucket_its_new_observations_and_sum(
    values: list[float], split: int
) -> None:
    reg = m.Registry()
    h = reg.histogram("vaultvec_t_seconds", "t", (m.INDEX_ID,), BUCKETS)
    export = FakeExport(reg)
    for v in values[:split]:
        h.observe(("i1",), v)
    export.flush()
    for v in values[split:]:
        h.observe(("i2",), v)  # another index: summed away before Ray sees it
    export.flush()
    sent = [v for kind, v, tags in export.fakes["vaultvec_t_seconds"].calls if kind == "observe"]
    assert all(tags == {} for _, _, tags in export.fakes["vaultvec_t_seconds"].calls)
    counts, sums = m.histogram_row(sent, BUCKETS)
    expect = m.histogram_row(values, BUCKETS)
    assert counts == expect[0]
    assert sum(sums) == pytest.approx(sum(expect[1]), abs=1e-9)


def test_ray_mirror_sends_counter_increases_and_zeroes_vanished_gauges() -> None:
    reg = m.Registry()
    c = reg.counter("vaultvec_t_total", "t", ("status",))
    gauges: list[m.Family] = [m.gauge("vaultvec_g", "g", ("state",), {("a",): 4})]
    reg.collector(lambda: gauges)
    pushed: list[list[m.Family]] = []
    export = FakeExport(reg)
    export.also = pushed.append
    c.inc(("200",), 3)
    export.flush()
    c.inc(("200",), 2)
    gauges[:] = [m.gauge("vaultvec_g", "g", ("state",), {("b",): 1})]
    export.flush()
    assert [v for _, v, _ in export.fakes["vaultvec_t_total"].calls] == [3.0, 2.0]
    assert export.fakes["vaultvec_g"].calls[-2:] == [
        ("set", 0.0, {"state": "a"}),
        ("set", 1.0, {"state": "b"}),
    ]
    assert len(pushed) == 2


def test_bucket_value_stays_inside_its_bucket() -> None:
    assert m.bucket_value(0.1 + 1e-12, BUCKETS, 2) == 0.1
    inside = m.bucket_value(0.01, BUCKETS, 2)
    assert 0.01 < inside <= 0.1


# -- the service view ------------------------------------------------------------------------
def report(names: dict[str, str]) -> m.ServiceReport:
    idx = (m.INDEX_ID,)
    pool = [
        m.gauge("vaultvec_index_items", "items", idx, {("id1",): 10, ("id2",): 5, ("gone",): 7}),
        m.gauge("vaultvec_index_partitions_loaded", "loaded", idx, {("id1",): 2}),
        m.single("vaultvec_pool_rss_bytes", "rss", 100),
    ]
    other_gateway = [
        m.Family(
            "vaultvec_requests_total",
            "counter",
            "r",
            ("route", "status"),
            (),
            {("/v1/vectors/query", "200"): 4.0},
        ),
        m.gauge(sm.RECALL_SUM, "", idx, {("id1",): 9.0}),
        m.gauge(sm.RECALL_SIZE, "", idx, {("id1",): 10.0}),
    ]
    return m.ServiceReport([other_gateway], [], [pool, pool], names, pools_unreachable=1)


def scrape(text: bytes) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_render_labels_indexes_by_name_only_when_allowed() -> None:
    names = {"id1": "alpha", "id2": "beta"}
    own = [
        m.Family(
            "vaultvec_requests_total",
            "counter",
            "r",
            ("route", "status"),
            (),
            {("/v1/vectors/query", "200"): 1.0},
        ),
        m.gauge(sm.RECALL_SUM, "", (m.INDEX_ID,), {("id2",): 3.0}),
        m.gauge(sm.RECALL_SIZE, "", (m.INDEX_ID,), {("id2",): 5.0}),
    ]
    named = scrape(sm.render(report(names), own, index_labels=True))
    assert named["vaultvec_index_items"] == {
        (("index", "alpha"),): 20.0,
        (("index", "beta"),): 10.0,
    }
    assert named["vaultvec_index_unlocked"] == {
        (("index", "alpha"),): 1.0,
        (("index", "beta"),): 0.0,
    }
    assert named["vaultvec_index_recall_estimate"] == {
        (("index", "alpha"),): 0.9,
        (("index", "beta"),): 0.6,
    }
    assert named["vaultvec_requests_total"] == {
        (("route", "/v1/vectors/query"), ("status", "200")): 5.0
    }
    assert named["vaultvec_pool_rss_bytes"] == {(): 200.0}
    assert named["vaultvec_pool_unreachable"] == {(): 1.0}
    assert named["vaultvec_indexes"] == {(("state", "locked"),): 1.0, (("state", "unlocked"),): 1.0}

    text = sm.render(report(names), own, index_labels=False)
    plain = scrape(text)
    assert b"alpha" not in text and b"id1" not in text and b"index_id" not in text
    assert plain["vaultvec_index_items"] == {(): 44.0}  # a deleted index's partitions too
    assert plain["vaultvec_index_recall_estimate"] == {(): pytest.approx(12 / 15)}
    assert "vaultvec_index_unlocked" not in plain
    assert not [name for name in plain if "internal" in name]


# -- recording requests ----------------------------------------------------------------------
async def handler(request: Any) -> PlainTextResponse:
    t = sm.lap("parse", sm.started())
    sm.lap("search", t)
    sm.lap("search", t)
    return PlainTextResponse("ok")


async def broken(request: Any) -> PlainTextResponse:
    raise RuntimeError("boom")


def counted(route: str, status: str) -> float:
    return float(sm.REQUESTS.series.get((route, status), 0.0))


def stage_count(route: str, stage: str) -> int:
    row = sm.STAGES.series.get((route, stage))
    return sum(row[0]) if row else 0


@pytest.mark.anyio
async def test_request_metrics_records_route_status_and_stages() -> None:
    app = Starlette(routes=[Route("/v1/x", handler), Route("/v1/broken", broken)])
    wrapped = sm.RequestMetrics(app, {"/v1/x", "/v1/broken"})
    before = (counted("/v1/x", "200"), counted(sm.OTHER, "404"), counted("/v1/broken", "500"))
    stages_before = stage_count("/v1/x", "search")
    transport = httpx.ASGITransport(app=wrapped, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/v1/x")).status_code == 200
        assert (await client.get("/v1/secret-looking-path")).status_code == 404
        assert (await client.get("/v1/broken")).status_code == 500
    after = (counted("/v1/x", "200"), counted(sm.OTHER, "404"), counted("/v1/broken", "500"))
    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]
    assert stage_count("/v1/x", "search") == stages_before + 1  # noted twice, observed once
    assert not [k for k in sm.REQUESTS.series if "secret-looking-path" in k[0]]


def test_lap_outside_a_request_only_tells_the_time() -> None:
    t = sm.now()
    assert sm.lap("parse", t) >= t


@pytest.mark.anyio
async def test_track_records_a_ray_transport_error_status() -> None:
    from actors.errors import Unauthorized

    before = counted("ray:test", "401")
    with pytest.raises(Unauthorized):
        async with sm.track("ray:test"):
            raise Unauthorized("no")
    assert counted("ray:test", "401") == before + 1


def test_registry_lock_keeps_counts_under_threads() -> None:
    reg = m.Registry(threading.Lock())
    c = reg.counter("vaultvec_t_total", "t")

    def work() -> None:
        for _ in range(20_000):
            with reg.lock:
                c.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert reg.snapshot()[0].series == {(): 80_000.0}
