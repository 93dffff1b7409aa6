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


def test_filter_columns_are_built_on_first_use_and_then_kept_up_to_date() -> None:
    """A loaded table parses no metadata until a filter needs the columns (a partition only
    searched without filters never builds them); from then on every write keeps them current,
    and they answer as an oracle over the live items' metadata does."""
    from actors.engine import items as items_module
    from tests.unit.filter_oracle import matches

    rng = np.random.default_rng(5)
    docs = {f"i{k}": {"k": int(k), "tag": ["a", "b", "c"][k % 3]} for k in range(3000)}
    table = ItemTable()
    ids = list(docs)
    table.insert(ids, [orjson.dumps(docs[i]) for i in ids], [None] * len(ids), None)
    table.remove([f"i{k}" for k in rng.choice(3000, 300, replace=False)])
    for k in rng.choice(3000, 200, replace=False):  # replaced: their old rows must not match
        docs[f"i{k}"] = {"k": -int(k), "tag": "z"}
        table.insert([f"i{k}"], [orjson.dumps(docs[f"i{k}"])], [None], None)
    loaded = ItemTable.from_arrays(table.to_arrays(), table.next_label)
    assert loaded._columns is None and loaded.nbytes() < table.nbytes()  # nothing parsed yet
    live = set(loaded.ids_of(np.flatnonzero(loaded.alive[: loaded.next_label])))

    def check(flt: dict) -> None:
        want = sorted(i for i in live if matches(docs[i], flt))
        assert sorted(loaded.ids_of(loaded.matching(parse_filter(flt)))) == want, flt

    items_module.COLUMN_BUILD_ROWS = 1000  # built in several pieces
    try:
        check({"tag": "a", "k": {"$gte": 1500}})
    finally:
        items_module.COLUMN_BUILD_ROWS = 65_536
    assert loaded._columns is not None
    # Writes after the build: new items, replacements, deletions.
    for k in range(3000, 3100):
        docs[f"i{k}"] = {"k": k, "tag": "a"}
    new = [f"i{k}" for k in range(3000, 3100)]
    loaded.insert(new, [orjson.dumps(docs[i]) for i in new], [None] * 100, None)
    docs["i1"] = {"k": 99999, "tag": "a"}
    loaded.insert(["i1"], [orjson.dumps(docs["i1"])], [None], None)
    loaded.remove(["i3000"])
    live = (live | set(new) | {"i1"}) - {"i3000"}
    for flt in ({"tag": "a", "k": {"$gte": 1500}}, {"tag": {"$in": ["z", "b"]}}, {"k": {"$lt": 0}}):
        check(flt)
    copy, _ = loaded.relabelled()
    assert copy._columns is not None
    assert sorted(copy.ids_of(copy.matching(parse_filter({"tag": "z"})))) == sorted(
        i for i in live if docs[i]["tag"] == "z"
    )
