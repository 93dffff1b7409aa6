"""Reference evaluator for metadata filters: plain per-document recursion, no numpy.

Written independently of ``actors.filters``: it interprets the raw filter object (not the
parsed tree) against one metadata document, walking the document along the dotted path.
Only valid filters are expected here (the parser's error handling is tested separately).
"""

from __future__ import annotations

import math
from typing import Any


def _lookup(doc: Any, segments: list[str]) -> tuple[bool, list[Any]]:
    """(path exists, leaf values). Lists of objects are traversed on the way down; at the leaf a
    list contributes its elements; lists nested in lists contribute nothing."""
    holders = [doc]
    for i, seg in enumerate(segments):
        found = [h[seg] for h in holders if isinstance(h, dict) and seg in h]
        if not found:
            return False, []
        if i == len(segments) - 1:
            leaves: list[Any] = []
            for v in found:
                if isinstance(v, list):
                    leaves.extend(e for e in v if not isinstance(e, (list, dict)))
                elif not isinstance(v, dict):
                    leaves.append(v)
            return True, leaves
        holders = []
        for v in found:
            if isinstance(v, dict):
                holders.append(v)
            elif isinstance(v, list):
                holders.extend(e for e in v if isinstance(e, dict))
    raise AssertionError("unreachable")


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


def _eq_matches(present: bool, leaves: list[Any], operand: Any) -> bool:
    if operand is None:
        return not present or any(v is None for v in leaves)
    return any(_equal(v, operand) for v in leaves)


def _op_matches(doc: dict[str, Any], path: str, op: str, operand: Any) -> bool:
    present, leaves = _lookup(doc, path.split("."))
    if op == "$eq":
        return _eq_matches(present, leaves, operand)
    if op == "$ne":
        return not _eq_matches(present, leaves, operand)
    if op == "$in":
        return any(_eq_matches(present, leaves, x) for x in operand)
    if op == "$nin":
        return not any(_eq_matches(present, leaves, x) for x in operand)
    if op == "$exists":
        return present == operand
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


def matches(doc: dict[str, Any] | None, flt: dict[str, Any] | None) -> bool:
    """Does metadata ``doc`` (None = {}) satisfy the raw filter object ``flt``?"""
    doc = doc or {}
    for key, val in (flt or {}).items():
        if key == "$and":
            ok = all(matches(doc, sub) for sub in val)
        elif key == "$or":
            ok = any(matches(doc, sub) for sub in val)
        elif isinstance(val, dict):
            ok = all(_op_matches(doc, key, op, operand) for op, operand in val.items())
        else:
            ok = _op_matches(doc, key, "$eq", val)
        if not ok:
            return False
    return True
