"""ItemTable: snapshots and relabelled copies (compaction) keep every per-label array in step."""

from __future__ import annotations

import numpy as np
import orjson

from actors.engine.filters import parse_filter
from actors.engine.items import ItemTable


def filled(n: int) -> ItemTable:
    table = ItemTable()
    ids = [f"i{k}" for k in range(n)]
    meta = [orjson.dumps({"k": k}) for k in range(n)]
    table.insert(ids, meta, [f"c{k}" for k in range(n)], np.arange(n, dtype=np.float32))
    return table


def test_a_snapshot_whose_last_labels_are_dead_reloads_with_room_for_them() -> None:
    """Labels up to next_label were handed out: a reloaded table's arrays cover them all,
    even when the items that held the last ones are gone (a filter over the table used to
    fail on the short liveness array)."""
    table = filled(5000)
    table.remove([f"i{k}" for k in range(2000, 5000)])
    reloaded = ItemTable.from_arrays(table.to_arrays(), table.next_label)
    assert reloaded.next_label == 5000 and len(reloaded.alive) >= 5000
    node = parse_filter({"k": {"$gte": 1990}})
    assert reloaded.ids_of(reloaded.matching(node)) == [f"i{k}" for k in range(1990, 2000)]
    assert reloaded.selection(node)[1] == 10
    labels, _ = reloaded.insert(["new"], [None], [None], None)
    assert labels.tolist() == [5000]


def test_relabelled_leaves_the_source_as_it_was_and_the_copy_takes_writes() -> None:
    table = filled(10)
    table.remove(["i1", "i4"])
    table.insert(["i2"], [b'{"k": 20}'], ["again"], np.ones(1, dtype=np.float32))
    copy, new_of = table.relabelled()
    assert new_of.tolist() == [0, -1, -1, 1, -1, 2, 3, 4, 5, 6, 7]
    # the source still answers under its old labels
    assert table.find(["i2", "i3", "i9"])[1].tolist() == [10, 3, 9]
    assert table.next_label == 11 and len(table) == 8
    # the copy: the same items under dense labels, in the same order
    assert copy.find(["i2", "i3", "i9"])[1].tolist() == [7, 1, 6]
    assert copy.all_ids() == ["i0", "i3", "i5", "i6", "i7", "i8", "i9", "i2"]
    assert copy.contents.tolist()[-1] == "again" and copy.norms.tolist()[:2] == [0.0, 3.0]
    labels, replaced = copy.insert(["i3", "x"], [None, None], [None, None], None)
    assert labels.tolist() == [8, 9] and replaced.tolist() == [1]
    assert copy.ids_of(copy.matching(parse_filter({"k": {"$lt": 6}}))) == ["i0", "i5"]
    assert table.ids_of(table.matching(parse_filter({"k": {"$lt": 6}}))) == ["i0", "i3", "i5"]
