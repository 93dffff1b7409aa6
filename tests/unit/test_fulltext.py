"""BM25 full-text search: the analyser, the engine's scores against rank-bm25 (the reference
implementation, with Lucene's idf, on the same analyser) through writes, deletes and compaction,
sharded scores equal to unsharded ones, and the rank fusion of a hybrid query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.engine.filters import parse_filter
from actors.engine.fulltext import analyse, field_text, query_terms, score
from actors.engine.items import ItemTable
from actors.engine.shard import Shard
from actors.types import TextQuery, TextStats, UpsertBatch
from serve_app.gateway.fulltext import fuse, merge
from tests.unit.bm25_oracle import oracle

K1, B = 1.2, 0.75
WORDS = ["whale", "whales", "ocean", "bread", "baking", "baked", "the", "sea", "river", "bake"]


def engine_scores(table: ItemTable, fields: list[str], weights: list[float], text: str, **kw: Any):
    indexes = [table.text_field(f) for f in fields]
    terms = query_terms(text)
    stats = kw.pop("stats", None) or [ix.stats(terms) for ix in indexes]
    labels, scores = score(
        indexes, weights, terms, stats, K1, B, kw.get("require_all", False), kw.get("allowed")
    )
    return dict(zip(table.ids_of(labels), scores.tolist(), strict=True))


def table_of(docs: dict[str, dict[str, Any]]) -> ItemTable:
    table = ItemTable()
    table.insert(list(docs), [orjson.dumps(m) for m in docs.values()], [None] * len(docs), None)
    return table


def assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for i, s in want.items():
        assert got[i] == pytest.approx(s, rel=1e-9, abs=1e-12)


def test_analyser_folds_case_drops_stop_words_and_stems() -> None:
    assert analyse("The Whales, baking BREAD in the ocean!") == ["whale", "bake", "bread", "ocean"]
    assert query_terms("whale whales WHALE") == ("whale",)
    assert analyse("") == [] and analyse("the and of") == []
    assert analyse("Ünïcode naïve café") == ["ünïcode", "naïv", "café"]


def test_field_text_reads_strings_lists_and_dot_paths() -> None:
    meta = {"body": "a b", "tags": ["x", 1, "y"], "doc": {"title": "t"}, "n": 3}
    assert field_text(meta, "body") == "a b"
    assert field_text(meta, "tags") == "x y"
    assert field_text(meta, "doc.title") == "t"
    assert field_text(meta, "n") is None and field_text(meta, "missing") is None


texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join)
docs_strategy = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.fixed_dictionaries({"body": texts, "title": texts, "n": st.integers(0, 3)}),
    min_size=1,
    max_size=25,
)
queries = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, text=queries, w=st.floats(0.1, 3), require_all=st.booleans())
def test_scores_equal_the_reference_bm25(
    docs: dict[str, dict[str, Any]], text: str, w: float, require_all: bool
) -> None:
    table = table_of(docs)
    fields, weights = ["body", "title"], [1.0, w]
    got = engine_scores(table, fields, weights, text, require_all=require_all)
    assert_same(got, oracle(docs, fields, weights, text, require_all))


@settings(max_examples=100, deadline=None)
@given(
    docs=docs_strategy,
    later=docs_strategy,
    gone=st.sets(st.text("abcdefgh", min_size=1, max_size=3)),
    text=queries,
    compact=st.booleans(),
)
def test_scores_follow_replacements_deletes_and_compaction(
    docs: dict[str, dict[str, Any]],
    later: dict[str, dict[str, Any]],
    gone: set[str],
    text: str,
    compact: bool,
) -> None:
    """The postings are built first, then items are replaced, added and deleted: the scores
    are those of the index as it now is."""
    table = table_of(docs)
    engine_scores(table, ["body"], [1.0], text)  # builds the field's postings
    table.insert(list(later), [orjson.dumps(m) for m in later.values()], [None] * len(later), None)
    table.remove(sorted(gone))
    if compact:
        table, _ = table.relabelled()
    now = {**docs, **later}
    for i in gone:
        now.pop(i, None)
    assert_same(engine_scores(table, ["body"], [1.0], text), oracle(now, ["body"], [1.0], text))


def test_filter_restricts_matches_but_not_statistics() -> None:
    docs = {f"d{i}": {"body": WORDS[i % len(WORDS)] + " whale", "n": i % 3} for i in range(30)}
    table = table_of(docs)
    node = parse_filter({"n": 1})
    allowed = table.columns.evaluate(node, table.next_label) & table.alive[: table.next_label]
    got = engine_scores(table, ["body"], [1.0], "whale bread", allowed=allowed)
    keep = {i for i, m in docs.items() if m["n"] == 1}
    assert_same(got, oracle(docs, ["body"], [1.0], "whale bread", allowed=keep))


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, text=queries, n_shards=st.integers(2, 4))
def test_sharded_scores_equal_unsharded(
    docs: dict[str, dict[str, Any]], text: str, n_shards: int
) -> None:
    whole = engine_scores(table_of(docs), ["body", "title"], [1.0, 2.0], text)
    parts = [
        table_of({i: m for j, (i, m) in enumerate(docs.items()) if j % n_shards == s})
        for s in range(n_shards)
    ]
    parts = [p for p in parts if len(p)]
    terms = query_terms(text)
    stats = [
        sum((p.text_field(f).stats(terms) for p in parts[1:]), parts[0].text_field(f).stats(terms))
        for f in ("body", "title")
    ]
    sharded: dict[str, float] = {}
    for p in parts:
        sharded.update(engine_scores(p, ["body", "title"], [1.0, 2.0], text, stats=stats))
    assert sharded == whole  # exactly: the same sums in the same order


def test_text_stats_add_up() -> None:
    assert TextStats(2, 10, (1, 0)) + TextStats(3, 5, (2, 2)) == TextStats(5, 15, (3, 2))


def test_shard_text_search_ranks_and_survives_reload(tmp_path: Path) -> None:
    key = bytes(range(32))
    docs = {
        "whale": "Whales swim in the deep ocean",
        "bread": "Baking bread at home",
        "sea": "The sea and the ocean",
        "none": None,
    }
    x = np.random.default_rng(0).standard_normal((len(docs), 8)).astype(np.float32)
    meta = tuple(orjson.dumps({"body": t}) if t else None for t in docs.values())
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    shard.upsert(key, UpsertBatch(tuple(docs), x, None, meta, (None,) * len(docs)))
    q = TextQuery(("body",), (1.0,), query_terms("ocean whales"), K1, B, k=10)
    hits = shard.text_search(key, q)
    assert hits.ids == ["whale", "sea"] and hits.scores[0] > hits.scores[1] > 0
    assert shard.text_search(key, TextQuery(("body",), (1.0,), ("ocean",), K1, B, k=1)).ids == [
        "sea"  # shorter document, same term frequency
    ]
    shard.delete(key, ["whale"])
    assert shard.text_search(key, q).ids == ["sea"]
    reloaded = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    assert reloaded.text_search(key, q).ids == ["sea"]
    with_meta = reloaded.text_search(
        key, TextQuery(("body",), (1.0,), ("bread",), K1, B, with_metadata=True)
    )
    assert with_meta.metadata == [meta[1]]


def test_merge_keeps_score_order_and_ties_by_id() -> None:
    from actors.types import TextHits

    a = TextHits(["b", "d"], [2.0, 1.0], None)
    b = TextHits(["a", "c"], [2.0, 0.5], None)
    merged = merge([a, b], 3, False)
    assert merged.ids == ["a", "b", "d"] and merged.scores == [2.0, 2.0, 1.0]


def test_fuse_is_weighted_reciprocal_rank_fusion() -> None:
    got = dict(fuse(["a", "b", "c"], ["c", "d"], 0.5, 60.0, 10))
    assert got["a"] == pytest.approx(0.5 / 61)
    assert got["c"] == pytest.approx(0.5 / 63 + 0.5 / 61)
    assert got["d"] == pytest.approx(0.5 / 62)
    assert [i for i, _ in fuse(["a", "b", "c"], ["c", "d"], 0.5, 60.0, 2)] == ["c", "a"]
    assert [i for i, _ in fuse(["a", "b"], ["b", "a"], 1.0, 60.0, 5)] == ["a", "b"]  # vectors only
    assert [i for i, _ in fuse(["a", "b"], ["b", "a"], 0.0, 60.0, 5)] == ["b", "a"]  # BM25 only
