"""Cursors: a scan in pages of id order returns every item present for the whole scan exactly
once, whatever is written between its pages (hypothesis, on a shard, through compaction and the
rebuilds of the id order); and a cursor opens only for the scan it was sealed for."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import constants
from actors.engine import compaction
from actors.engine.filters import parse_filter
from actors.engine.shard import Shard
from actors.errors import InvalidRequest
from actors.types import UpsertBatch
from serve_app.service.cursors import open_cursor, seal_cursor

KEY = bytes(range(32))
IDS = [f"{c}{n}" for c in "abzé" for n in range(6)]  # é: ordered by code point, past z

writes = st.lists(
    st.one_of(
        st.tuples(
            st.just("upsert"),
            st.lists(st.sampled_from(IDS), min_size=1, max_size=5, unique=True),
            st.integers(0, 2),
        ),
        st.tuples(st.just("delete"), st.lists(st.sampled_from(IDS), max_size=4, unique=True)),
        st.tuples(st.just("compact")),
    ),
    max_size=3,
)


def upsert(shard: Shard, ids: list[str], tag: int) -> None:
    vectors = np.ones((len(ids), 4), dtype=np.float32)
    meta = [orjson.dumps({"tag": tag}) for _ in ids]
    shard.upsert(
        KEY,
        UpsertBatch(
            ids=ids, vectors=vectors, metadata=meta, contents=[None] * len(ids), norms=None
        ),
    )


def apply(shard: Shard, op: tuple[Any, ...], model: dict[str, int]) -> set[str]:
    """Apply ``op`` to the shard and the model; the ids whose presence it broke."""
    if op[0] == "upsert":
        upsert(shard, op[1], op[2])
        changed = {i for i in op[1] if model.get(i) != op[2]}
        model.update(dict.fromkeys(op[1], op[2]))
        return changed
    if op[0] == "delete":
        shard.delete(KEY, op[1])
        for i in op[1]:
            model.pop(i, None)
        return set(op[1])
    with shard._lock.write():  # what Shard.snapshot does when enough rows are dead
        plan = compaction.prepare(shard.items, shard.partition, 0.0, 1)
        if plan is not None:
            shard.items = plan.apply(shard.partition)
    return set()


@settings(max_examples=200, deadline=None)
@given(
    first=st.lists(st.sampled_from(IDS), min_size=1, max_size=len(IDS), unique=True),
    tags=st.lists(st.integers(0, 2), min_size=len(IDS), max_size=len(IDS)),
    limit=st.integers(1, 7),
    tag=st.one_of(st.none(), st.integers(0, 2)),
    between=st.lists(writes, max_size=8),
    tail_min=st.sampled_from([1, 3, 4096]),
)
def test_a_scan_returns_every_item_present_throughout_exactly_once(
    first: list[str],
    tags: list[int],
    limit: int,
    tag: int | None,
    between: list[list[tuple[Any, ...]]],
    tail_min: int,
) -> None:
    node = None if tag is None else parse_filter({"tag": tag})
    model: dict[str, int] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(constants, "ID_ORDER_TAIL_MIN", tail_min),
    ):
        shard = Shard(f"file://{tmp}", "idx", "id0", 0)
        for i, t in zip(first, tags, strict=False):
            apply(shard, ("upsert", [i], t), model)
        wanted = {i for i, t in model.items() if tag is None or t == tag}
        ever = set(wanted)  # every id the filter matched at some point of the scan
        got: list[str] = []
        after = ""
        for n in range(len(IDS) + 1):
            page = shard.match_ids(KEY, node, limit + 1, after=after)
            assert page == sorted(page) and len(page) <= limit + 1
            got += page[:limit]
            if len(page) <= limit:
                break
            after = page[limit - 1]
            for op in between[n] if n < len(between) else []:
                wanted -= apply(shard, op, model)
                ever |= {i for i, t in model.items() if tag is None or t == tag}
        assert len(got) == len(set(got)), "an item came twice"
        assert got == sorted(got)
        assert wanted <= set(got), "an item present for the whole scan was missed"
        assert set(got) <= ever


def test_a_full_page_scan_matches_list_ids_after_many_writes(tmp_path) -> None:
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    rng = np.random.default_rng(3)
    for round_ in range(5):
        ids = [f"item-{i}" for i in rng.choice(20_000, 3_000, replace=False)]
        upsert(shard, ids, round_ % 3)
        shard.delete(KEY, [f"item-{i}" for i in rng.choice(20_000, 500, replace=False)])
        got, after = [], ""
        while True:
            page = shard.match_ids(KEY, None, 1_001, after=after)
            got += page[:1_000]
            if len(page) <= 1_000:
                break
            after = page[999]
        assert got == sorted(shard.list_ids(KEY))


@pytest.mark.parametrize("tail_min", [1, 4096])
def test_items_rewritten_or_added_during_a_scan(tmp_path, tail_min: int) -> None:
    """An item rewritten ahead of the cursor is still returned, once; one added ahead of it is
    returned; one added behind it is not."""
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    with mock.patch.object(constants, "ID_ORDER_TAIL_MIN", tail_min):
        upsert(shard, [f"m{i}" for i in range(10)], 0)
        first = shard.match_ids(KEY, None, 4, after="")
        assert first == ["m0", "m1", "m2", "m3"]
        upsert(shard, ["m7", "m1", "n0", "a0"], 0)
        rest = shard.match_ids(KEY, None, 20, after=first[-1])
    assert rest == ["m4", "m5", "m6", "m7", "m8", "m9", "n0"]


def view(name: str = "idx", index_id: str = "id0", key: bytes = KEY) -> Any:
    return SimpleNamespace(
        key=key, view=SimpleNamespace(meta=SimpleNamespace(name=name, index_id=index_id))
    )


def test_a_cursor_opens_only_for_its_own_scan() -> None:
    cv, flt = view(), {"tag": 1}
    cursor = seal_cursor(cv, "query_metadata", flt, "é-last")
    assert "last" not in cursor and open_cursor(cv, "query_metadata", flt, cursor) == "é-last"
    assert open_cursor(cv, "query_metadata", {"tag": 1}, cursor) == "é-last"
    others = [
        (view(), "query_metadata", {"tag": 2}, cursor),  # another filter
        (view(), "list_ids", flt, cursor),  # another route
        (view(index_id="id1"), "query_metadata", flt, cursor),  # the index recreated
        (view(name="other"), "query_metadata", flt, cursor),
        (view(key=bytes(32)), "query_metadata", flt, cursor),  # another key (rotated)
        (
            view(),
            "query_metadata",
            flt,
            cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1],
        ),
        (view(), "query_metadata", flt, "not a cursor!"),
        (view(), "query_metadata", flt, ""),
    ]
    for cv2, route, f, c in others:
        with pytest.raises(InvalidRequest, match="start the scan again"):
            open_cursor(cv2, route, f, c)
