"""StringBlock and StringColumn against plain object arrays of ``str | None``."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.engine.strings import (
    StringBlock,
    StringColumn,
    concat_columns,
    replace_rows,
    take_along_columns,
)

# Short strings over an alphabet with ASCII, multi-byte UTF-8 and characters JSON escapes.
TEXT = st.text(alphabet=st.sampled_from('ab7-_ é中😀"\\\n\x00\t/'), max_size=6)
ENTRY = st.one_of(st.none(), TEXT)


def objects(values: list[str | None], shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr.reshape(shape)


@st.composite
def blocks(draw: st.DrawFn, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    r = draw(st.integers(0, 5)) if rows is None else rows
    c = draw(st.integers(1, 4)) if cols is None else cols
    return objects(draw(st.lists(ENTRY, min_size=r * c, max_size=r * c)), (r, c))


def block_of(arr: np.ndarray) -> StringBlock:
    return StringBlock.from_list(arr.ravel().tolist(), arr.shape)


@given(blocks())
def test_round_trip_keeps_every_entry(arr: np.ndarray) -> None:
    b = block_of(arr)
    assert b.shape == arr.shape
    assert b.tolist() == arr.tolist()
    assert b.flat() == arr.ravel().tolist()


@given(blocks(), st.data())
def test_rows_and_masks_select_as_numpy_does(arr: np.ndarray, data: st.DataObject) -> None:
    b = block_of(arr)
    rows = np.array(data.draw(st.lists(st.integers(0, max(0, len(arr) - 1)), max_size=6)))
    rows = rows[rows < len(arr)].astype(np.int64)
    assert b.take_rows(rows).tolist() == arr[rows].tolist()
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=arr.size, max_size=arr.size)))
    mask = mask.reshape(arr.shape).astype(bool)
    assert b.select(mask).flat() == arr[mask].tolist()


@given(st.integers(0, 4), st.data())
def test_merge_columns_as_take_along_axis(rows: int, data: st.DataObject) -> None:
    parts = [data.draw(blocks(rows=rows)) for _ in range(data.draw(st.integers(1, 3)))]
    width = sum(p.shape[1] for p in parts)
    k = data.draw(st.integers(1, width))
    col = np.array(
        [data.draw(st.permutations(range(width)))[:k] for _ in range(rows)], dtype=np.int64
    ).reshape(rows, k)
    expected = np.take_along_axis(np.concatenate(parts, axis=1), col, axis=1)
    got = take_along_columns(concat_columns([block_of(p) for p in parts]), col)
    assert got.tolist() == expected.tolist()


@given(st.integers(1, 5), st.integers(1, 3), st.data())
def test_replace_rows(rows: int, k: int, data: st.DataObject) -> None:
    arr = data.draw(blocks(rows=rows, cols=k))
    picked = np.array(sorted(data.draw(st.sets(st.integers(0, rows - 1)))), dtype=np.int64)
    sub = data.draw(blocks(rows=len(picked), cols=k))
    expected = arr.copy()
    expected[picked] = sub
    assert replace_rows(block_of(arr), picked, block_of(sub)).tolist() == expected.tolist()


@given(st.lists(TEXT, max_size=12))
def test_json_array_is_what_orjson_writes(values: list[str]) -> None:
    block = StringBlock.from_list(values)
    assert block.json_array() == orjson.dumps(values)
    assert orjson.loads(block.json_array()) == values


def test_json_array_of_plain_ids_skips_the_strings() -> None:
    values = [f"doc-{i}" for i in range(1000)] + ["é中😀"]
    block = StringBlock.from_list(values, (7, 143))
    assert block.json_array() == orjson.dumps(values)
    with pytest.raises(ValueError, match="None"):
        StringBlock.from_list(["a", None]).json_array()


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["set", "clear"]), st.lists(TEXT, max_size=40))))
def test_column_matches_a_dict(ops: list[tuple[str, list[str]]]) -> None:
    """Writes and clears in any order; every label reads back what a dict holds, also across
    compactions (which a column without slack runs as soon as half its bytes are dead)."""

    class Eager(StringColumn):
        COMPACT_SLACK = 0

    col = Eager()
    model: dict[int, str] = {}
    next_label = 0
    for op, values in ops:
        if op == "set":
            labels = np.arange(next_label, next_label + len(values), dtype=np.int64)
            next_label += len(values)
            col.set(labels, values)
            model.update(zip(labels.tolist(), values))
        else:
            gone = np.array(sorted(model)[: len(values)], dtype=np.int64)
            col.clear(gone)
            for lab in gone.tolist():
                del model[lab]
        col.compact()
        probe = np.arange(-1, next_label + 2, dtype=np.int64)
        probe = probe[probe < len(col.lens)] if len(col.lens) else probe[:1]
        assert col.get(probe).flat() == [model.get(int(p)) for p in probe]
        assert col.live == sum(len(v.encode()) for v in model.values())


@settings(max_examples=60)
@given(st.lists(ENTRY, min_size=1, max_size=30), st.data())
def test_a_few_labels_gather_as_many_do(values: list[str | None], data: st.DataObject) -> None:
    """A single query's ids are read one by one (StringColumn._get_few): the same block, byte
    for byte, as the vectorised gather of many labels, with -1 and cleared labels as None."""
    col = StringColumn()
    col.set(np.arange(len(values)), [v if v is not None else "" for v in values])
    col.clear(np.array([i for i, v in enumerate(values) if v is None], dtype=np.int64))
    shape = data.draw(st.sampled_from([(10,), (1, 10), (2, 5), (0,), (1, 0)]))
    size = int(np.prod(shape))
    picks = data.draw(st.lists(st.integers(-1, len(values) - 1), min_size=size, max_size=size))
    labels = np.array(picks, dtype=np.int64).reshape(shape)
    few = col.get(labels)
    many = col.get(np.tile(labels.ravel(), 8))  # past STRINGS_SMALL_GET: the vectorised gather
    assert few.shape == labels.shape and few.lens.dtype == np.int32
    assert few.flat() == many.flat()[:size] == [values[p] if p >= 0 else None for p in picks]
    assert few.blob.tobytes() == many.blob.tobytes()[: len(few.blob)]
    few.blob[:0] = 0  # writable, as a gather's is


def test_compaction_gives_back_the_bytes_of_cleared_labels() -> None:
    col = StringColumn()
    n = 50_000
    col.set(np.arange(n), [f"item-{i:08d}" for i in range(n)])
    col.clear(np.arange(0, n - 10))
    before = col.used
    col.compact()
    assert col.used == 10 * len("item-00000000") < before
    assert col.get(np.arange(n - 12, n)).flat() == [None, None] + [
        f"item-{i:08d}" for i in range(n - 10, n)
    ]
    col.set(np.array([n]), ["new"])
    assert col.get(np.array([[n, n - 1]])).tolist() == [["new", f"item-{n - 1:08d}"]]
