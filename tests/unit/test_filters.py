"""Evaluation over MetadataColumns: operators, MongoDB's null semantics, storage, and a property
test against the reference evaluator in tests/unit/filter_oracle.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.engine.filters import And, Cmp, Exists, MetadataColumns, Not, Or, parse_filter
from actors.errors import InvalidRequest
from tests.unit.filter_oracle import matches


def store(*docs: dict[str, Any] | None) -> MetadataColumns:
    cols = MetadataColumns()
    cols.append(np.arange(len(docs), dtype=np.int64), list(docs))
    return cols


def rows(cols: MetadataColumns, flt: Any, n: int | None = None) -> list[int]:
    n = len(cols) if n is None else n
    mask = cols.evaluate(parse_filter(flt), n)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    return np.flatnonzero(mask).tolist()


# ------------------------------------------------------------------ operators


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"name": {"$regex": "^a"}}, [0, 3]),  # a list holding a match matches
        ({"name": {"$regex": "^b"}}, []),
        ({"name": {"$regex": "^b", "$options": "i"}}, [1]),
        ({"name": {"$regex": "e$"}}, [0, 3]),
        ({"name": {"$not": {"$regex": "^a"}}}, [1, 2, 4, 5, 6]),
        ({"tags": {"$contains": "ell"}}, [1]),
        ({"name": {"$contains": ""}}, [0, 1, 2, 3]),  # every string, never a missing path
        ({"price": {"$regex": "1"}}, [2]),  # strings only: the number 10 is not matched
        ({"nested.y.z": {"$regex": "^de+p$"}}, [3]),
        ({"name": {"$regex": "(a+)+$"}}, [1]),  # catastrophic for backtracking engines
    ],
)
def test_regex_and_contains(
    cols: MetadataColumns, flt: dict[str, Any], expected: list[int]
) -> None:
    assert rows(cols, flt) == expected
    assert rows(cols, flt) == [i for i, d in enumerate(DOCS) if matches(d, flt)]


def test_a_hostile_regex_runs_in_linear_time() -> None:
    """Patterns that take a backtracking engine time exponential in the value's length: with a
    50,000-character value this test would not end (the suite's timeout fails it)."""
    cols = store({"s": "a" * 50_000 + "!"})
    assert rows(cols, {"s": {"$regex": "^(a+)+$"}}) == []
    assert rows(cols, {"s": {"$regex": "(a|aa)*b"}}) == []


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"s": {"$regex": "(a"}}, "not a valid regular expression"),
        ({"s": {"$regex": r"(\w)\1"}}, "not a valid regular expression"),  # backreference
        ({"s": {"$regex": "(?=a)"}}, "not a valid regular expression"),  # lookahead
        ({"s": {"$regex": "a" * 1025}}, "longer than 1024"),
        ({"s": {"$regex": 5}}, "needs a string"),
        ({"s": {"$regex": "a", "$options": "x"}}, "flags i, m and s"),
        ({"s": {"$options": "i"}}, r"goes with \$regex"),
        ({"s": {"$contains": ["a"]}}, "needs a string"),
    ],
)
def test_bad_patterns_are_422(flt: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_filter(flt)


DOCS: list[dict[str, Any] | None] = [
    {"price": 10, "name": "apple", "tags": ["red", "fruit"], "ok": True},  # 0
    {"price": 2.5, "name": "Banana", "tags": ["yellow"], "ok": False},  # 1
    {"price": "10", "name": "cherry", "tags": [], "ok": None},  # 2
    {"price": None, "name": ["apple", "pie"], "nested": {"x": 1, "y": {"z": "deep"}}},  # 3
    None,  # 4
    {"price": [1, 20, None], "ok": [True, 1]},  # 5
    {"price": 10.0, "nested": {"x": [3, 4]}},  # 6
]


@pytest.fixture
def cols() -> MetadataColumns:
    return store(*DOCS)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"price": 10}, [0, 6]),
        ({"price": {"$eq": 10.0}}, [0, 6]),
        ({"price": "10"}, [2]),
        ({"price": 20}, [5]),
        ({"price": None}, [3, 4, 5]),
        ({"price": {"$ne": 10}}, [1, 2, 3, 4, 5]),
        ({"price": {"$ne": None}}, [0, 1, 2, 6]),
        ({"price": {"$gt": 5}}, [0, 5, 6]),
        ({"price": {"$gte": 10}}, [0, 5, 6]),
        ({"price": {"$lt": 2.5}}, [5]),
        ({"price": {"$lte": 2.5}}, [1, 5]),
        ({"price": {"$gt": 2.5, "$lt": 20}}, [0, 5, 6]),  # ops match independently
        ({"price": {"$gte": "1"}}, [2]),
        ({"price": {"$in": [2.5, "10"]}}, [1, 2]),
        ({"price": {"$in": []}}, []),
        ({"price": {"$nin": []}}, [0, 1, 2, 3, 4, 5, 6]),
        ({"price": {"$nin": [10, None]}}, [1, 2]),
        ({"price": {"$in": [None]}}, [3, 4, 5]),
        ({"name": "apple"}, [0, 3]),
        ({"name": {"$gt": "b"}}, [2, 3]),
        ({"name": {"$gte": "Banana"}}, [0, 1, 2, 3]),
        ({"name": {"$lt": "apple"}}, [1]),
        ({"name": {"$lte": "apple"}}, [0, 1, 3]),
        ({"name": {"$gt": "apple", "$lt": "pie"}}, [2, 3]),
        ({"name": {"$lte": "pie"}}, [0, 1, 2, 3]),
        ({"name": {"$gt": "zzz"}}, []),
        ({"name": {"$in": ["pie", "nope"]}}, [3]),
        ({"name": {"$nin": ["pie", "nope"]}}, [0, 1, 2, 4, 5, 6]),
        ({"name": {"$ne": "apple"}}, [1, 2, 4, 5, 6]),
        ({"tags": "red"}, [0]),
        ({"tags": {"$in": ["yellow", "fruit"]}}, [0, 1]),
        ({"tags": None}, [3, 4, 5, 6]),
        ({"ok": True}, [0, 5]),
        ({"ok": False}, [1]),
        ({"ok": 1}, [5]),
        ({"ok": {"$in": [True, False]}}, [0, 1, 5]),
        ({"ok": {"$ne": True}}, [1, 2, 3, 4, 6]),
        ({"missing": None}, [0, 1, 2, 3, 4, 5, 6]),
        ({"missing": 1}, []),
        ({"missing": {"$ne": 1}}, [0, 1, 2, 3, 4, 5, 6]),
        ({"missing": {"$gt": 0}}, []),
        # $not: the negated operators, matching where the field is missing too
        ({"price": {"$not": {"$gt": 5}}}, [1, 2, 3, 4]),
        ({"price": {"$not": {"$gte": 2.5, "$lte": 10}}}, [2, 3, 4]),
        ({"price": {"$not": {"$eq": None}}}, [0, 1, 2, 6]),
        ({"price": {"$not": {"$ne": None}}}, [3, 4, 5]),
        ({"price": {"$not": {"$in": [10, "10"]}}}, [1, 3, 4, 5]),
        ({"price": {"$not": {"$nin": [10, "10"]}}}, [0, 2, 6]),
        ({"price": {"$not": {"$exists": True}}}, [4]),
        ({"price": {"$not": {"$not": {"$gt": 5}}}}, [0, 5, 6]),
        ({"price": {"$exists": True, "$not": {"$gt": 5}}}, [1, 2, 3]),
        ({"tags": {"$not": {"$in": ["red", "yellow"]}}}, [2, 3, 4, 5, 6]),
        ({"name": {"$not": {"$lt": "b"}}}, [2, 4, 5, 6]),
        ({"missing": {"$not": {"$gt": 0}}}, [0, 1, 2, 3, 4, 5, 6]),
        ({"missing": {"$not": {"$exists": False}}}, []),
        ({"nested.x": {"$not": {"$gte": 3}}}, [0, 1, 2, 3, 4, 5]),
        # $nor: none of the filters matches (missing fields do not match {"f": value})
        ({"$nor": [{"price": 10}]}, [1, 2, 3, 4, 5]),
        ({"$nor": [{"price": 10}, {"name": "apple"}]}, [1, 2, 4, 5]),
        ({"$nor": [{"ok": True}, {"ok": False}]}, [2, 3, 4, 6]),
        ({"$nor": [{"price": {"$exists": True}}]}, [4]),
        ({"$nor": [{"$nor": [{"price": 10}]}]}, [0, 6]),
        ({"$nor": [{"price": {"$lt": 5}}], "tags": {"$exists": True}}, [0, 2]),
        ({"$or": [{"$nor": [{"price": {"$exists": True}}]}, {"ok": None}]}, [2, 3, 4, 6]),
    ],
)
def test_operators(cols: MetadataColumns, flt: dict[str, Any], expected: list[int]) -> None:
    assert rows(cols, flt) == expected
    assert rows(cols, flt) == [i for i, d in enumerate(DOCS) if matches(d, flt)]


# The documents of MongoDB's jstests/core/query/null_query_semantics.js (those without the
# BSON-only ``undefined``), with the results that test expects from MongoDB.
MONGO_NULL_DOCS: list[dict[str, Any]] = [
    {"a": {}},  # 0
    {"a": None},  # 1
    {"a": 4},  # 2
    {"a": {"b": "hi"}},  # 3
    {"a": {"b": None}},  # 4
    {},  # 5
    {"a": [[]]},  # 6
    {"a": []},  # 7
    {"a": [{"b": None}, {"b": None}, {}]},  # 8
    {"a": [{"b": 1}, {"b": 3}, {"b": "string"}]},  # 9
    {"a": [{"b": None}, {"b": 3}, {"b": None}]},  # 10
    {"a": [{"b": 3}, {}]},  # 11: the {} branch of "a.b" is missing, so it equals null
    {"a": [None, None]},  # 12
    {"a": [1, "string", 4]},  # 13
    {"a": [1, "string", None, 4]},  # 14
]
_ALL = set(range(len(MONGO_NULL_DOCS)))
_A_NULL = [1, 5, 12, 14]
_AB_NULL = [0, 1, 2, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14]


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"a": None}, _A_NULL),
        ({"a": {"$eq": None}}, _A_NULL),
        ({"a": {"$ne": None}}, sorted(_ALL - set(_A_NULL))),
        ({"a": {"$in": [None, 75]}}, _A_NULL),
        ({"a": {"$nin": [None, 75]}}, sorted(_ALL - set(_A_NULL))),
        ({"$or": [{"a": None}, {"a": 75}]}, _A_NULL),
        ({"a": {"$exists": False}}, [5]),
        ({"a.b": None}, _AB_NULL),
        ({"a.b": {"$ne": None}}, [3, 9]),
        ({"a.b": {"$in": [None, 75]}}, _AB_NULL),
        ({"a.b": {"$nin": [None, 75]}}, [3, 9]),
        ({"$or": [{"a.b": None}, {"a.b": 75}]}, _AB_NULL),
        # and what follows from those with $not / $nor / $exists
        ({"a": {"$not": {"$eq": None}}}, sorted(_ALL - set(_A_NULL))),
        ({"a.b": {"$not": {"$eq": None}}}, [3, 9]),
        ({"a.b": {"$not": {"$ne": None}}}, _AB_NULL),
        ({"$nor": [{"a.b": None}]}, [3, 9]),
        ({"a.b": {"$exists": False}}, [0, 1, 2, 5, 6, 7, 12, 13, 14]),
        ({"a.b": {"$exists": True}}, [3, 4, 8, 9, 10, 11]),
        ({"a.b": 3}, [9, 10, 11]),
        ({"a.b": {"$not": {"$gt": 2}}}, [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14]),
    ],
)
def test_null_and_missing_match_mongodb(flt: dict[str, Any], expected: list[int]) -> None:
    c = store(*MONGO_NULL_DOCS)
    assert rows(c, flt) == expected
    assert [i for i, d in enumerate(MONGO_NULL_DOCS) if matches(d, flt)] == expected


def test_missing_branches_through_lists_of_objects() -> None:
    # MongoDB's path walk (matcher/path.cpp): inside a list, an object lacking the next key or
    # holding a scalar where the path continues yields "missing"; scalar elements are skipped
    docs: list[dict[str, Any] | None] = [
        {"a": [{"b": 5}, {"b": {"c": 1}}]},  # 0: b=5 cannot continue to c
        {"a": [{"b": [5]}, {"b": {"c": 1}}]},  # 1: the list [5] has no objects: skipped
        {"a": [{"b": []}, {"b": {"c": 1}}]},  # 2: empty list: skipped
        {"a": [{"b": {}}, {"b": {"c": 1}}]},  # 3: {} lacks c
        {"a": [{"b": None}, {"b": {"c": 1}}]},  # 4: null cannot continue
        {"a": {"b": [{"c": 1}, {}]}},  # 5: {} lacks c
        {"a": {"b": [{"c": 1}, 7]}},  # 6: 7 is skipped
        {"a": [{"b": {"c": 1}}, {"x": {"c": 2}}]},  # 7: the second object lacks b
        {"a": [{"b": [{"c": 1}]}, {"b": [{"d": 1}]}]},  # 8: {"d": 1} lacks c
        {"a": {"b": {"c": 1}}},  # 9
        {"a": {"b": 5}},  # 10: "a.b.c" missing altogether
    ]
    c = store(*docs)
    assert rows(c, {"a.b.c": None}) == [0, 3, 4, 5, 7, 8, 10]
    assert rows(c, {"a.b.c": {"$ne": None}}) == [1, 2, 6, 9]
    assert rows(c, {"a.b.c": {"$exists": True}}) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert rows(c, {"a.b": None}) == [4, 7]
    assert rows(c, {"a.b.c": {"$not": {"$in": [None, 2]}}}) == [1, 2, 6, 9]
    for flt in ({"a.b.c": None}, {"a.b": None}, {"a.b.c": {"$exists": True}}):
        assert rows(c, flt) == [i for i, d in enumerate(docs) if matches(d, flt)]


def test_missing_branches_across_appends_and_gaps() -> None:
    c = MetadataColumns()
    c.append(np.array([3]), [{"a": [{"b": 1}, {"c": 1}]}])
    assert rows(c, {"a.b": None}, 5) == [0, 1, 2, 3, 4]
    assert rows(c, {"a.b": {"$ne": None}}, 5) == []
    c.append(np.array([1, 6]), [{"a": [{"b": 1}, {"b": 2}]}, {"a": [{"b": 1}, 3]}])
    assert rows(c, {"a.b": {"$ne": None}}, 7) == [1, 6]
    c.append(np.array([0]), [{"a": [{"c": 2}, {"b": 2}]}])
    assert rows(c, {"a.b": {"$ne": None}}, 7) == [1, 6]
    assert rows(c, {"a.b": 2}, 7) == [0, 1]


def test_bool_is_not_a_number() -> None:
    c = store({"v": True}, {"v": 1}, {"v": 0}, {"v": False}, {"v": 1.0})
    assert rows(c, {"v": 1}) == [1, 4]
    assert rows(c, {"v": True}) == [0]
    assert rows(c, {"v": {"$in": [0]}}) == [2]
    assert rows(c, {"v": {"$gte": 0}}) == [1, 2, 4]
    assert rows(c, {"v": {"$in": [False]}}) == [3]


def test_no_cross_type_ordering() -> None:
    c = store({"x": "9"}, {"x": 9}, {"x": True}, {"x": None}, {"x": ["a", 3]})
    assert rows(c, {"x": {"$gt": 5}}) == [1]
    assert rows(c, {"x": {"$lt": 5}}) == [4]
    assert rows(c, {"x": {"$gt": ""}}) == [0, 4]


def test_string_order_is_code_point() -> None:
    c = store({"s": "Z"}, {"s": "a"}, {"s": "é"}, {"s": "ab"}, {"s": ""})
    assert rows(c, {"s": {"$gt": "a"}}) == [2, 3]
    assert rows(c, {"s": {"$lt": "a"}}) == [0, 4]
    assert rows(c, {"s": {"$gte": ""}}) == [0, 1, 2, 3, 4]


def test_dot_paths_and_lists_of_objects() -> None:
    c = store(
        {"a": {"b": 1}},
        {"a": [{"b": 1}, {"b": 2}]},
        {"a": [{"c": 1}]},
        {"a": {"b": [5, [1]]}},
        {"a": [[{"b": 1}]]},
        {"a": 1},
        {"a.b": 1},  # a dotted key is reached by the dotted path (documented)
        {"a": {"b": {"c": {"d": "x"}}}},
    )
    assert rows(c, {"a.b": 1}) == [0, 1, 6]
    assert rows(c, {"a.b": 2}) == [1]
    assert rows(c, {"a.b": {"$gt": 1}}) == [1, 3]
    assert rows(c, {"a.b": {"$exists": True}}) == [0, 1, 3, 6, 7]
    assert rows(c, {"a.b": None}) == [2, 4, 5]
    assert rows(c, {"a.b.c.d": "x"}) == [7]
    assert rows(c, {"a.b.c": {"$exists": True}}) == [7]
    assert rows(c, {"a": {"$exists": True}}) == [0, 1, 2, 3, 4, 5, 7]


def test_nested_lists_are_not_flattened() -> None:
    c = store({"v": [[1, 2], 3]}, {"v": [[None]]}, {"v": [["x"]]})
    assert rows(c, {"v": 1}) == []
    assert rows(c, {"v": 3}) == [0]
    assert rows(c, {"v": None}) == []
    assert rows(c, {"v": {"$exists": True}}) == [0, 1, 2]


def test_exists_null_and_empty() -> None:
    c = store({"v": None}, {"v": []}, {"v": {}}, {}, None, {"w": 1}, {"v": 0})
    assert rows(c, {"v": {"$exists": True}}) == [0, 1, 2, 6]
    assert rows(c, {"v": {"$exists": False}}) == [3, 4, 5]
    assert rows(c, {"v": None}) == [0, 3, 4, 5]
    assert rows(c, {"v": {"$ne": None}}) == [1, 2, 6]


def test_nan_in_metadata_is_ignored_for_comparisons() -> None:
    c = store({"v": math.nan}, {"v": [math.nan, 2]}, {"v": 1})
    assert rows(c, {"v": {"$gte": 0}}) == [1, 2]
    assert rows(c, {"v": {"$lt": 100}}) == [1, 2]
    assert rows(c, {"v": {"$ne": 1}}) == [0, 1]
    assert rows(c, {"v": {"$exists": True}}) == [0, 1, 2]
    assert rows(c, {"v": None}) == []


def test_huge_ints_and_unusual_value_types() -> None:
    c = store(
        {"v": 10**400},
        {"v": np.int64(3)},
        {"v": np.float32(1.5)},
        {"v": np.bool_(True)},
        {"v": ("t", 4)},
        {"v": object()},
    )
    assert rows(c, {"v": {"$exists": True}}) == [0, 1, 2, 3, 4, 5]
    assert rows(c, {"v": {"$gt": 0}}) == [1, 2, 4]
    assert rows(c, {"v": True}) == [3]
    assert rows(c, {"v": "t"}) == [4]


def test_and_or_combinations(cols: MetadataColumns) -> None:
    flt = {"$or": [{"price": {"$lt": 3}}, {"name": "cherry"}], "ok": {"$ne": True}}
    assert rows(cols, flt) == [1, 2]
    assert rows(cols, {"$and": [{"price": 10}, {"ok": True}]}) == [0]
    assert rows(cols, {"$and": [{}], "price": 10}) == [0, 6]
    assert rows(cols, {"$or": [{"price": 10}, {"$and": [{"ok": False}, {"tags": "yellow"}]}]}) == [
        0,
        1,
        6,
    ]


def test_hand_built_trees() -> None:
    c = store({"a": 1}, {"a": 2})
    assert c.evaluate(And(()), 3).tolist() == [True, True, True]
    assert c.evaluate(Or(()), 3).tolist() == [False, False, False]
    assert c.evaluate(Not(And(())), 3).tolist() == [False, False, False]
    assert c.evaluate(Not(Cmp("a", "eq", 2)), 3).tolist() == [True, False, True]
    assert c.evaluate(Not(Not(Cmp("a", "eq", 2))), 3).tolist() == [False, True, False]
    assert c.evaluate(Not(Or((Cmp("a", "eq", 2), Exists("a", False)))), 3).tolist() == [
        True,
        False,
        False,
    ]
    assert c.evaluate(None, 3).tolist() == [True, True, True]
    assert c.evaluate(Cmp("a", "in", (2, 7)), 2).tolist() == [False, True]
    with pytest.raises(InvalidRequest):
        c.evaluate(Cmp("a", "like", 1), 2)


# ------------------------------------------------------------------ storage


def test_label_gaps_and_n_rows() -> None:
    c = MetadataColumns()
    c.append(np.array([5, 2, 9], dtype=np.int64), [{"a": 1}, {"a": 2}, None])
    assert len(c) == 3
    assert rows(c, {"a": 1}, 12) == [5]
    assert rows(c, {"a": {"$ne": 1}}, 12) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert rows(c, {"a": {"$exists": False}}, 12) == [0, 1, 3, 4, 6, 7, 8, 9, 10, 11]
    # labels >= n_rows are ignored
    assert rows(c, {"a": {"$exists": True}}, 4) == [2]
    assert rows(c, {"a": 1}, 5) == []
    assert c.evaluate(parse_filter({"a": None}), 0).shape == (0,)
    assert rows(MetadataColumns(), {"a": None}, 3) == [0, 1, 2]
    assert rows(MetadataColumns(), {"a": 1}, 3) == []


def test_multiple_appends_and_cache_invalidation() -> None:
    c = MetadataColumns()
    c.append(np.array([0, 1]), [{"a": 1, "s": "x"}, {"a": "y", "b": True}])
    assert rows(c, {"a": 1}, 2) == [0]
    assert rows(c, {"s": {"$gt": "a"}}, 2) == [0]
    c.append(np.array([2]), [{"a": 1.0, "s": "b"}])
    assert rows(c, {"a": 1}, 3) == [0, 2]
    assert rows(c, {"s": {"$gt": "a"}}, 3) == [0, 2]
    assert rows(c, {"s": {"$lt": "c"}}, 3) == [2]
    c.append(np.array([4, 3]), [{"a": [1, "y"], "s": "a"}, {"b": False, "s": ["x", "c"]}])
    c.append(np.array([], dtype=np.int64), [])
    assert len(c) == 5
    assert rows(c, {"a": 1}, 5) == [0, 2, 4]
    assert rows(c, {"a": "y"}, 5) == [1, 4]
    assert rows(c, {"b": {"$in": [True, False]}}, 5) == [1, 3]
    assert rows(c, {"s": {"$gte": "b"}}, 5) == [0, 2, 3]
    assert rows(c, {"s": {"$lt": "b"}}, 5) == [4]
    assert rows(c, {"s": "x"}, 5) == [0, 3]
    # evaluating again uses the cached concatenation and gives the same answer
    assert rows(c, {"s": "x"}, 5) == [0, 3]


def test_append_validation_is_atomic() -> None:
    c = MetadataColumns()
    with pytest.raises(InvalidRequest, match="metadata must be an object, got list"):
        c.append(np.array([0, 1]), [{"a": 1}, [1, 2]])  # type: ignore[list-item]
    assert len(c) == 0
    assert rows(c, {"a": 1}, 2) == []
    with pytest.raises(ValueError):
        c.append(np.array([0]), [{}, {}])
    with pytest.raises(ValueError):
        c.append(np.array([-1]), [{}])


# ------------------------------------------------------------------ property test

KEYS = ["a", "b", "c"]
# top-level paths are listed twice so that they are drawn more often; three-segment paths reach
# through two levels of objects (or lists of objects)
PATHS = ["a", "a", "b", "b", "c", "a.a", "a.b", "b.c", "c.a", "d", "a.b.c", "b.a.a", "a.a.b"]
STRINGS = ["", "a", "b", "ab", "B", "é"]
SCALARS = st.one_of(
    st.integers(-2, 2),
    st.sampled_from([0.0, 0.5, 1.0, -1.5, 2.0]),
    st.sampled_from(STRINGS),
    st.booleans(),
    st.none(),
)
META_SCALARS = st.one_of(SCALARS, st.sampled_from([math.nan, math.inf, -math.inf]))


def _pick(*weighted: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Weighted choice between strategies (st.one_of tends to favour the first branch)."""
    table = [s for w, s in weighted for _ in range(w)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


LIST = st.lists(_pick((5, META_SCALARS), (1, st.lists(SCALARS, max_size=2))), max_size=3)
FLAT = _pick((3, META_SCALARS), (2, LIST))
INNER = st.dictionaries(st.sampled_from(KEYS), FLAT, max_size=3)
# objects one level deeper, and lists mixing objects with scalars: paths walked through lists of
# objects where some objects lack the key (MongoDB's "missing" branches)
MIDDLE = st.dictionaries(
    st.sampled_from(KEYS),
    _pick((3, FLAT), (2, INNER), (2, st.lists(_pick((3, INNER), (1, META_SCALARS)), max_size=3))),
    max_size=3,
)
VALUES = _pick(
    (4, META_SCALARS),
    (3, LIST),
    (2, MIDDLE),
    (
        2,
        st.lists(
            _pick((3, MIDDLE), (1, META_SCALARS), (1, st.lists(INNER, max_size=1))), max_size=3
        ),
    ),
)
DOC = _pick(
    (1, st.none()),
    (1, st.just({})),
    (8, st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=3)),
)

ORDERABLE = st.one_of(
    st.integers(-2, 2),
    st.sampled_from([0.5, 1.0, -1.5, 2.5]),
    st.sampled_from(STRINGS),
)
# Patterns read alike by Python's re (the oracle) and RE2 (the service)
PATTERNS = ["^a", "b$", "ab", "^$", "a|B", "[ab]", "(?i)^b", "é", ".", "^a.*b$"]
BASIC_OP = _pick(
    (1, st.tuples(st.just("$regex"), st.sampled_from(PATTERNS))),
    (1, st.tuples(st.just("$contains"), st.sampled_from(STRINGS))),
    (2, st.tuples(st.sampled_from(["$eq", "$ne"]), SCALARS)),
    (4, st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), ORDERABLE)),
    (2, st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(SCALARS, max_size=3))),
    (1, st.tuples(st.just("$exists"), st.booleans())),
)
OPS = st.lists(BASIC_OP, min_size=1, max_size=2).map(dict)
# $not around one or two operators, now and then around another $not
NOT_OPS = st.recursive(
    OPS,
    lambda inner: st.tuples(inner, st.sampled_from([{}, {"$exists": True}])).map(
        lambda t: {**t[1], "$not": t[0]}
    ),
    max_leaves=2,
)
OP_OPERAND = _pick((6, BASIC_OP), (2, st.tuples(st.just("$not"), NOT_OPS)))
FIELD_COND = _pick((1, SCALARS), (3, st.lists(OP_OPERAND, min_size=1, max_size=2).map(dict)))
LEAF = st.dictionaries(st.sampled_from(PATHS), FIELD_COND, min_size=1, max_size=2)


def _combine(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    lists = st.lists(children, min_size=1, max_size=3)
    return st.one_of(
        lists.map(lambda xs: {"$and": xs}),
        lists.map(lambda xs: {"$or": xs}),
        lists.map(lambda xs: {"$nor": xs}),
        st.tuples(children, LEAF).map(lambda t: {**t[1], **t[0]}),
    )


# depth <= 3: at most two levels of $and/$or/$nor/implicit-AND above the field conditions
FILTER = st.recursive(LEAF, _combine, max_leaves=6).filter(lambda f: _depth(f) <= 3)
COMBINATORS = ("$and", "$or", "$nor")


def _depth(flt: dict[str, Any]) -> int:
    subs = [c for k, v in flt.items() if k in COMBINATORS for c in v]
    return 1 + max((_depth(c) for c in subs), default=0)


def _atoms(flt: dict[str, Any]) -> list[dict[str, Any]]:
    """Every single-operator condition inside a filter, as a filter of its own (a ``$not`` both
    whole and through the operators inside it)."""
    out: list[dict[str, Any]] = []
    for key, val in flt.items():
        if key in COMBINATORS:
            for child in val:
                out.extend(_atoms(child))
        elif isinstance(val, dict):
            for op, operand in val.items():
                out.append({key: {op: operand}})
                if op == "$not":
                    out.extend(_atoms({key: operand}))
        else:
            out.append({key: val})
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(DOC, min_size=1, max_size=25),
    filters=st.lists(FILTER, min_size=1, max_size=4),
    gaps=st.lists(st.integers(0, 2), max_size=25),
    n_split=st.integers(1, 3),
    extra=st.integers(-2, 3),
)
def test_vectorised_matches_reference(
    docs: list[dict[str, Any] | None],
    filters: list[dict[str, Any]],
    gaps: list[int],
    n_split: int,
    extra: int,
) -> None:
    labels, nxt = [], 0
    for i in range(len(docs)):
        nxt += gaps[i] if i < len(gaps) else 0
        labels.append(nxt)
        nxt += 1
    by_label = dict(zip(labels, docs))
    # appends in several batches, in label order or reversed
    order = list(range(len(docs)))[::-1] if n_split == 2 else list(range(len(docs)))
    cols = MetadataColumns()
    step = max(1, math.ceil(len(order) / n_split))
    for start in range(0, len(order), step):
        part = order[start : start + step]
        cols.append(np.array([labels[i] for i in part], dtype=np.int64), [docs[i] for i in part])
        # evaluating between appends exercises cache invalidation
        cols.evaluate(parse_filter(filters[0]), nxt)
    assert len(cols) == len(docs)
    n_rows = max(0, nxt + extra)
    # the whole trees, each operator on its own (so AND/OR/NOT cannot hide a wrong leaf), and
    # null and existence on every path (a sparse draw rarely pairs them with the right document)
    probes = [{p: c} for p in sorted(set(PATHS)) for c in (None, {"$exists": True})]
    for flt in filters + [a for f in filters for a in _atoms(f)] + probes:
        got = cols.evaluate(parse_filter(flt), n_rows)
        want = [matches(by_label.get(r), flt) for r in range(n_rows)]
        assert got.tolist() == want, flt


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(DOC, min_size=1, max_size=25),
    keep=st.lists(st.booleans(), min_size=25, max_size=25),
    filters=st.lists(FILTER, min_size=1, max_size=3),
    stride=st.integers(1, 3),
)
def test_relabelled_matches_reference(
    docs: list[dict[str, Any] | None],
    keep: list[bool],
    filters: list[dict[str, Any]],
    stride: int,
) -> None:
    """Dropping rows and renumbering the rest (compaction) leaves every filter matching the
    kept documents under their new labels, and the copy holds the paths and strings of the
    kept documents only: what a store that only ever held them holds."""
    labels = np.arange(len(docs), dtype=np.int64) * stride
    cols = MetadataColumns()
    half = len(docs) // 2
    cols.append(labels[:half], docs[:half])
    cols.evaluate(parse_filter(filters[0]), int(labels[-1]) + 1)  # caches built, then stale
    cols.append(labels[half:], docs[half:])
    kept = [i for i in range(len(docs)) if keep[i]]
    new_of = np.full(int(labels[-1]) + 1, -1, dtype=np.int64)
    new_of[labels[kept]] = np.arange(len(kept))
    out = cols.relabelled(new_of)
    assert len(out) == len(kept)
    probes = [{p: c} for p in sorted(set(PATHS)) for c in (None, {"$exists": True})]
    for flt in filters + [a for f in filters for a in _atoms(f)] + probes:
        got = out.evaluate(parse_filter(flt), len(kept))
        assert got.tolist() == [matches(docs[i], flt) for i in kept], flt
    fresh = MetadataColumns()
    fresh.append(np.arange(len(kept)), [docs[i] for i in kept])
    assert {p: set(c.vocab) for p, c in out._cols.items()} == {
        p: set(c.vocab) for p, c in fresh._cols.items()
    }


EQ_VALUE = st.one_of(
    st.integers(-2, 2), st.sampled_from([0.0, 0.5, -1.5]), st.sampled_from(STRINGS)
)
EQ_COND = _pick(
    (2, EQ_VALUE),
    (1, EQ_VALUE.map(lambda v: {"$eq": v})),
    (2, st.lists(EQ_VALUE, min_size=1, max_size=3).map(lambda vs: {"$in": vs})),
)
EQ_FILTER = st.dictionaries(st.sampled_from(PATHS), EQ_COND, min_size=1, max_size=2)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(DOC, min_size=2, max_size=40),
    filters=st.lists(EQ_FILTER, min_size=1, max_size=3),
    tail=st.integers(1, 6),
)
def test_equality_lookups_match_reference(
    docs: list[dict[str, Any] | None], filters: list[dict[str, Any]], tail: int
) -> None:
    """``$eq``/``$in`` filters (and their ``$and``) found through the equality indexes match
    the reference, on the index's own entries and on those appended after it was built."""
    # a bulk of plain documents first, so that appends leave a path's index in place and
    # the entries appended after it are compared one by one
    plain: list[dict[str, Any] | None] = [{"a": i % 5 - 2, "b": STRINGS[i % 6]} for i in range(60)]
    docs = plain + docs
    cols = MetadataColumns()
    head = max(1, len(docs) - tail)
    cols.append(np.arange(head, dtype=np.int64), docs[:head])
    looked_up = 0
    for end in range(head, len(docs) + 1):
        if end > head:  # one more document, after the indexes were built
            cols.append(np.array([end - 1], dtype=np.int64), docs[end - 1 : end])
        for flt in filters:
            want = [r for r in range(end) if matches(docs[r], flt)]
            for _ in range(2):  # the second evaluation of a path builds its index
                node = parse_filter(flt)
                assert np.flatnonzero(cols.evaluate(node, end)).tolist() == want, flt
                found = cols.lookup(node, end, most=end * 4)
                if found is not None:
                    looked_up += 1
                    assert found.tolist() == want, flt
    assert looked_up > 0
