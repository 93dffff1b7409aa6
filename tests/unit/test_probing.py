"""Automatic probing: the per-query rule (actors.engine.adaptive), what each result needs
of it (slack_needed), its calibration, the gateway's live recall estimate and scales, and the
engine around them with real shards in-process (no Ray)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import faiss
import numpy as np
import pytest

from actors.control.client import ControlClient
from actors.control.options import IndexView
from actors.control.training import (
    TrainParams,
    calibrate_nprobe,
    calibrate_probing,
    smallest_scale,
    train_template,
)
from actors.engine import adaptive
from actors.engine.filters import parse_filter
from actors.engine.ivf import PartitionIndex, serialize
from actors.engine.shard import Shard
from actors.engine.strings import StringBlock
from actors.engine.topk import merge_topk
from actors.pool import wire
from actors.storage import LocalStore, codec, persistence
from actors.types import (
    EXACT_SCAN,
    IndexConfig,
    IndexMeta,
    Probing,
    SearchRequest,
    SearchResult,
    UpsertBatch,
    probe_slack,
    shard_assignment,
)
from serve_app.constants import (
    RECALL_EARLY,
    RECALL_EARLY_ROWS,
    RECALL_EARLY_WAITING,
    RECALL_EARLY_WORK,
    RECALL_MARGIN_SE,
    RECALL_MAX_ROWS,
    RECALL_MIN_SAMPLES,
    RECALL_REST,
    RECALL_WARM_IN_VAIN,
)
from serve_app.gateway import measuring
from serve_app.gateway.engine import CachedView, Engine
from serve_app.gateway.hits import Query, merge
from serve_app.gateway.probing import (
    Bucket,
    IndexProbing,
    Needs,
    RecallMonitor,
    _fitted,
    overlap,
)
from tests.helpers import exact_knn

KEY = bytes(range(32))


def blobs(n: int, d: int, seed: int, centres: int = 30, spread: float = 0.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = np.random.default_rng(1000).normal(size=(centres, d)).astype(np.float32)
    return (c[rng.integers(0, centres, n)] + spread * rng.normal(size=(n, d))).astype(np.float32)


def exact(x: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray:
    rows = np.arange(len(x)) if mask is None else np.flatnonzero(mask)
    return rows[exact_knn(x[rows], q, k)[1]]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(f, t)) / len(t) for f, t in zip(found, truth)]))


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    x = blobs(4000, 16, seed=1)
    template = train_template(x, "ivfflat", 64, None, None, TrainParams(max_iters=10))
    part = PartitionIndex(faiss.clone_index(template))
    part.add(np.arange(len(x), dtype=np.int64), x)
    # Queries off the data: points between two items, plus noise.
    rng = np.random.default_rng(2)
    q = (0.5 * (x[rng.integers(0, 4000, 60)] + x[rng.integers(0, 4000, 60)])).astype(np.float32)
    q += rng.normal(scale=0.3, size=q.shape).astype(np.float32)
    mask = rng.random(len(x)) < 0.05
    return {"x": x, "template": template, "part": part, "q": q, "mask": mask}


def bits_of(mask: np.ndarray | None) -> np.ndarray | None:
    return None if mask is None else np.packbits(mask, bitorder="little")


def test_list_counts_are_the_items_and_the_matches_per_list(data: dict[str, Any]) -> None:
    part, x, mask = data["part"], data["x"], data["mask"]
    _, lists = part.index.quantizer.search(x, 1)
    np.testing.assert_array_equal(part.list_counts(), np.bincount(lists[:, 0], minlength=64))
    np.testing.assert_array_equal(
        part.list_counts(bits_of(mask)), np.bincount(lists[mask, 0], minlength=64)
    )


@pytest.mark.parametrize("filtered", [False, True])
def test_unbounded_slack_is_exact_even_from_a_one_list_plan(
    data: dict[str, Any], filtered: bool
) -> None:
    part, x, q = data["part"], data["x"], data["q"]
    mask = data["mask"] if filtered else None
    dis, lists = part.assign(q, 1)  # the rule assigns the lists it needs beyond the plan
    _, labels, scanned = adaptive.adaptive(part, q, 10, lists, dis, bits_of(mask), 1, 1e9)
    assert recall(labels, exact(x, q, 10, mask)) == 1.0
    # Every list once, plus the first passes of the plans that proved too short.
    assert (scanned <= 2 * 64).all() and scanned.mean() > 1


def test_zero_slack_scans_the_first_lists_or_until_k_matches(data: dict[str, Any]) -> None:
    part, _x, q, mask = data["part"], data["x"], data["q"], data["mask"]
    dis, lists = part.assign(q, 40)
    _d, labels, scanned = adaptive.adaptive(part, q, 10, lists, dis, None, 3, 0.0)
    _ref_d, ref_l = part.search(q, 10, lists[:, :3], dis[:, :3], None)
    np.testing.assert_array_equal(labels, ref_l)
    assert (scanned == 3).all()
    # A 5% filter: the first pass goes on until its lists hold 10 matches, so 10 come back.
    _, labels, scanned = adaptive.adaptive(part, q, 10, lists, dis, bits_of(mask), 3, 0.0)
    assert (labels >= 0).all() and mask[labels].all()
    assert scanned.mean() > 3


@pytest.mark.parametrize("filtered", [False, True])
def test_slack_needed_predicts_recall_exactly(data: dict[str, Any], filtered: bool) -> None:
    part, x, q = data["part"], data["x"], data["q"]
    mask = data["mask"] if filtered else None
    truth = exact(x, q, 10, mask)
    dis_all, lists_all = part.assign(q, part.nlist)
    needed = adaptive.slack_needed(part, q, 10, lists_all, dis_all, bits_of(mask), 4, truth)
    dis, lists = part.assign(q, 24)
    for slack in (0.05, 0.2, 0.5, 1.0):
        _, labels, _ = adaptive.adaptive(part, q, 10, lists, dis, bits_of(mask), 4, slack)
        assert recall(labels, truth) == pytest.approx(np.mean(needed < slack))


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize(
    ("k", "first", "slack", "width"),
    [(10, 3, 0.2, 20), (10, 1, 0.0, 4), (10, 4, 1e9, 2), (50, 2, 0.5, 12), (1, 1, 0.05, 64)],
)
def test_a_single_query_is_answered_as_in_a_batch_bit_for_bit(
    data: dict[str, Any], filtered: bool, k: int, first: int, slack: float, width: int
) -> None:
    """A lone query takes its own path through the rule (plain lists instead of numpy on one
    row): the same lists scanned and the same answer as its row of a batch, plans with holes,
    too short, or every list, under a selective filter too."""
    part, q = data["part"], data["q"]
    bits = bits_of(data["mask"] if filtered else None)
    dis, lists = part.assign(q, width)
    lists[::4, 1] = -1  # lists a plan skips
    batch = adaptive.adaptive(part, q, k, lists, dis, bits, first, slack)
    for i in range(len(q)):
        one = adaptive.adaptive(
            part, q[i : i + 1], k, lists[i : i + 1], dis[i : i + 1], bits, first, slack
        )
        for got, want in zip(one, batch):
            np.testing.assert_array_equal(got[0], want[i])


def test_smallest_scale_is_the_exact_need_reaching_the_goal() -> None:
    needed = np.array([[0.0, 0.0, 1.0, np.nan], [0.0, 2.0, 2.0, 2.0]])
    # Recall above s: query 0 -> 2/3 below 1, 1 above it; query 1 -> 1/4 below 2, 1 above it.
    assert smallest_scale(needed, 1.0) == pytest.approx(2.0, rel=1e-3)
    assert smallest_scale(needed, 0.6) == pytest.approx(1.0, rel=1e-3)  # (1 + 1/4) / 2
    assert smallest_scale(needed, 0.4) == 1 / 64  # the first pass alone: the smallest slack
    assert smallest_scale(needed, 0.6) > 1.0  # strictly above the need (the bound is strict)
    assert smallest_scale(np.full((2, 3), np.nan), 0.9) == 1 / 64


def test_calibrated_probing_reaches_target_on_fresh_queries() -> None:
    x = blobs(12_000, 24, seed=3, centres=60, spread=0.8)
    base, fresh = x[:11_700], x[11_700:]
    template = train_template(base, "ivfflat", 100, None, None, TrainParams(max_iters=10))
    fixed = calibrate_nprobe(template, base, 0.95)
    table = calibrate_probing(template, base, 0.95, fixed, n_shards=2)
    assert [t[0] for t in table] == [1, 10, 100]
    for k, first, slack, slack_filtered in table:
        assert first == max(1, -(-dict(fixed)[k] // 2)) and 0 < slack <= slack_filtered
    part = PartitionIndex(faiss.clone_index(template))
    part.add(np.arange(len(base), dtype=np.int64), base)
    _, first, slack, _ = table[1]
    dis, lists = part.assign(fresh, 4 * first + 8)
    _, labels, scanned = adaptive.adaptive(part, fresh, 10, lists, dis, None, first, slack)
    assert recall(labels, exact(base, fresh, 10)) >= 0.93
    assert scanned.mean() < 100


def test_probe_slack_interpolates_on_log_selectivity() -> None:
    ones = (1.0, 1.0, 1.0)
    assert probe_slack((0.2, 0.8), ones, 1.0) == (pytest.approx(0.2), pytest.approx(0.2), 0)
    slack, base, bucket = probe_slack((0.2, 0.8), (1.5, 2.0, 3.0), 0.05)
    assert base == pytest.approx(0.8) and slack == pytest.approx(2.4) and bucket == 2
    _, base, bucket = probe_slack((0.2, 0.8), ones, 10**-0.5)
    assert base == pytest.approx(0.4) and bucket == 1
    assert probe_slack((0.2, 0.8), (1.5, 2.0, 3.0), 0.97)[2] == 0


def test_config_keeps_its_probe_table_and_older_configs_use_the_fixed_one() -> None:
    cfg = IndexConfig(
        "n",
        "i",
        "ivfflat",
        "euclidean",
        2,
        8,
        version=1,
        n_lists=500,
        nprobe_table=((1, 4), (10, 8), (100, 20)),
        probe_table=((1, 2, 0.3, 0.5), (10, 4, 0.25, 0.4), (100, 10, 0.2, 0.3)),
    )
    again = IndexConfig.from_json(cfg.to_json())
    assert again == cfg
    assert cfg.auto_probing(10) == (4, (0.25, 0.4))
    assert cfg.auto_probing(400) == (20, (0.2, 0.3))
    old = cfg.to_json()
    del old["probe_table"]
    assert IndexConfig.from_json(old).auto_probing(10) is None


def test_bucket_fits_the_smallest_scale_reaching_target() -> None:
    b = Bucket()
    rng = np.random.default_rng(0)
    for _ in range(RECALL_MIN_SAMPLES - 1):
        b.needed.append(rng.uniform(0, 2, 10))
    b.fit(0.9)
    assert b.scale == 1.0  # too few samples: unchanged
    b.needed.append(rng.uniform(0, 2, 10))
    b.fit(0.9)
    assert 1.7 < b.scale <= 2.0  # 90% of needs are below 1.8, plus two standard errors
    b.needed.clear()
    for _ in range(50):
        b.needed.append(rng.uniform(0, 0.2, 10))
    b.fit(0.9)
    assert b.scale < 0.25  # narrows too


def test_the_margin_covers_the_next_queries_or_the_batch_measured() -> None:
    """Fitted for queries not seen yet, a rule aims at the target plus RECALL_MARGIN_SE
    standard errors of a difference of two means (sqrt(2) of the measured recall's); fitted for
    the batch the measured queries are rows of, at most one."""
    rng = np.random.default_rng(5)
    needs = [rng.uniform(0, 4, 10) for _ in range(200)]
    rows = np.stack(needs)

    def recall(scale: float) -> float:
        return float(np.mean(rows < scale))

    at_target = smallest_scale(rows, 0.9)
    se = float(np.std((rows < at_target).mean(axis=1))) / np.sqrt(len(rows))
    for ahead, spread in ((True, np.sqrt(2)), (False, 1.0)):
        aim = 0.9 + RECALL_MARGIN_SE * spread * se
        scale = _fitted(needs, 0.9, ahead)
        assert recall(scale) >= aim - 1e-12
        need = rows[rows < scale].max()  # the result whose need the scale is a hair above
        assert recall(need) < aim  # the smallest scale that reaches the aim
    assert _fitted(needs, 0.9, True) > _fitted(needs, 0.9, False) > at_target


def test_index_probing_reports_the_served_recall_and_scales() -> None:
    state = IndexProbing(version=1, target=0.95)
    assert state.report()["estimate"] is None
    needed = np.tile(np.array([0.0, 0.0, 3.0, np.nan]), (RECALL_MIN_SAMPLES, 1))
    state.record(2, np.full(RECALL_MIN_SAMPLES, 2 / 3), Needs(needed))
    report = state.report()
    assert report["estimate"] == pytest.approx(0.6667, abs=1e-4)
    assert report["sampled_queries"] == RECALL_MIN_SAMPLES
    scales = report["probe_scale"]
    assert scales["unfiltered"] == scales["broad_filter"] == 1.0  # no samples
    assert scales["selective_filter"] == pytest.approx(3.0, rel=1e-3)  # just above the need


def test_monitor_samples_its_share_and_nothing_while_busy() -> None:
    m = RecallMonitor(share=0.1, seed=0)
    picked = sum(len(m.pick(100, 10)) for _ in range(200))
    assert 1500 < picked < 2500
    assert len(m.pick(10_000, 10)) <= 16
    assert len(m.pick(100, 101)) == 0  # top_k past RECALL_MAX_K is not measured
    m.busy = True
    assert len(m.pick(100, 10)) == 0
    assert RecallMonitor(share=0.0).pick(100, 10).size == 0
    assert overlap([["a", "b"], ["c"]], [["a", "x"], [None]]).tolist() == [0.5, 1.0]


def test_an_index_measures_every_early_query_then_its_share() -> None:
    m = RecallMonitor(share=0.01, seed=0)
    state = IndexProbing(version=1, target=0.95)
    small = RECALL_EARLY_WORK // RECALL_EARLY_ROWS
    assert len(m.pick(500, 10, state, small)) == RECALL_EARLY_ROWS  # a batch: many of its queries
    assert len(m.pick(500, 10, state, 10 * small)) == RECALL_EARLY_ROWS // 10  # a larger index
    assert len(m.pick(500, 10, state)) == RECALL_MAX_ROWS  # its size not known
    assert len(m.pick(1, 10, state, small)) == 1  # a single query: itself
    state.learn(0, Needs(np.zeros((RECALL_EARLY - 3, 10))))
    assert len(m.pick(500, 10, state, small)) == 3  # no more than the early measurements left
    assert len(m.pick(500, 10, state, small, bucket=2)) == RECALL_EARLY_ROWS  # per kind
    state.learn(0, Needs(np.zeros((3, 10))))
    picked = sum(len(m.pick(1, 10, state)) for _ in range(2000))
    assert 5 < picked < 40  # then its share
    m.busy = True  # a measurement under way: an early batch waits its turn, a few at most
    young = IndexProbing(version=1, target=0.95)
    assert len(m.pick(500, 10, young, small)) == RECALL_EARLY_ROWS
    m.waiting.extend([()] * RECALL_EARLY_WAITING)
    assert len(m.pick(500, 10, young, small)) == 0
    assert len(m.pick(500, 10, state, small)) == 0  # past the early ones: none while busy
    assert m.warm_rows(500, 10, young, small, filtered=True).size == RECALL_EARLY_ROWS
    young.warmed_in_vain = RECALL_WARM_IN_VAIN  # filtered batches found their kinds warm
    assert m.warm_rows(500, 10, young, small, filtered=True).size == 0
    assert m.warm_rows(500, 10, young, small, filtered=False).size == RECALL_EARLY_ROWS


def learned_state() -> IndexProbing:
    rng = np.random.default_rng(3)
    state = IndexProbing(version=4, target=0.95)
    for bucket in (0, 2):
        needed = rng.uniform(0, 0.5, (RECALL_MIN_SAMPLES + 5, 10))
        needed[::3, -2:] = np.nan  # queries with fewer results than top_k
        state.record(bucket, rng.uniform(0.8, 1.0, RECALL_MIN_SAMPLES + 5), Needs(needed))
    state.queries, state.lists_scanned = 1234, 5678.5
    return state


def test_learned_state_survives_its_bytes() -> None:
    state = learned_state()
    again = IndexProbing.unpack(state.pack())
    assert again.report() == state.report()
    assert again.scales == state.scales and again.scales[0] != 1.0
    for a, b in zip(again.buckets, state.buckets):
        assert [r.tolist() for r in a.needed] == [r.tolist() for r in b.needed]
    # it goes on learning from where it was: the same next fit
    more = np.full((5, 10), 0.9)
    for s in (state, again):
        s.record(0, np.ones(5), Needs(more))
    assert again.scales == state.scales


def test_the_monitor_starts_from_the_stored_state_of_its_version_only() -> None:
    stored = learned_state().pack()
    m = RecallMonitor(share=0.01, seed=0)
    assert m.of("ix", 4, 0.95, stored).scales == learned_state().scales
    assert m.of("iy", 5, 0.95, stored).scales == (1.0, 1.0, 1.0)  # another training version
    assert m.of("ix", 4, 0.95, None).sampled == learned_state().sampled  # kept in memory


def test_probing_state_is_kept_sealed_for_its_training_version(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    cfg = IndexConfig("p", "pid", "ivfflat", "euclidean", 1, dimension=4, version=3)
    key = bytes(range(32))
    assert persistence.read_probing(store, key, cfg) is None
    persistence.write_probing(store, key, cfg, b"learned")
    assert persistence.read_probing(store, key, cfg) == b"learned"
    assert b"learned" not in store.get(persistence.probing_key("pid"))  # type: ignore[operator]
    assert persistence.read_probing(store, key, cfg.evolve(version=4)) is None  # retrained


# -- the engine with real shards in-process ------------------------------------------------------
class Ref:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        async def done() -> Any:
            return self.value

        return done().__await__()


class Handle:
    """A pool actor handle that calls the Shard object in this process (the partition argument
    of every call names it)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.requests: list[SearchRequest] = []

    def search(self, partition: Any, key: bytes, req: SearchRequest) -> SearchResult:
        self.requests.append(req)
        return self.shard.search(key, req)

    def __getattr__(self, name: str) -> Any:
        handle = self

        class Method:
            def remote(self, partition: Any, *args: Any) -> Ref:
                if name == "framed":  # a frame (and the request beside it, when large)
                    return Ref(wire.answer(handle, partition, *args))
                return Ref(getattr(handle.shard, name)(*args))

        return Method()


@pytest.fixture
def engine_index(tmp_path) -> tuple[Engine, CachedView, np.ndarray, list[Handle], Any]:
    x = blobs(3000, 16, seed=5)
    ids = [f"i{j}" for j in range(len(x))]
    meta = [b'{"even": true}' if j % 2 == 0 else b'{"even": false}' for j in range(len(x))]
    template = train_template(x, "ivfflat", 48, None, None, TrainParams(max_iters=10))
    fixed = calibrate_nprobe(template, x, 0.95)
    probing = calibrate_probing(template, x, 0.95, fixed, n_shards=2)
    shards = [Shard(f"file://{tmp_path}", "p", "pid", s) for s in range(2)]
    assign = shard_assignment(ids, 2)
    for s, shard in enumerate(shards):
        rows = np.flatnonzero(assign == s)
        shard.upsert(
            KEY,
            UpsertBatch(
                tuple(ids[i] for i in rows),
                x[rows],
                None,
                tuple(meta[i] for i in rows),
                (None,) * len(rows),
            ),
        )
        shard.rebuild(KEY, 1, serialize(template), fixed)
    cfg = IndexConfig(
        "p",
        "pid",
        "ivfflat",
        "euclidean",
        2,
        16,
        version=1,
        n_lists=48,
        nprobe_table=fixed,
        probe_table=probing,
    )
    handles = [Handle(s) for s in shards]
    quantizer = faiss.IndexFlatL2(16)
    quantizer.add(template.quantizer.reconstruct_n(0, 48))
    view = IndexView(IndexMeta("p", "pid", b"s", b"v"), cfg, tuple(handles), None)
    engine = Engine(ControlClient(None), recall_sample_share=1.0)
    return engine, CachedView(view, KEY, quantizer), x, handles, template


def test_explicit_n_probes_scans_exactly_those_lists_as_before(engine_index: Any) -> None:
    engine, cv, x, handles, template = engine_index
    q = blobs(20, 16, seed=9)
    hits = asyncio.run(engine.search(cv, q, Query(10, 5, with_metadata=False)))
    req = handles[0].requests[-1]
    assert req.list_nos.shape == (20, 5) and req.probing.mode == "fixed"
    assert hits.lists_scanned == 20 * 5
    reference = faiss.clone_index(template)
    reference.add(x)
    reference.nprobe = 5
    coarse, lists = template.quantizer.search(q, 5)
    _, ref = reference.search_preassigned(q, 10, lists, coarse)
    assert hits.ids.tolist() == [[f"i{j}" for j in row] for row in ref]
    assert engine.monitor.peek("pid", 1) is None  # explicit queries are not sampled


def test_automatic_probing_is_counted_measured_and_reported(engine_index: Any) -> None:
    engine, cv, x, handles, _ = engine_index
    q = blobs(8, 16, seed=11)

    async def run() -> Any:
        hits = await engine.search(
            cv, q, Query(10, filter=parse_filter({"even": True}), with_metadata=False)
        )
        await asyncio.gather(*engine._measuring)
        return hits

    hits = asyncio.run(run())
    req = handles[0].requests[0]
    assert req.probing.mode == "adaptive" and req.probing.first > 0 and req.probing.slacks[0] > 0
    assert handles[0].requests[-1].probing.mode == "measure"
    state = engine.monitor.peek("pid", 1)
    assert state is not None and state.queries == 8 and state.sampled == 8
    report = state.report()
    assert report["lists_scanned_per_query"] == pytest.approx(hits.lists_scanned / 8)
    even = np.arange(len(x)) % 2 == 0
    truth = exact(x, q, 10, even)
    found = np.array([[int(i[1:]) for i in row] for row in hits.ids.tolist()])
    assert report["estimate"] == pytest.approx(recall(found, truth), abs=1e-4)


def test_sharded_adaptive_equals_merging_the_partitions(engine_index: Any) -> None:
    """Each shard applies the rule to its own lists; the gateway merges (as search does)."""
    engine, cv, _x, handles, _ = engine_index
    q = blobs(30, 16, seed=12)
    first, slacks = cv.config.auto_probing(10) or (0, (0.0, 0.0))
    coarse, lists = cv.quantizer.search(q, 4 * first + 8)
    probing = Probing("adaptive", first=first, slacks=slacks)
    req = SearchRequest(q, 10, 1, lists, coarse, None, False, probing)
    parts = [h.shard.search(KEY, req) for h in handles]
    hits = asyncio.run(engine.search(cv, q, Query(10, with_metadata=False)))
    assert hits.ids.tolist() == merge(parts, 10, False).ids.tolist()
    assert hits.lists_scanned == sum(p.lists_scanned for p in parts) / 2
    d = [p.distances for p in parts]
    np.testing.assert_array_equal(merge_topk(d, d, 10)[0], hits.distances)


def test_an_empty_shard_answers_a_measure_request_with_no_needs(tmp_path) -> None:
    shard = Shard(f"file://{tmp_path}", "e", "eid", 0)
    q = blobs(3, 16, seed=1)
    lists, coarse = np.zeros((3, 1), dtype=np.int64), np.zeros((3, 1), dtype=np.float32)
    probing = Probing("measure", first=2, slacks=(0.3, 0.5))
    req = SearchRequest(q, 5, 0, lists, coarse, None, False, probing)
    result = shard.search(KEY, req)
    n_match = result.matched
    assert n_match == 0 and result.needed is not None and np.isnan(result.needed).all()


def test_a_fresh_kinds_first_batch_is_answered_with_the_scale_it_fits(engine_index: Any) -> None:
    """The first batch of a kind with no fitted scale: some of its rows are measured before it
    is answered, and the whole batch is answered with the scale they fit."""
    engine, cv, _x, handles, _ = engine_index
    cv.counts.update({0: 1500, 1: 1500})  # the items are known: 128 rows fit the work bound
    q = blobs(150, 16, seed=21)
    hits = asyncio.run(engine.search(cv, q, Query(10, with_metadata=False)))
    modes = [r.probing.mode for r in handles[0].requests]
    assert modes == ["measure", "adaptive"]
    measured, answered = handles[0].requests
    assert len(measured.queries) == RECALL_EARLY_ROWS
    state = engine.monitor.peek("pid", 1)
    assert state is not None and state.sampled == RECALL_EARLY_ROWS and state.queries == 150
    assert answered.probing.scales == state.scales and state.scales[0] != 1.0
    # fitted for this batch, whose rows they are: one standard error of margin, not sqrt(2)
    needs = state.buckets[0].needed
    assert state.scales[0] == _fitted(needs, state.target, ahead=False)
    assert state.scales[0] < _fitted(needs, state.target, ahead=True)
    assert hits.counts.tolist() == [10] * 150
    # the rows the scale was fitted on would flatter the estimate: it waits for other ones
    assert state.report()["estimate"] is None
    # the next batch of the kind is answered first and measured after (if at all)
    asyncio.run(engine.search(cv, blobs(40, 16, seed=22), Query(10, with_metadata=False)))
    assert handles[0].requests[2].probing.mode == "adaptive"
    # a filter matching every item is of the unfiltered kind: measured first in vain
    every = parse_filter({"even": {"$in": [True, False]}})
    asyncio.run(engine.search(cv, blobs(40, 16, seed=23), Query(10, filter=every)))
    assert handles[0].requests[3].probing.mode == "measure" and state.warmed_in_vain == 1


def test_a_first_batch_whose_measurement_fails_is_answered_as_calibrated(
    engine_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, cv, _x, handles, _ = engine_index
    cv.counts.update({0: 1500, 1: 1500})
    real = handles[1].search

    def other_version(partition: Any, key: bytes, req: SearchRequest) -> SearchResult:
        got = real(partition, key, req)  # a shard that searched as planned: no needs
        return dataclasses.replace(got, needed=None)

    monkeypatch.setattr(handles[1], "search", other_version)
    q = blobs(60, 16, seed=23)
    hits = asyncio.run(engine.search(cv, q, Query(10, with_metadata=False)))
    assert hits.counts.tolist() == [10] * 60
    answered = handles[0].requests[-1]
    assert answered.probing.mode == "adaptive" and answered.probing.scales == (1.0, 1.0, 1.0)


def test_background_measurements_rest_in_proportion_to_their_cost(
    engine_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, cv, _x, _handles, _ = engine_index
    now = [0.0]
    monkeypatch.setattr(measuring.time, "monotonic", lambda: now[0])
    measure_one = engine._measure_one

    async def costly(job: Any) -> None:  # a measurement that takes 0.4 s
        await measure_one(job)
        now[0] += 0.4

    monkeypatch.setattr(engine, "_measure_one", costly)
    rests: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        rests.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(measuring.asyncio, "sleep", sleep)

    async def run() -> None:
        await engine.search(cv, blobs(8, 16, seed=31), Query(10, with_metadata=False))
        await asyncio.gather(*engine._measuring)

    asyncio.run(run())
    assert rests == [pytest.approx(0.4 * RECALL_REST)]


def test_queries_with_no_exact_result_still_end_a_kinds_early_measurements() -> None:
    """A filter matching nothing gives no needs; its queries are measured all the same."""
    m = RecallMonitor(share=0.01, seed=0)
    state = IndexProbing(version=1, target=0.95)
    small = RECALL_EARLY_WORK // RECALL_EARLY_ROWS
    state.learn(2, Needs(np.full((RECALL_EARLY, 10), np.nan)))
    assert state.early_left(2) == 0 and len(state.buckets[2].needed) == 0
    assert len(m.pick(500, 10, state, small, bucket=2)) < RECALL_EARLY_ROWS  # its share only
    state.learn(1, Needs(np.full((RECALL_MIN_SAMPLES, 10), np.nan)))
    assert not state.cold(filtered=True)  # nothing to wait for: not measured first again
    assert m.warm_rows(500, 10, state, small, filtered=True).size == 0
    again = IndexProbing.unpack(state.pack())
    assert [b.measured for b in again.buckets] == [0, RECALL_MIN_SAMPLES, RECALL_EARLY, 0]


def test_one_batch_of_a_kind_at_a_time_waits_for_its_measurement() -> None:
    m = RecallMonitor(share=0.01, seed=0)
    state = IndexProbing(version=1, target=0.95)
    small = RECALL_EARLY_WORK // RECALL_EARLY_ROWS
    state.warming.add(False)  # an unfiltered first batch is being measured
    assert m.warm_rows(500, 10, state, small, filtered=False).size == 0
    assert m.warm_rows(500, 10, state, small, filtered=True).size == RECALL_EARLY_ROWS


def test_queries_scanned_exactly_leave_the_selective_kind_its_early_measurements() -> None:
    """A selective filter answered by an exact scan has no scale to learn: its queries are
    their own kind, sampled at the share, and the selective filters that probe are still
    measured from their first query on."""
    m = RecallMonitor(share=0.01, seed=0)
    state = IndexProbing(version=1, target=0.95)
    small = RECALL_EARLY_WORK // RECALL_EARLY_ROWS
    state.learn(EXACT_SCAN, Needs(np.full((RECALL_EARLY, 10), np.nan)))
    assert state.early_left(EXACT_SCAN) == 0
    assert len(m.pick(500, 10, state, small, bucket=EXACT_SCAN)) < RECALL_EARLY_ROWS
    assert state.early_left(2) == RECALL_EARLY
    assert len(m.pick(500, 10, state, small, bucket=2)) == RECALL_EARLY_ROWS
    assert state.cold(filtered=True)
    assert len(state.scales) == EXACT_SCAN  # a scale per probing kind only
    assert set(state.report()["probe_scale"]) == {"unfiltered", "broad_filter", "selective_filter"}


def part(bucket: int) -> SearchResult:
    d = np.array([[1.0, 2.0]], dtype=np.float32)
    return SearchResult(d, StringBlock.from_list(["a", "b"], (1, 2)), None, 1, bucket=bucket)


def test_a_batch_is_of_the_kind_its_probing_shards_tell() -> None:
    assert merge([part(2), part(EXACT_SCAN)], 2, False).bucket == 2
    assert merge([part(EXACT_SCAN), part(EXACT_SCAN)], 2, False).bucket == EXACT_SCAN
    assert merge([part(0), part(1)], 2, False).bucket == 1


def test_a_state_kept_before_the_exact_scan_kind_keeps_its_scales() -> None:
    """What an earlier vaultvec kept (three kinds) is read, not learned afresh."""
    needs = [np.array([0.5, 0.7]), np.array([1.2]), np.array([2.0, 2.5, 3.0])]
    meta = {
        "version": 3,
        "target": 0.95,
        "scales": [0.8, 1.1, 2.4],
        "sampled": 700,
        "queries": 9000,
        "lists_scanned": 12.5,
        "measured": [400, 300, 250],
    }
    arrays = {"served": np.array([0.9, 1.0])}
    for i, r in enumerate(needs):
        arrays[f"lens{i}"] = np.array([len(r)], dtype=np.int64)
        arrays[f"needed{i}"] = r
    state = IndexProbing.unpack(codec.pack(meta, arrays))
    assert state.scales == (0.8, 1.1, 2.4)
    assert [b.measured for b in state.buckets] == [400, 300, 250, 0]
    assert [list(b.needed[0]) for b in state.buckets[:3]] == [list(r) for r in needs]
    assert state.early_left(2) == RECALL_EARLY - 250
