"""A shard's kept filter evaluations (actors.engine.selection): a repeated filter is evaluated
once, and every write, deletion, update, compaction and training swap in between is seen."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from actors import constants
from actors.control.training import TrainParams, train_template
from actors.engine import compaction
from actors.engine import items as items_module
from actors.engine import search as strategies
from actors.engine.filters import FilterNode, parse_filter
from actors.engine.items import ItemTable
from actors.engine.ivf import serialize
from actors.engine.selection import Selections
from actors.engine.shard import Shard
from actors.engine.updates import parse_update
from actors.types import EXACT_SCAN, Probing, SearchRequest, UpsertBatch
from tests.helpers import clustered, exact_knn

KEY = bytes(range(32))
K = 5


def items(x: np.ndarray, start: int, tag: str = "a") -> UpsertBatch:
    ids = tuple(f"id{start + i}" for i in range(len(x)))
    meta = tuple(orjson.dumps({"tag": tag, "n": start + i}) for i in range(len(x)))
    return UpsertBatch(ids, x, None, meta, tuple(None for _ in ids))


def search(
    shard: Shard, q: np.ndarray, node: FilterNode | None, adaptive: bool
) -> tuple[list, int]:
    if adaptive:
        coarse, lists = shard.partition.assign(q, 4)  # type: ignore[union-attr]
        probing = Probing("adaptive", first=2, slacks=(0.3, 0.5))
        req = SearchRequest(q, K, shard.version, lists, coarse, node, probing=probing)
    else:  # untrained: one list, an exact search
        z = np.zeros((len(q), 1), dtype=np.int64)
        req = SearchRequest(q, K, shard.version, z, np.zeros((len(q), 1), np.float32), node)
    res = shard.search(KEY, req)
    return res.ids.tolist(), res.matched


def uncached(
    shard: Shard, q: np.ndarray, node: FilterNode | None, adaptive: bool
) -> tuple[list, int]:
    kept, shard.selections = shard.selections, Selections(entries=0)
    try:
        return search(shard, q, node, adaptive)
    finally:
        shard.selections = kept


def truth(stored: dict[str, tuple[np.ndarray, str]], q: np.ndarray, tag: str) -> list[list[str]]:
    ids = sorted(i for i, (_, t) in stored.items() if t == tag)
    x = np.stack([stored[i][0] for i in ids])
    return [[ids[j] for j in row] for row in exact_knn(x, q, K)[1]]


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = ItemTable.select

    def spy(self: ItemTable, node: FilterNode | None) -> object:
        calls.append(1)
        return real(self, node)

    monkeypatch.setattr(ItemTable, "select", spy)
    return calls


def test_a_repeated_filter_is_evaluated_once_and_writes_are_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counting(monkeypatch)
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    x = clustered(600, 8, seed=1)
    q = clustered(4, 8, seed=2)
    stored = {f"id{i}": (x[i], "a" if i < 300 else "b") for i in range(600)}
    shard.upsert(KEY, items(x[:300], 0, "a"))
    shard.upsert(KEY, items(x[300:], 300, "b"))
    node = parse_filter({"tag": "b"})

    def check() -> None:
        found, matched = search(shard, q, node, adaptive=False)
        assert found == truth(stored, q, "b")
        assert matched == sum(t == "b" for _, t in stored.values())
        assert shard.count_matching(KEY, node) == matched

    check()
    before = len(calls)
    assert before > 0
    assert search(shard, q, node, adaptive=False)[0] == truth(stored, q, "b")
    assert shard.count_matching(KEY, node) == 300
    assert len(calls) == before  # the kept evaluation answered both

    shard.upsert(KEY, items(x[:50] + 0.001, 0, "b"))  # 50 items now match
    stored.update({f"id{i}": (x[i] + np.float32(0.001), "b") for i in range(50)})
    check()
    shard.delete(KEY, [f"id{i}" for i in range(300, 400)])  # 100 no longer exist
    for i in range(300, 400):
        del stored[f"id{i}"]
    check()
    shard.update(
        KEY,
        parse_filter({"n": {"$lt": 20}}),
        None,
        parse_update({"$set": {"tag": "a"}}, None, False, 1 << 20),
    )
    stored.update({f"id{i}": (stored[f"id{i}"][0], "a") for i in range(20)})
    check()


def test_kept_counts_follow_a_training_swap_and_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compaction.prepare, "__defaults__", (0.25, 100))  # due at 1,000 dead
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    x = clustered(3000, 16, n_clusters=30, seed=3)
    q = clustered(20, 16, n_clusters=30, seed=4)
    shard.upsert(KEY, items(x[:1500], 0, "a"))
    shard.upsert(KEY, items(x[1500:], 1500, "b"))
    node = parse_filter({"tag": "b"})
    for version, lists in ((1, 16), (2, 48)):
        template = train_template(x, "ivfflat", lists, None, None, TrainParams(max_iters=5))
        shard.rebuild(KEY, version, serialize(template))
        got = search(shard, q, node, adaptive=True)
        assert got == uncached(shard, q, node, adaptive=True)
        assert search(shard, q, node, adaptive=True) == got  # from the kept evaluation
    shard.delete(KEY, [f"id{i}" for i in range(1500, 2500)])
    items_before = shard.items
    shard._lay_out_lists()  # what the idle tidy runs: the dead rows compacted away
    assert shard.items is not items_before
    got = search(shard, q, node, adaptive=True)
    assert got == uncached(shard, q, node, adaptive=True)
    assert got[1] == 500


def exact_truth(x: np.ndarray, q: np.ndarray, rows: np.ndarray) -> list[list[str | None]]:
    _, found = exact_knn(x[rows], q, min(K, len(rows)))
    return [[f"id{rows[j]}" for j in r] + [None] * (K - len(r)) for r in found]


def narrow(shard: Shard, q: np.ndarray, node: FilterNode | None) -> tuple[list, int]:
    """Automatic probing with the narrowest rule: one list, no slack."""
    coarse, lists = shard.partition.assign(q, 1)  # type: ignore[union-attr]
    probing = Probing("adaptive", first=1, slacks=(0.0, 0.0))
    res = shard.search(
        KEY, SearchRequest(q, K, shard.version, lists, coarse, node, probing=probing)
    )
    return res.ids.tolist(), res.matched


def trained(tmp_path: Path, seed: int, nq: int) -> tuple[Shard, np.ndarray, np.ndarray]:
    """A shard of 3,000 items in 48 lists, and ``nq`` queries."""
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    x = clustered(3000, 16, n_clusters=30, seed=seed)
    shard.upsert(KEY, items(x, 0))
    template = train_template(x, "ivfflat", 48, None, None, TrainParams(max_iters=5))
    shard.rebuild(KEY, 1, serialize(template))
    return shard, x, clustered(nq, 16, n_clusters=30, seed=seed + 1)


@pytest.mark.parametrize("share", [40, 1000])  # 75 items (few lists hold them), 3 (< top_k)
def test_a_selective_filter_is_scanned_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: int
) -> None:
    shard, x, q = trained(tmp_path, 5, 30)
    rows = np.arange(7, 3000, share)
    node = parse_filter({"n": {"$in": rows.tolist()}})
    want = exact_truth(x, q, rows)
    monkeypatch.setattr(constants, "EXACT_SCAN_WORK", 0)  # probing only
    probed, matched = narrow(shard, q, node)
    assert matched == len(rows)
    if len(rows) > K:
        assert probed != want  # one list without slack misses some
    monkeypatch.undo()
    scans: list[int] = []
    real = strategies.exact_matching

    def spy(*args: Any) -> Any:
        scans.append(1)
        return real(*args)

    monkeypatch.setattr(strategies, "exact_matching", spy)
    assert narrow(shard, q, node) == (want, len(rows))
    kept = shard.selections.of(shard.items, shard.partition, node)
    assert kept._gathered is not None and scans == [1]
    assert narrow(shard, q, node) == (want, len(rows))  # from the kept vectors
    assert scans == [1, 1]
    # the distances are the lists' own: the same item, the same distance as a full scan
    coarse, lists = shard.partition.assign(q, 48)  # type: ignore[union-attr]
    full = shard.search(KEY, SearchRequest(q, K, shard.version, lists, coarse, node))
    probing = Probing("adaptive", first=1, slacks=(0.0, 0.0))
    exact = shard.search(
        KEY, SearchRequest(q, K, shard.version, lists[:, :1], coarse[:, :1], node, probing=probing)
    )
    np.testing.assert_array_equal(exact.distances, full.distances)


@pytest.mark.parametrize("budget", [2.0, 0.5])  # in selections' worth of vectors
def test_gathered_vectors_stay_within_their_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: float
) -> None:
    shard, x, q = trained(tmp_path, 7, 10)
    per_filter = 30 * 16 * 4  # 30 matching vectors of 16 float32
    limit = int(budget * per_filter)
    monkeypatch.setattr(constants, "SELECTION_GATHER_BYTES", limit)
    for r in range(6):
        rows = np.arange(r, 3000, 100)
        node = parse_filter({"n": {"$in": rows.tolist()}})
        want = exact_truth(x, q, rows)
        assert narrow(shard, q, node)[0] == want
        kept = [s._gathered for s in shard.selections._cache.values() if s._gathered]
        assert sum(g[1].nbytes for g in kept) <= limit
        assert shard.selections._gathered_bytes <= limit
        assert len(kept) == min(r + 1, int(budget))
    rows = np.arange(0, 3000, 100)
    first = parse_filter({"n": {"$in": rows.tolist()}})
    assert shard.selections.of(shard.items, shard.partition, first)._gathered is None  # dropped
    assert narrow(shard, q, first)[0] == exact_truth(x, q, rows)


def test_queries_scanned_exactly_teach_probing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their measured needs would fit the selective kind's scale to filters it never probes."""
    shard, _x, q = trained(tmp_path, 9, 10)
    node = parse_filter({"n": {"$in": list(range(0, 3000, 40))}})
    coarse, lists = shard.partition.assign(q, 1)  # type: ignore[union-attr]
    probing = Probing("measure", first=1, slacks=(0.3, 0.5))
    req = SearchRequest(q, K, shard.version, lists, coarse, node, probing=probing)
    measured = shard.search(KEY, req)
    assert np.isnan(measured.needed).all()  # type: ignore[arg-type]
    assert measured.bucket == EXACT_SCAN  # its own kind: no scale to learn
    answered = shard.search(KEY, replace(req, probing=replace(probing, mode="adaptive")))
    assert answered.bucket == EXACT_SCAN
    monkeypatch.setattr(constants, "EXACT_SCAN_WORK", 0)  # probed: its needs count
    measured = shard.search(KEY, req)
    assert not np.isnan(measured.needed).all()  # type: ignore[arg-type]
    assert measured.bucket == 2


@pytest.mark.parametrize(
    "flt",
    [
        {"n": 8},
        {"n": {"$in": list(range(0, 3000, 29))}},
        {"n": {"$in": [5, "5", 5.0, 2999]}},
        {"tag": "b"},
        {"tag": "b", "n": {"$in": list(range(0, 200, 3))}},
    ],
)
def test_a_filter_looked_up_answers_as_one_evaluated_over_every_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flt: dict[str, Any]
) -> None:
    """An equality filter found through the columns' index (its matching labels, not a pass
    over every label) matches, counts and gathers the same items, deleted and replaced ones
    left out."""
    shard, x, q = trained(tmp_path, 11, 20)
    shard.delete(KEY, [f"id{i}" for i in range(0, 3000, 7)])
    shard.upsert(KEY, items(x[:100] + np.float32(0.01), 0, "b"))  # replaced: new labels
    node = parse_filter(flt)
    part = shard.partition
    assert part is not None
    found = [uncached(shard, q, node, adaptive=True) for _ in range(2)]  # the 2nd builds
    looked = Selections(entries=0).of(shard.items, part, node)
    assert looked.labels is not None
    looked_matching = shard.items.matching(node)  # what count and delete by filter use
    monkeypatch.setattr(items_module, "LOOKUP_SHARE", 1 << 62)  # every label evaluated
    scanned = Selections(entries=0).of(shard.items, part, node)
    assert scanned.labels is None
    np.testing.assert_array_equal(looked_matching, shard.items.matching(node))
    assert looked.matched == scanned.matched > 0
    np.testing.assert_array_equal(looked.bits, scanned.bits)  # type: ignore[arg-type]
    np.testing.assert_array_equal(looked.counts(part), scanned.counts(part))
    np.testing.assert_array_equal(looked.gathered(part)[0], scanned.gathered(part)[0])
    assert uncached(shard, q, node, adaptive=True) == found[1] == found[0]
