"""Reference evaluator for metadata filters: plain per-document recursion, no numpy.

Written independently of ``actors.engine.filters``: it interprets the raw filter object (not the
parsed tree) against one metadata document, walking the document along the dotted path the way
MongoDB's matcher does (``src/mongo/db/matcher/path.cpp``): a list on the way down is entered
element by element, object elements continue the walk, other elements are skipped; an object
that lacks the next key, or a scalar where an object is needed, yields "missing" for that
branch. Only valid filters are expected here (the parser's error handling is tested separately).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

_MISSING = object()  # a branch of the walk that stopped short of the end of the path


def _reach(holder: dict[str, Any], segments: list[str]) -> Iterator[Any]:
    """What the path yields from one object: the value found at its end, or ``_MISSING``."""
    seg, rest = segments[0], segments[1:]
    if seg not in holder:
        yield _MISSING
        return
    value = holder[seg]
    if not rest:
        yield value
    elif isinstance(value, dict):
        yield from _reach(value, rest)
    elif isinstance(value, list):
        for element in value:
            if isinstance(element, dict):  # scalars and nested lists are skipped
                yield from _reach(element, rest)
    else:
        yield _MISSING


def _lookup(doc: dict[str, Any], path: str) -> tuple[bool, bool, list[Any]]:
    """(path exists, some branch yields missing, leaf values). At the end of the path a list
    contributes its elements; lists nested in lists and objects contribute nothing."""
    found = list(_reach(doc, path.split(".")))
    ends = [v for v in found if v is not _MISSING]
    leaves: list[Any] = []
    for v in ends:
        if isinstance(v, list):
            leaves.extend(e for e in v if not isinstance(e, (list, dict)))
        elif not isinstance(v, dict):
            leaves.append(v)
    return bool(ends), len(ends) < len(found), leaves


def _kind(v: Any) -> str | None:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return None if isinstance(v, float) and math.isnan(v) else "num"
    if isinstance(v, str):
        return "str"
    return None


def _equal(a: Any, b: Any) -> bool:
    ka = _kind(a)
    return ka is not None and ka == _kind(b) and a == b


def _less(a: Any, b: Any) -> bool | None:
    """a < b when comparable (both numbers or both strings), else None."""
    ka = _kind(a)
    if ka in ("num", "str") and ka == _kind(b):
        return bool(a < b)
    return None


def _eq_matches(doc: dict[str, Any], path: str, operand: Any) -> bool:
    present, missing, leaves = _lookup(doc, path)
    if operand is None:
        return not present or missing or any(v is None for v in leaves)
    return any(_equal(v, operand) for v in leaves)


def _regex_flags(options: str) -> int:
    table = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}
    flags = 0
    for c in options:
        flags |= table[c]
    return flags


def _op_matches(doc: dict[str, Any], path: str, op: str, operand: Any, options: str = "") -> bool:
    if op == "$not":
        return not _cond_matches(doc, path, operand)
    if op == "$eq":
        return _eq_matches(doc, path, operand)
    if op == "$ne":
        return not _eq_matches(doc, path, operand)
    if op == "$in":
        return any(_eq_matches(doc, path, x) for x in operand)
    if op == "$nin":
        return not any(_eq_matches(doc, path, x) for x in operand)
    present, _, leaves = _lookup(doc, path)
    if op == "$exists":
        return present == operand
    if op == "$options":  # read with its $regex
        return True
    if op == "$regex":  # Python's re: the same on the patterns the tests use
        flags = _regex_flags(options)
        return any(isinstance(v, str) and re.search(operand, v, flags) for v in leaves)
    if op == "$contains":
        return any(isinstance(v, str) and operand in v for v in leaves)
    for v in leaves:
        lt = _less(v, operand)
        gt = _less(operand, v)
        if lt is None or gt is None:
            continue
        if op == "$gt" and gt:
            return True
        if op == "$gte" and not lt:
            return True
        if op == "$lt" and lt:
            return True
        if op == "$lte" and not gt:
            return True
    return False


def _cond_matches(doc: dict[str, Any], path: str, cond: dict[str, Any]) -> bool:
    """An operator object (``{"$gt": 1, "$lt": 5}``) on one path: all operators hold."""
    options = cond.get("$options", "")
    return all(_op_matches(doc, path, op, operand, options) for op, operand in cond.items())


def matches(doc: dict[str, Any] | None, flt: dict[str, Any] | None) -> bool:
    """Does metadata ``doc`` (None = {}) satisfy the raw filter object ``flt``?"""
    doc = doc or {}
    for key, val in (flt or {}).items():
        if key == "$and":
            ok = all(matches(doc, sub) for sub in val)
        elif key == "$or":
            ok = any(matches(doc, sub) for sub in val)
        elif key == "$nor":
            ok = not any(matches(doc, sub) for sub in val)
        elif isinstance(val, dict):
            ok = _cond_matches(doc, key, val)
        else:
            ok = _eq_matches(doc, key, val)
        if not ok:
            return False
    return True
