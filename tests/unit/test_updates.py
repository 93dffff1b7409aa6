"""Partial updates ($set/$unset, contents) and deletes by filter, as random sequences of writes
on a shard compared with a plain-Python model of the index (hypothesis), through a reload from
the store; and the update document's rules."""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.engine.filters import parse_filter
from actors.engine.shard import Shard
from actors.engine.updates import apply, parse_update
from actors.errors import InvalidRequest
from actors.types import UpsertBatch
from tests.unit.filter_oracle import matches

KEY = bytes(range(32))
DIM = 4
IDS = [f"k{i}" for i in range(12)]

values = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.booleans())
metas = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"a": values}, optional={"b": values, "o": st.fixed_dictionaries({"c": values})}
    ),
)
filters = st.sampled_from(
    [{"a": 1}, {"a": {"$gt": 0}}, {"b": "x"}, {"o.c": {"$exists": True}}, {"a": {"$in": ["x", 2]}}]
)
set_docs = st.dictionaries(st.sampled_from(["a", "b", "o.c", "n"]), values, max_size=2)
unset_docs = st.lists(st.sampled_from(["b", "o", "zz"]), max_size=2, unique=True)
targets = st.one_of(
    st.tuples(st.lists(st.sampled_from(IDS), max_size=5, unique=True), st.none()),
    st.tuples(st.none(), filters),
    st.tuples(st.lists(st.sampled_from(IDS), max_size=5, unique=True), filters),
)
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("upsert"),
            st.lists(st.sampled_from(IDS), min_size=1, max_size=4, unique=True),
            metas,
        ),
        st.tuples(
            st.just("update"),
            targets,
            st.tuples(set_docs, unset_docs, st.one_of(st.none(), st.text(max_size=3))),
        ),
        st.tuples(st.just("delete"), targets),
    ),
    min_size=1,
    max_size=12,
)


def vector_of(item_id: str, n: int) -> np.ndarray:
    return np.full(DIM, float(int(item_id[1:]) * 10 + n), dtype=np.float32)


def chosen(model: dict[str, dict[str, Any]], target: tuple[Any, Any]) -> list[str]:
    ids, flt = target
    pool = model if ids is None else {i: model[i] for i in ids if i in model}
    return [i for i, item in pool.items() if flt is None or matches(item["metadata"] or {}, flt)]


@settings(max_examples=300, deadline=None)
@given(ops=ops)
def test_writes_match_a_plain_python_model(ops: list[Any]) -> None:
    model: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        shard = Shard(f"file://{tmp}", "idx", "id0", 0)
        for n, op in enumerate(ops):
            if op[0] == "upsert":
                _, ids, meta = op
                x = np.stack([vector_of(i, n) for i in ids])
                blob = None if meta is None else orjson.dumps(meta)
                batch = UpsertBatch(tuple(ids), x, None, (blob,) * len(ids), (f"c{n}",) * len(ids))
                shard.upsert(KEY, batch)
                for i, v in zip(ids, x, strict=True):
                    model[i] = {"metadata": copy.deepcopy(meta), "contents": f"c{n}", "vector": v}
            elif op[0] == "update":
                _, target, (set_doc, unset_doc, contents) = op
                doc = {"$set": set_doc, "$unset": unset_doc}
                try:
                    update = parse_update(doc, contents, contents is not None, 0)
                except InvalidRequest:
                    continue  # conflicting paths or nothing to change: refused before any shard
                want = chosen(model, target)
                try:
                    new = {i: model_apply(model[i]["metadata"], set_doc, unset_doc) for i in want}
                except TypeError:
                    with pytest.raises(InvalidRequest):
                        shard.update(KEY, node(target), target[0], update)
                    continue
                assert shard.update(KEY, node(target), target[0], update) == len(want)
                for i in want:
                    model[i]["metadata"] = new[i]
                    if contents is not None:
                        model[i]["contents"] = contents
            else:
                _, target = op
                want = chosen(model, target)
                assert shard.delete_matching(KEY, node(target), target[0]) == len(want)
                for i in want:
                    del model[i]
        for s in (shard, Shard(f"file://{tmp}", "idx", "id0", 0)):  # and reloaded from the store
            assert sorted(s.list_ids(KEY)) == sorted(model)
            got = s.get(KEY, sorted(model), True, True, True)
            for k, i in enumerate(got.ids):
                meta = got.metadata[k]
                assert (orjson.loads(meta) if meta else None) == model[i]["metadata"], i
                assert got.contents[k] == model[i]["contents"]
                np.testing.assert_array_equal(got.vectors[k], model[i]["vector"])
            for flt in ({"a": 1}, {"o.c": {"$exists": True}}, {"n": {"$exists": True}}):
                want = sum(matches(m["metadata"] or {}, flt) for m in model.values())
                assert s.count_matching(KEY, parse_filter(flt)) == want


def model_apply(meta: Any, set_doc: dict[str, Any], unset: list[str]) -> dict[str, Any]:
    """MongoDB's $set and $unset, written out plainly (TypeError: a path crosses a value)."""
    out = copy.deepcopy(meta) if meta else {}
    for path, value in set_doc.items():
        *parents, last = path.split(".")
        d = out
        for p in parents:
            if p not in d:
                d[p] = {}
            if not isinstance(d[p], dict):
                raise TypeError(path)
            d = d[p]
        d[last] = value
    for path in unset:
        *parents, last = path.split(".")
        d = out
        for p in parents:
            d = d.get(p) if isinstance(d, dict) else None
        if isinstance(d, dict):
            d.pop(last, None)
    return out


def node(target: tuple[Any, Any]) -> Any:
    return None if target[1] is None else parse_filter(target[1])


def test_update_document_rules() -> None:
    for doc, words in (
        ({"$inc": {"a": 1}}, "unknown operator"),
        ({"$set": {"a": 1, "a.b": 2}}, "conflict"),
        ({"$set": {"a": 1}, "$unset": ["a"]}, "conflict"),
        ({"$set": {"": 1}}, "non-empty"),
        ({"$set": {"a..b": 1}}, "not a field path"),
        ({"$set": {"$x": 1}}, "not a field path"),
        ({}, "changes nothing"),
        ([], "must be an object"),
    ):
        with pytest.raises(InvalidRequest, match=words):
            parse_update(doc, None, False, 0)
    u = parse_update({"$set": {"a.b": 1, "c": [1]}, "$unset": {"d": ""}}, None, False, 0)
    assert apply({"a": {"x": 0}, "d": 1, "e": 2}, u, "i") == {
        "a": {"x": 0, "b": 1},
        "c": [1],
        "e": 2,
    }
    assert apply(None, u, "i") == {"a": {"b": 1}, "c": [1]}
    with pytest.raises(InvalidRequest, match="is not an object"):
        apply({"a": 5}, u, "i")
