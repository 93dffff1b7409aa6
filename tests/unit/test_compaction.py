"""Compaction (actors.engine.compaction) changes no answer and frees the dead rows.

After any mix of upserts (new ids and replacements), deletes, compactions and a snapshot
round-trip, an item table and its partition answer every search, get and filter exactly as a
never-compacted pair does, as brute force does and as the filter oracle does; a compacted
table's arrays are as long as it has live items. Through the shard: the idle tidy compacts, a
snapshot taken after it (or before it) reloads to the same answers with the WAL written after
it replayed on top, and no compaction swaps in while a rebuild is in flight or after a write
came between its copy and its swap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import constants
from actors.control.training import TrainParams, train_template
from actors.engine import compaction, idmap
from actors.engine.filters import parse_filter
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex, serialize
from actors.engine.shard import Shard
from actors.storage import codec
from actors.types import UpsertBatch
from tests.helpers import exact_knn
from tests.unit.filter_oracle import matches
from tests.unit.test_filters import DOC, FILTER

DIM = 4
POOL = [f"id{i}" for i in range(24)]
KEY = bytes(range(32))


def _template(index_type: str) -> np.ndarray | None:
    if index_type == "untrained":
        return None
    x = np.random.default_rng(5).normal(size=(400, DIM)).astype(np.float32)
    return serialize(train_template(x, index_type, 4, None, None, TrainParams(max_iters=5)))


TEMPLATES = {kind: _template(kind) for kind in ("untrained", "ivfflat", "ivf")}


# -- the model: what every answer must be ---------------------------------------------------
@dataclass
class Item:
    vector: np.ndarray
    metadata: bytes | None
    content: str | None
    norm: float


@dataclass
class Pair:
    """An item table and its partition, written as a shard writes them (Shard._apply)."""

    items: ItemTable
    part: PartitionIndex
    model: dict[str, Item] = field(default_factory=dict)

    @classmethod
    def new(cls, template: np.ndarray | None) -> Pair:
        return cls(ItemTable(), PartitionIndex.from_template(template, DIM))

    def upsert(self, ids: list[str], docs: list[Any], seed: int) -> None:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(len(ids), DIM)).astype(np.float32)
        norms = rng.uniform(0.5, 2, size=len(ids)).astype(np.float32)
        meta = [None if d is None else orjson.dumps(d) for d in docs[: len(ids)]]
        contents = [None if i % 3 == 0 else f"{item} {seed}" for i, item in enumerate(ids)]
        labels, replaced = self.items.insert(ids, meta, contents, norms)
        self.part.remove(replaced)
        self.part.add(labels, x)
        for i, item in enumerate(ids):
            self.model[item] = Item(x[i], meta[i], contents[i], float(norms[i]))

    def delete(self, ids: list[str]) -> None:
        self.part.remove(self.items.remove(ids))
        for item in ids:
            self.model.pop(item, None)

    def compact(self) -> None:
        self.items = compaction.compact(self.items, self.part)

    def restored(self) -> Pair:
        """The pair a snapshot of this one reloads as (Shard._capture and Shard._restore)."""
        _, arrays = codec.unpack(codec.pack({}, self.items.to_arrays()))
        items = ItemTable.from_arrays(arrays, self.items.next_label)
        part = PartitionIndex.from_template(serialize(self.part.index), DIM)
        part.radii = self.part.radii.copy()
        return Pair(items, part, self.model)


def search(pair: Pair, q: np.ndarray, flt: dict[str, Any] | None) -> tuple[list[Any], np.ndarray]:
    """Every list probed: (ids, distances) of the top 5 under the filter."""
    bits, _ = pair.items.selection(None if flt is None else parse_filter(flt))
    coarse, lists = pair.part.assign(q, pair.part.nlist)
    dist, labels = pair.part.search(q, 5, lists, coarse, bits)
    return pair.items.gather_ids(labels).tolist(), dist


def filtered(pair: Pair, flt: dict[str, Any]) -> list[str]:
    return [i for i, it in pair.model.items() if matches(loads(it.metadata), flt)]


def loads(blob: bytes | None) -> Any:
    return None if blob is None else orjson.loads(blob)


# -- checks -------------------------------------------------------------------------------------
def check_gets(pair: Pair, exact: bool) -> None:
    """Ids, metadata, contents, norms and (``exact``: lists that hold the vectors themselves)
    vectors of every id, present or not."""
    found, labels = pair.items.find([*POOL, "absent"])
    assert found == [i for i in POOL if i in pair.model]
    want = [pair.model[i] for i in found]
    assert pair.items.metadata[labels].tolist() == [it.metadata for it in want]
    assert pair.items.contents[labels].tolist() == [it.content for it in want]
    assert pair.items.norms[labels].tolist() == [np.float32(it.norm) for it in want]
    if exact:
        vectors = pair.part.reconstruct(labels)
        np.testing.assert_array_equal(
            vectors, np.array([it.vector for it in want]).reshape(-1, DIM)
        )
    assert sorted(pair.items.all_ids()) == sorted(pair.model)


def check_filters(pair: Pair, filters: list[dict[str, Any]]) -> None:
    for flt in filters:
        node = parse_filter(flt)
        want = filtered(pair, flt)
        assert sorted(pair.items.ids_of(pair.items.matching(node))) == sorted(want), flt
        assert pair.items.selection(node)[1] == len(want)


def check_brute_force(pair: Pair, q: np.ndarray, flt: dict[str, Any] | None) -> None:
    """Exact lists (ivfflat, untrained): the distances are brute force's."""
    ids, dist = search(pair, q, flt)
    pool = list(pair.model) if flt is None else filtered(pair, flt)
    if not pool:
        assert all(i is None for row in ids for i in row)
        return
    x = np.array([pair.model[i].vector for i in pool])
    want_d, want_rows = exact_knn(x, q, 5, metric="squared_euclidean")
    for row, (got, want, rows) in enumerate(zip(ids, want_d, want_rows)):
        found = [i for i in got if i is not None]
        assert len(found) == len(rows) and set(found) <= set(pool)
        np.testing.assert_allclose(dist[row, : len(found)], want, rtol=1e-4, atol=1e-5)


def check_same(a: Pair, b: Pair, q: np.ndarray, filters: list[dict[str, Any]]) -> None:
    """``a`` answers every search exactly as ``b``: ids and distances, bit for bit."""
    for flt in [None, *filters]:
        ids_a, dist_a = search(a, q, flt)
        ids_b, dist_b = search(b, q, flt)
        assert ids_a == ids_b, flt
        np.testing.assert_array_equal(dist_a, dist_b)


def check_dense(pair: Pair) -> None:
    """Right after a compaction every per-label array is as long as the live items."""
    n = len(pair.model)
    items = pair.items
    assert items.next_label == len(items) == n
    lengths = {len(a) for a in (items.metadata, items.contents, items.norms, items.alive)}
    assert lengths == {n} and len(items.ids.lens) == n and len(pair.part.list_of) == n
    assert items.ids.used == int(np.maximum(items.ids.lens, 0).sum())
    assert len(items.id_map.keys) + len(items.id_map.recent) + len(items.id_map.overflow) == n
    assert pair.part.ntotal == n


# -- the property -------------------------------------------------------------------------------
OP = st.tuples(
    st.sampled_from(["upsert", "upsert", "upsert", "delete", "compact"]),
    st.lists(st.sampled_from(POOL), unique=True, max_size=10),
    st.lists(DOC, min_size=10, max_size=10),
    st.integers(0, 2**16),
)
HASHES = [hash, lambda s: hash(s) % 3]


@pytest.mark.parametrize("kind", list(TEMPLATES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(OP, min_size=1, max_size=20),
    snapshot_at=st.integers(0, 20),
    filters=st.lists(FILTER, min_size=1, max_size=3),
    hash_fn=st.sampled_from(HASHES),
    seed=st.integers(0, 2**16),
)
def test_compacted_answers_as_never_compacted(
    kind: str,
    ops: list[tuple[str, list[str], list[Any], int]],
    snapshot_at: int,
    filters: list[dict[str, Any]],
    hash_fn: Callable[[str], int],
    seed: int,
) -> None:
    """One pair compacts whenever the ops say so and is reloaded from a snapshot of itself
    once along the way; the other never compacts. Every answer agrees, with each other and
    with brute force and the filter oracle."""
    template = TEMPLATES[kind]
    q = np.random.default_rng(seed).normal(size=(3, DIM)).astype(np.float32)
    with (
        mock.patch.object(idmap.IdMap, "hash_fn", staticmethod(hash_fn)),
        mock.patch.object(constants, "IDMAP_MERGE_MIN", 3),
        mock.patch.object(constants, "IDMAP_BULK", 5),
    ):
        compacted, plain = Pair.new(template), Pair.new(template)
        for step, (op, ids, docs, op_seed) in enumerate(ops):
            if step == snapshot_at:
                compacted = compacted.restored()
            if op == "upsert":
                compacted.upsert(ids, docs, op_seed)
                plain.upsert(ids, docs, op_seed)
            elif op == "delete":
                compacted.delete(ids)
                plain.delete(ids)
            else:
                compacted.compact()
                check_dense(compacted)
                check_same(compacted, plain, q, filters)
        for pair in (compacted, compacted.restored()):
            check_gets(pair, exact=kind != "ivf")
            check_filters(pair, filters)
            check_same(pair, plain, q, filters)
            if kind != "ivf":
                for flt in [None, *filters]:
                    check_brute_force(pair, q, flt)


# -- thresholds and memory ----------------------------------------------------------------------
def rows(n_live: int, n_dead: int) -> ItemTable:
    table = ItemTable()
    ids = [f"i{k}" for k in range(n_live + n_dead)]
    table.insert(ids, [None] * len(ids), [None] * len(ids), None)
    table.remove(ids[:n_dead])
    return table


def test_due_needs_both_the_share_and_the_count() -> None:
    share, least = constants.COMPACT_DEAD_SHARE, constants.COMPACT_DEAD_MIN
    big = int(least / share)
    assert compaction.due(rows(big - least, least))  # exactly at both thresholds
    assert not compaction.due(rows(big - least + 1, least - 1))  # one dead row short
    assert not compaction.due(rows(10 * least, least))  # enough rows, too small a share
    assert compaction.due(rows(2, 2), share=0.5, minimum=2)
    assert not compaction.due(rows(4, 0), share=0.0, minimum=0)  # nothing to drop
    assert compaction.prepare(rows(10, 5), None) is None


def footprint(pair: Pair) -> dict[str, int]:
    items, cols = pair.items, pair.items.columns
    return {
        "rows": len(items.metadata) + len(items.contents) + len(items.norms) + len(items.alive),
        "ids": len(items.ids.lens) + items.ids.used,
        "id_map": len(items.id_map.keys) + len(items.id_map.recent),
        "list_of": len(pair.part.list_of),
        "column_entries": sum(len(a) for c in cols._cols.values() for a in c.arrays().values()),
        "vocab": sum(len(c.vocab) for c in cols._cols.values()),
        "nbytes": items.nbytes(),
    }


def replace_all(pair: Pair, n: int, round_no: int) -> None:
    ids = [f"item-{k}" for k in range(n)]
    docs = [
        {"round": round_no, "tag": f"r{round_no}-{k % 3}", "pair": [k, round_no]} for k in range(n)
    ]
    pair.upsert(ids, docs, round_no)


def test_arrays_follow_the_live_items_over_many_replacement_rounds() -> None:
    n = 300
    kept, never = Pair.new(TEMPLATES["ivfflat"]), Pair.new(TEMPLATES["ivfflat"])
    sizes = []
    for round_no in range(20):
        replace_all(kept, n, round_no)
        replace_all(never, n, round_no)
        plan = compaction.prepare(kept.items, kept.part, minimum=0)
        assert (plan is None) == (round_no == 0)  # the first round leaves no dead row
        if plan is not None:
            kept.items = plan.apply(kept.part)
            check_dense(kept)
        sizes.append(footprint(kept))
    assert all(size == sizes[1] for size in sizes[2:])
    fresh = Pair.new(TEMPLATES["ivfflat"])  # a table that only ever held the last round
    replace_all(fresh, n, 19)
    for name in ("column_entries", "vocab"):
        assert sizes[-1][name] == footprint(fresh)[name], name
    assert footprint(never)["nbytes"] > 5 * sizes[-1]["nbytes"]  # what compaction saves
    q = np.random.default_rng(1).normal(size=(4, DIM)).astype(np.float32)
    check_same(kept, never, q, [{"tag": "r19-1"}, {"pair": {"$gte": 100}}])


def test_a_partition_holding_an_unmapped_label_is_left_alone() -> None:
    pair = Pair.new(TEMPLATES["ivfflat"])
    pair.upsert(POOL[:6], [None] * 6, 1)
    pair.upsert(POOL[:2], [None] * 2, 2)  # labels 6 and 7 replace 0 and 1
    before = [pair.part.all_labels().copy(), pair.part.list_of.copy()]
    new_of = np.array([-1, -1, 0, 1, 2, 3, 4, -1], dtype=np.int64)  # label 7 has none
    with pytest.raises(ValueError):
        pair.part.relabel(new_of)
    np.testing.assert_array_equal(pair.part.all_labels(), before[0])
    np.testing.assert_array_equal(pair.part.list_of, before[1])


# -- through the shard ---------------------------------------------------------------------------
N_SHARD = 5000  # two writes of every item leave COMPACT_DEAD_MIN dead rows and more


@pytest.fixture
def no_idle_tidy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test calls the tidy's compaction itself (Shard._lay_out_lists)."""
    monkeypatch.setattr(constants, "TRIM_AFTER_WRITES_S", 3600.0)


def shard_batch(ids: list[str], round_no: int) -> UpsertBatch:
    rng = np.random.default_rng([round_no, int(ids[0][1:])])
    x = rng.normal(size=(len(ids), 8)).astype(np.float32)
    meta = tuple(orjson.dumps({"group": hash(i) % 7, "round": round_no}) for i in ids)
    contents = tuple(f"{i} in round {round_no}" for i in ids)
    return UpsertBatch(tuple(ids), x, None, meta, contents)


def write(shard: Shard, model: dict[str, Any], ids: list[str], round_no: int) -> None:
    for start in range(0, len(ids), 1000):
        batch = shard_batch(ids[start : start + 1000], round_no)
        shard.upsert(KEY, batch)
        for i, item in enumerate(batch.ids):
            model[item] = (batch.vectors[i], batch.metadata[i], batch.contents[i])


def observe(shard: Shard) -> dict[str, Any]:
    """Every answer the shard gives: exact searches (every list), gets and filters."""
    shard.stats(KEY)  # loads it
    q = np.random.default_rng(9).normal(size=(6, 8)).astype(np.float32)
    out: dict[str, Any] = {}
    for flt in (None, {"group": 3}, {"round": {"$gte": 1}}):
        node = None if flt is None else parse_filter(flt)
        bits, n_match = shard.items.selection(node)
        part = shard.partition
        assert part is not None
        coarse, lists = part.assign(q, part.nlist)
        dist, labels = part.search(q, 10, lists, coarse, bits)
        out[f"search {flt}"] = (shard.items.gather_ids(labels).tolist(), dist.tolist(), n_match)
        out[f"match {flt}"] = shard.match_ids(KEY, node, None)
    probe = [f"s{i}" for i in range(0, 5200, 7)]
    got = shard.get(KEY, probe, True, True, True)
    assert got.vectors is not None
    out["get"] = (got.ids, got.vectors.tolist(), got.metadata, got.contents)
    return out


def expected(model: dict[str, Any]) -> dict[str, Any]:
    """What :func:`observe` must see, from the model (brute force, the filter oracle)."""
    q = np.random.default_rng(9).normal(size=(6, 8)).astype(np.float32)
    out: dict[str, Any] = {}
    for flt in (None, {"group": 3}, {"round": {"$gte": 1}}):
        pool = [i for i, (_, m, _) in model.items() if matches(orjson.loads(m), flt)]
        _, rows = exact_knn(np.array([model[i][0] for i in pool]), q, 10)
        out[f"search {flt}"] = [[pool[r] for r in row] for row in rows.tolist()]
        out[f"match {flt}"] = sorted(pool)
    return out


def check_model(seen: dict[str, Any], model: dict[str, Any]) -> None:
    want = expected(model)
    for name, value in want.items():
        if name.startswith("search"):
            assert seen[name][0] == value, name
            assert seen[name][2] == len(want[name.replace("search", "match")])
        else:
            assert sorted(seen[name]) == value, name
    ids, vectors, metadata, contents = seen["get"]
    assert ids == sorted((i for i in model if int(i[1:]) % 7 == 0), key=lambda i: int(i[1:]))
    assert vectors == [model[i][0].tolist() for i in ids]
    assert metadata == [model[i][1] for i in ids] and contents == [model[i][2] for i in ids]


@pytest.mark.usefixtures("no_idle_tidy")
@pytest.mark.parametrize("snapshot_after", [True, False])
def test_a_compacted_shard_reloads_with_its_wal_on_top(
    tmp_path: Path, snapshot_after: bool
) -> None:
    """The snapshot is taken after the compaction (it holds the dense labels) or before the
    items were replaced (the compaction only ever happened in memory); either way the WAL written afterwards
    replays on top of it to the same answers."""
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0, wal_max_records=1000)
    model: dict[str, Any] = {}
    ids = [f"s{i}" for i in range(N_SHARD)]
    write(shard, model, ids, 0)
    x = shard.sample(KEY, 2000)
    template = train_template(x, "ivfflat", 16, None, None, TrainParams(max_iters=5))
    shard.rebuild(KEY, 1, serialize(template))
    if not snapshot_after:  # (a snapshot when compaction is due compacts first)
        shard.snapshot(KEY)
    write(shard, model, ids, 1)  # every item replaced: N_SHARD dead rows
    shard.delete(KEY, ids[:100])
    for i in ids[:100]:
        del model[i]
    assert compaction.due(shard.items)
    shard._lay_out_lists()
    assert shard.items.next_label == len(shard.items) == len(model)
    if snapshot_after:
        shard.snapshot(KEY)
    write(shard, model, [f"s{i}" for i in range(4900, 5200)], 2)  # the WAL on top
    shard.delete(KEY, ids[200:300])
    for i in ids[200:300]:
        del model[i]
    seen = observe(shard)
    check_model(seen, model)
    reloaded = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    assert observe(reloaded) == seen


@pytest.mark.usefixtures("no_idle_tidy")
def test_no_swap_during_a_rebuild_or_after_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    ids = [f"s{i}" for i in range(N_SHARD)]
    write(shard, {}, ids, 0)
    write(shard, {}, ids, 1)
    table = shard.items
    shard._pending = []  # a training rebuild is in flight
    shard._lay_out_lists()
    assert shard.items is table
    shard._pending = None

    prepare = compaction.prepare

    def a_write_comes_meanwhile(*args: Any, **kw: Any) -> compaction.Compaction | None:
        plan = prepare(*args, **kw)
        shard.seq += 1  # as a write between the copy and the swap does
        return plan

    monkeypatch.setattr(compaction, "prepare", a_write_comes_meanwhile)
    shard._lay_out_lists()
    assert shard.items is table and table.next_label == 2 * N_SHARD
    monkeypatch.setattr(compaction, "prepare", prepare)
    shard._lay_out_lists()
    assert shard.items is not table and shard.items.next_label == N_SHARD


@pytest.mark.usefixtures("no_idle_tidy")
def test_writes_that_never_pause_are_compacted_when_the_wal_rolls(tmp_path: Path) -> None:
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0, wal_max_records=2)
    model: dict[str, Any] = {}
    ids = [f"s{i}" for i in range(N_SHARD)]
    for round_no in range(4):  # every item replaced three times, no pause for the idle tidy
        write(shard, model, ids, round_no)
    assert shard.items.next_label < 2.5 * len(model)  # 4x without compaction
    seen = observe(shard)
    check_model(seen, model)
    assert observe(Shard(f"file://{tmp_path}", "idx", "id0", 0)) == seen
