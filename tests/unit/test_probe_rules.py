"""Automatic probing's choice of rule per kind of query: what an exact answer tells of each rule
(actors.engine.adaptive.probe_needs, list_ranks), how the gateway fits both and keeps the one
that reaches the recall aim in fewer lists (serve_app.gateway.probing.Bucket), and what a
shard scans for a kind probed with a fixed count (actors.engine.search)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from actors.engine import adaptive
from actors.engine.strings import StringBlock
from actors.storage import codec
from actors.types import REACH_SCALES, SearchResult, fixed_lists
from serve_app.constants import RECALL_FIXED_SAVING, RECALL_MIN_SAMPLES
from serve_app.gateway.hits import Query, merge
from serve_app.gateway.probing import Bucket, IndexProbing, Needs
from tests.unit.test_probing import bits_of, blobs, data, engine_index, exact

__all__ = ["data", "engine_index"]  # the fixtures, shared with test_probing


@pytest.mark.parametrize("filtered", [False, True])
def test_reach_is_what_the_rule_scans_at_each_slack(data: dict[str, Any], filtered: bool) -> None:
    part, x, q = data["part"], data["x"], data["q"]
    bits = bits_of(data["mask"] if filtered else None)
    truth = exact(x, q, 10, data["mask"] if filtered else None)
    dis, lists = part.assign(q, part.nlist)
    slacks = (0.0, 0.05, 0.2, 0.5, 1.0, 4.0)
    needed, reach = adaptive.probe_needs(part, q, 10, lists, dis, bits, 4, truth, None, slacks)
    assert reach.shape == (len(q), len(slacks))
    np.testing.assert_array_equal(
        needed, adaptive.slack_needed(part, q, 10, lists, dis, bits, 4, truth)
    )
    for i, slack in enumerate(slacks):
        _, _, scanned = adaptive.adaptive(part, q, 10, lists, dis, bits, 4, slack)
        np.testing.assert_array_equal(reach[:, i], scanned)
    assert (np.diff(reach, axis=1) >= 0).all() and reach[:, -1].mean() > reach[:, 0].mean()


@pytest.mark.parametrize("filtered", [False, True])
def test_list_ranks_tell_what_a_fixed_count_of_lists_finds(
    data: dict[str, Any], filtered: bool
) -> None:
    part, x, q = data["part"], data["x"], data["q"]
    mask = data["mask"] if filtered else None
    truth = exact(x, q, 10, mask)
    truth[::5, -1] = -1  # queries with fewer results
    dis, lists = part.assign(q, part.nlist)
    ranks = adaptive.list_ranks(part, lists, truth)
    assert np.isnan(ranks[::5, -1]).all() and not np.isnan(ranks[1::5]).any()
    for p in (1, 3, 8, 20):
        _, found = part.search(q, 10, lists[:, :p], dis[:, :p], bits_of(mask))
        held = np.array([np.isin(t, f) for t, f in zip(truth, found)])
        valid = truth >= 0
        np.testing.assert_array_equal(held[valid], ranks[valid] <= p)


def needs_of(lists: np.ndarray, reach_at: np.ndarray, first: int) -> Needs:
    """Measured queries whose results need ``lists`` lists in centroid order and whose
    adaptive rule scans ``reach_at[i]`` lists at every scale (the need: 0.5 for each)."""
    needed = np.full(lists.shape, 0.5)
    reach = np.repeat(reach_at[:, None], len(REACH_SCALES), axis=1).astype(np.float64)
    return Needs(needed, lists.astype(np.float64), reach, first)


def test_a_kind_takes_a_fixed_count_where_it_reaches_the_aim_in_fewer_lists() -> None:
    rng = np.random.default_rng(0)
    n = 3 * RECALL_MIN_SAMPLES
    lists = rng.integers(1, 13, (n, 10))  # every result within 12 lists
    state = IndexProbing(version=1, target=0.9)
    state.learn(1, needs_of(lists, np.full(n, 30), first=4))  # the adaptive rule: 30 lists
    b = state.buckets[1]
    assert b.fixed > 0 and state.fixed == (0.0, b.fixed, 0.0)
    count = fixed_lists(b.fixed, 4)
    assert count <= 12 and np.mean(lists <= count) >= 0.9  # the aim, on what it measured
    assert np.mean(lists <= count - 1) < 0.9 + 0.06  # and not much past it
    assert state.report()["probe_fixed"] == {"broad_filter": round(b.fixed, 4)}
    # where the adaptive rule scans fewer, or not clearly more, it stays
    assert RECALL_FIXED_SAVING > 0.85
    for adaptive_lists, takes_fixed in ((6, False), (count / 0.95, False), (count / 0.85, True)):
        other = IndexProbing(version=1, target=0.9)
        other.learn(1, needs_of(lists, np.full(n, adaptive_lists), first=4))
        assert (other.fixed[1] > 0) is takes_fixed, adaptive_lists
        assert bool(other.report()["probe_fixed"]) is takes_fixed


def test_a_batch_answered_with_its_own_rows_fit_takes_whichever_rule_costs_fewer() -> None:
    """The saving bar guards queries to come against a drift in hardness; the batch its
    measured rows sample has none, so it takes the fixed count wherever that is cheaper."""
    rng = np.random.default_rng(0)
    n = 3 * RECALL_MIN_SAMPLES
    lists = rng.integers(1, 13, (n, 10))
    probe = IndexProbing(version=1, target=0.9)
    probe.learn(1, needs_of(lists, np.full(n, 100), first=4), ahead=False)
    count = fixed_lists(probe.fixed[1], 4)
    for adaptive_lists, takes_fixed in ((count / 0.95, True), (count * 0.95, False)):
        batch, ahead = (IndexProbing(version=1, target=0.9) for _ in range(2))
        batch.learn(1, needs_of(lists, np.full(n, adaptive_lists), first=4), ahead=False)
        ahead.learn(1, needs_of(lists, np.full(n, adaptive_lists), first=4))
        assert (batch.fixed[1] > 0) is takes_fixed, adaptive_lists
        assert ahead.fixed[1] == 0  # for queries to come: not a clear saving, or none
        if takes_fixed:
            assert fixed_lists(batch.fixed[1], 4) == count


def test_a_fixed_count_is_a_multiple_of_first_so_it_grows_with_top_k() -> None:
    rng = np.random.default_rng(1)
    n = 2 * RECALL_MIN_SAMPLES
    b = Bucket()
    for _ in range(n):  # measured at first 5: every result within 10 lists
        needs = needs_of(rng.integers(1, 11, (1, 10)), np.array([40]), first=5)
        assert needs.lists is not None and needs.reach is not None
        b.add(needs.needed[0], needs.lists[0], needs.reach[0], needs.first)
    b.fit(1.0)
    assert fixed_lists(b.fixed, 5) == 10 and fixed_lists(b.fixed, 15) == 30


def test_a_kept_state_keeps_its_rules_and_an_older_one_reads_as_adaptive() -> None:
    rng = np.random.default_rng(2)
    n = 2 * RECALL_MIN_SAMPLES
    state = IndexProbing(version=3, target=0.9)
    state.record(0, np.ones(n), needs_of(rng.integers(1, 9, (n, 10)), np.full(n, 40), 4))
    assert state.fixed[0] > 0
    again = IndexProbing.unpack(state.pack())
    assert again.fixed == state.fixed and again.report() == state.report()
    more = needs_of(rng.integers(1, 30, (5, 10)), np.full(5, 40), 4)
    for s in (state, again):  # it goes on learning from where it was: the same next fit
        s.learn(0, more)
    assert again.fixed == state.fixed and again.scales == state.scales
    # A state kept before fixed counts: no multiples, no lists per result.
    meta, arrays = codec.unpack(state.pack())
    del meta["fixed"]
    for name in ("lists0", "reach0", "firsts0"):
        del arrays[name]
    old = IndexProbing.unpack(codec.pack(meta, arrays))
    assert old.fixed == (0.0, 0.0, 0.0) and old.scales == state.scales
    old.learn(0, more)  # the window holds untold queries: it stays adaptive
    assert old.fixed == (0.0, 0.0, 0.0)


def test_the_merge_keeps_each_results_lists_and_averages_the_reach() -> None:
    def part(d: list[float], lists: list[float], reach: int) -> SearchResult:
        ids = StringBlock.from_list([f"{x}" for x in d], (1, len(d)))
        r = np.full((1, len(REACH_SCALES)), reach, dtype=np.int32)
        return SearchResult(
            np.array([d], np.float32), ids, None, 1, 1, np.zeros((1, len(d))), 0, 0,
            np.array([lists]), r,
        )  # fmt: skip

    hits = merge([part([1.0, 4.0], [1, 7], 10), part([2.0, 3.0], [2, 5], 20)], 3, False)
    assert hits.lists_needed is not None and hits.lists_needed.tolist() == [[1, 2, 5]]
    assert hits.reach is not None and (hits.reach == 15).all()
    assert hits.rows()[0].lists_needed is not None


def test_a_kind_with_a_fixed_count_scans_those_lists_on_every_shard(engine_index: Any) -> None:
    engine, cv, _x, handles, _ = engine_index
    cv.counts.update({0: 1500, 1: 1500})
    q = blobs(150, 16, seed=31)
    asyncio.run(engine.search(cv, q, Query(10, with_metadata=False)))  # learns the kind
    state = engine.monitor.peek("pid", 1)
    assert state is not None
    state.buckets[0].fixed = 2.5  # as a fit finding a fixed count cheaper would leave it
    first = handles[0].requests[-1].probing.first
    count = fixed_lists(2.5, first)
    hits = asyncio.run(engine.search(cv, q[:20], Query(10, with_metadata=False)))
    req = handles[0].requests[-1]
    assert req.probing.mode == "adaptive" and req.probing.fixed == (2.5, 0.0, 0.0)
    assert req.list_nos.shape[1] >= count
    given = asyncio.run(engine.search(cv, q[:20], Query(10, count, with_metadata=False)))
    assert hits.ids.tolist() == given.ids.tolist()
    assert hits.lists_scanned <= given.lists_scanned == 20 * count
