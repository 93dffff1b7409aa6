"""The item table's id map against a plain dict: any mix of upserts (new and replacing) and
deletes, with hashes forced to collide, across merges of the sorted arrays."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import constants
from actors.engine.items import ItemTable

IDS = st.text(alphabet="abcé😀-", min_size=1, max_size=4)
OPS = st.lists(
    st.tuples(st.sampled_from(["upsert", "delete"]), st.lists(IDS, max_size=12, unique=True)),
    max_size=40,
)


def table_with(hash_fn: Callable[[str], int]) -> ItemTable:
    table = ItemTable()
    table.id_map.hash_fn = hash_fn
    return table


def check(table: ItemTable, model: dict[str, int], probes: list[str]) -> None:
    assert len(table) == len(model)
    expected = [model.get(i, -1) for i in probes]
    assert table.id_map.lookup(probes).tolist() == expected
    assert table.present(probes) == [i for i in probes if i in model]
    assert sorted(table.all_ids()) == sorted(model)


def apply(table: ItemTable, model: dict[str, int], op: str, ids: list[str]) -> None:
    """One upsert or remove on the table and on the model dict, checking what it replaced or
    removed."""
    if op == "upsert":
        labels, replaced = table.insert(ids, [None] * len(ids), [None] * len(ids), None)
        assert sorted(replaced.tolist()) == sorted(model[i] for i in ids if i in model)
        model.update(zip(ids, labels.tolist()))
    else:
        gone = table.remove(ids)
        assert sorted(gone.tolist()) == sorted(model.pop(i) for i in ids if i in model)


@settings(max_examples=150, deadline=None)
@given(OPS, st.sampled_from([hash, lambda s: hash(s) % 3, lambda s: 7]))
def test_matches_a_dict(ops: list[tuple[str, list[str]]], hash_fn: Callable[[str], int]) -> None:
    """Every id keeps its latest label: also when many ids share a hash (down to one hash for
    all), when removed ids free their slot for others, and across merges of small writes."""
    with (
        mock.patch.object(constants, "IDMAP_MERGE_MIN", 3),
        mock.patch.object(constants, "IDMAP_BULK", 5),
    ):
        table = table_with(hash_fn)
        model: dict[str, int] = {}
        seen: list[str] = []
        for op, ids in ops:
            apply(table, model, op, ids)
            seen += ids
            check(table, model, [*seen, "absent", "é"])


def test_a_colliding_hash_never_returns_another_item() -> None:
    table = table_with(lambda s: 42)
    table.insert(["a", "b"], [None, None], [None, None], None)
    assert table.id_map.lookup(["a", "b", "c"]).tolist() == [0, 1, -1]
    assert "b" in table.id_map.overflow  # "a" holds the hash's slot
    table.remove(["a"])
    table.insert(["c"], [None], [None], None)  # takes the slot "a" left free
    assert table.id_map.lookup(["a", "b", "c"]).tolist() == [-1, 1, 2]


def test_a_snapshot_sized_write_builds_the_sorted_arrays() -> None:
    n = 50_000
    ids = [f"item-{i}" for i in range(n)]
    table = ItemTable()
    table.insert(ids, [None] * n, [None] * n, None, labels=np.arange(n, dtype=np.int64))
    m = table.id_map
    assert len(m.keys) == n and not m.recent and not m.overflow
    assert m.nbytes() == 16 * n
    assert (np.diff(m.keys) >= 0).all()
    assert m.lookup(ids[::997]).tolist() == list(range(0, n, 997))


def test_a_delete_may_name_an_id_twice() -> None:
    table = ItemTable()
    table.insert(["a", "b"], [None, None], [None, None], None)
    assert table.remove(["a", "a", "zz"]).tolist() == [0]
    assert len(table) == 1 and table.all_ids() == ["b"]


def test_ids_must_be_distinct_within_one_write() -> None:
    table = ItemTable()
    table.insert(["x"], [None], [None], None)
    with pytest.raises(ValueError, match="distinct"):
        table.insert(["y", "x", "y"], [None] * 3, [None] * 3, None)
    assert len(table) == 1 and table.id_map.lookup(["x", "y"]).tolist() == [0, -1]


@settings(max_examples=100, deadline=None)
@given(OPS, st.sampled_from([hash, lambda s: hash(s) % 3, lambda s: 7]), st.integers(0, 40))
def test_a_relabelled_table_finds_every_id_under_its_new_label(
    ops: list[tuple[str, list[str]]], hash_fn: Callable[[str], int], at: int
) -> None:
    """ItemTable.relabelled (compaction) moves every id to its new label, with colliding
    hashes (overflow) and pending small writes (recent) too, and the copy goes on taking
    writes as the table did."""
    with (
        mock.patch.object(constants, "IDMAP_MERGE_MIN", 3),
        mock.patch.object(constants, "IDMAP_BULK", 5),
    ):
        table = table_with(hash_fn)
        model: dict[str, int] = {}
        seen: list[str] = []
        for step, (op, ids) in enumerate(ops):
            if step == at:
                table, new_of = table.relabelled()
                model = {i: int(new_of[label]) for i, label in model.items()}
                assert sorted(model.values()) == list(range(len(model)))
                check(table, model, [*seen, "absent"])
            apply(table, model, op, ids)
            seen += ids
            check(table, model, [*seen, "absent", "é"])


def test_a_stream_of_writes_merges_the_arrays_a_bounded_number_of_times() -> None:
    """Writes arriving in pieces of more than IDMAP_BULK ids (an upsert split for the WAL)
    gather like small ones: merging the sorted arrays at every write re-sorted every id per
    write, which made ingesting millions of items quadratic."""
    table = ItemTable()
    none = [None] * 1500
    table.insert([f"a{i}" for i in range(100_000)], [None] * 100_000, [None] * 100_000, None)
    with mock.patch.object(
        type(table.id_map), "_merge", autospec=True, side_effect=type(table.id_map)._merge
    ) as merge:
        for w in range(100):
            table.insert([f"b{w}-{i}" for i in range(1500)], none, none, None)
    assert merge.call_count <= 10, merge.call_count  # 1 per write before
    labels = table.find([f"b{w}-{i}" for w in (0, 50, 99) for i in (0, 1499)])[1]
    assert (labels >= 0).all() and len(set(labels.tolist())) == 6
    assert len(table) == 250_000
