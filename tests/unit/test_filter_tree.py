"""Filter parser: the typed trees it builds and the filters it rejects."""

from __future__ import annotations

import math
from typing import Any

import pytest

from actors.engine.filters.tree import And, Cmp, Exists, Not, Or, parse_filter
from actors.errors import InvalidRequest


def test_parse_empty_and_none() -> None:
    assert parse_filter(None) is None
    assert parse_filter({}) is None


def test_parse_tree_shapes() -> None:
    assert parse_filter({"a": 1}) == Cmp("a", "eq", 1)
    assert parse_filter({"a": {"$gt": 1, "$lt": 5}}) == And((Cmp("a", "gt", 1), Cmp("a", "lt", 5)))
    assert parse_filter({"a": 1, "b": {"$exists": False}}) == And(
        (Cmp("a", "eq", 1), Exists("b", False))
    )
    assert parse_filter({"$or": [{"a": None}, {"b.c": {"$in": ["x", 2]}}]}) == Or(
        (Cmp("a", "eq", None), Cmp("b.c", "in", ("x", 2)))
    )
    assert parse_filter({"$and": [{"a": {"$nin": []}}]}) == And((Cmp("a", "nin", ()),))
    node = parse_filter({"a": {"$in": [1, "x", True, None]}})
    assert isinstance(node, Cmp) and isinstance(node.value, tuple)


def test_parse_not_and_nor() -> None:
    assert parse_filter({"a": {"$not": {"$gt": 5}}}) == Not(Cmp("a", "gt", 5))
    assert parse_filter({"a": {"$not": {"$gt": 1, "$lt": 5}}}) == Not(
        And((Cmp("a", "gt", 1), Cmp("a", "lt", 5)))
    )
    assert parse_filter({"a": {"$exists": True, "$not": {"$not": {"$eq": None}}}}) == And(
        (Exists("a", True), Not(Not(Cmp("a", "eq", None))))
    )
    assert parse_filter({"$nor": [{"a": 1}, {"b": {"$exists": False}}]}) == Not(
        Or((Cmp("a", "eq", 1), Exists("b", False)))
    )
    assert parse_filter({"$nor": [{"a": 1}], "b": 2}) == And(
        (Not(Or((Cmp("a", "eq", 1),))), Cmp("b", "eq", 2))
    )


@pytest.mark.parametrize(
    ("flt", "fragment"),
    [
        ([1, 2], "must be an object"),
        ("a", "must be an object"),
        ({"$not": {"a": 1}}, "unknown operator '$not' at the top level"),
        ({"$not": {"a": 1}}, "$nor negates whole filters"),
        ({"$NOR": [{"a": 1}]}, "unknown operator '$NOR'"),
        ({"$xor": [{"a": 1}]}, "unknown operator '$xor'"),
        ({"$nor": []}, "$nor needs a non-empty list"),
        ({"$nor": {"a": 1}}, "$nor needs a non-empty list"),
        ({"$nor": "a"}, "$nor needs a non-empty list"),
        ({"$nor": [{"a": 1}, None]}, "$nor[1] must be a filter object, got null"),
        ({"$nor": [{"a": {"$bad": 1}}]}, "unknown operator '$bad' on 'a'"),
        ({"a": {"$nor": [{"a": 1}]}}, "unknown operator '$nor' on 'a'"),
        ({"a": {"$not": 5}}, "$not on 'a' needs an object of operators"),
        ({"a": {"$not": 5}}, "got int"),
        ({"a": {"$not": None}}, "$not on 'a' needs an object of operators (such as"),
        ({"a": {"$not": [{"$gt": 1}]}}, "$not on 'a' needs an object of operators"),
        ({"a": {"$not": "x"}}, "got str"),
        ({"a": {"$not": {}}}, "$not on 'a' cannot be empty"),
        ({"a": {"$not": {"b": 1}}}, "$not on 'a' takes operators only, got the field name 'b'"),
        ({"a": {"$not": {"$gt": 1, "b": 1}}}, "takes operators only"),
        ({"a": {"$not": {"$foo": 1}}}, "unknown operator '$foo' on 'a'"),
        ({"a": {"$not": {"$gt": None}}}, "$gt on 'a' needs a number or string, got null"),
        ({"a": {"$not": {"$not": {}}}}, "$not on 'a' cannot be empty"),
        ({"a": {"$not": {"$in": 3}}}, "$in on 'a' needs a list"),
        ({"$and": []}, "$and needs a non-empty list"),
        ({"$or": {"a": 1}}, "$or needs a non-empty list"),
        ({"$or": [1]}, "$or[0] must be a filter object"),
        ({"a": {"$gt": 1, "b": 2}}, "mixes operators and field names"),
        ({"a": {"b": 2}}, "object without operators"),
        ({"a": {}}, "object without operators"),
        ({"a": [1, 2]}, "use $in"),
        ({"a": {"$eq": [1]}}, "use $in"),
        ({"a": {"$ne": {"x": 1}}}, "object without operators"),
        ({"a": {"$foo": 1}}, "unknown operator '$foo' on 'a'"),
        ({"price": {"$gt": True}}, "$gt on 'price' needs a number or string, got bool"),
        ({"price": {"$lte": None}}, "$lte on 'price' needs a number or string, got null"),
        ({"price": {"$lt": [1]}}, "$lt on 'price' needs a number or string, got list"),
        ({"a": {"$in": 1}}, "$in on 'a' needs a list"),
        ({"a": {"$nin": "ab"}}, "$nin on 'a' needs a list"),
        ({"a": {"$in": [[1]]}}, "$in on 'a' element"),
        ({"a": {"$in": [{"x": 1}]}}, "$in on 'a' element"),
        ({"a": {"$exists": 1}}, "$exists on 'a' needs a bool"),
        ({"a": math.nan}, "finite"),
        ({"a": {"$gt": math.inf}}, "finite"),
        ({"a": {"$in": [1, -math.inf]}}, "finite"),
        ({"a": 10**400}, "finite"),
        ({"": 1}, "empty field name"),
        ({"a..b": 1}, "empty field name or path segment in 'a..b'"),
        ({"a.": 1}, "path segment"),
        ({"a": b"x"}, "got bytes"),
        ({1: 2}, "field names must be strings"),
        ({"$and": [{"a": {"$gt": None}}]}, "$gt on 'a'"),
    ],
)
def test_parse_rejects(flt: Any, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        parse_filter(flt)
    assert fragment in exc.value.detail
    assert exc.value.detail.startswith("filter")


@pytest.mark.parametrize("wrap", ["$and", "$or", "$nor", "$not"])
def test_parse_rejects_deep_nesting(wrap: str) -> None:
    flt: dict[str, Any] = {"a": 1}
    cond: dict[str, Any] = {"$gt": 1}
    for _ in range(40):
        flt = {wrap: [flt]}
        cond = {"$not": cond}
    if wrap == "$not":
        flt = {"a": cond}
    with pytest.raises(InvalidRequest, match="nested deeper"):
        parse_filter(flt)
    # far below Python's recursion limit either way
    shallow: dict[str, Any] = {"a": {"$gt": 1}}
    for _ in range(30):
        shallow = {"a": {"$not": shallow["a"]}}
    assert parse_filter(shallow) is not None
