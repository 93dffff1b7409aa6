"""MongoDB-style metadata filters: the language, its matching rules, and a parser to a typed tree.

Filter language: several keys are an implicit AND; ``$and``/``$or``/``$nor`` take non-empty lists
of filters (``$nor`` matches when none of them matches); ``{"f": scalar}`` is ``$eq``;
``{"f": {"$op": operand, ...}}`` ANDs its operators (``$eq $ne $gt $gte $lt $lte $in $nin
$exists $not``); ``{"f": {"$not": {...operators...}}}`` matches exactly where the inner operators
(ANDed) do not, so also where ``f`` is missing (``{"$not": {"$gt": 5}}`` is not ``$lte: 5``);
``$not`` may nest, but is a field operator only (at the top level, use ``$nor``). ``"a.b"``
reaches nested objects, also through lists of objects (``{"a": [{"b": 1}]}``). Anything else
(unknown operators, ``$not`` with a non-object or empty operand, a non-list ``$nor``) is an
InvalidRequest naming the operator.

Matching rules (MongoDB's, checked against its matcher and jstests/core/query/
null_query_semantics.js): types are strict (bool is not a number; int and float compare
numerically; strings compare by code point, as MongoDB's binary comparison of UTF-8 does;
nothing orders across types). A list value matches when any element matches; lists nested in
lists are ignored. A path is walked like MongoDB's matcher does: a list on the way is entered
element by element, object elements continue the walk and other elements are skipped; a branch
that meets an object lacking the next key, or a scalar or null where the path goes on, yields
"missing". ``$eq: null`` (also ``{"f": null}`` and a null in ``$in``) matches where the path is
missing altogether, holds null (or a list holding null) or has a missing branch:
``{"a.b": null}`` matches ``{"a": [{"b": 3}, {}]}`` and ``{"a": []}``, while ``{"a": null}``
does not match ``{"a": []}``. ``$ne``/``$nin`` are exactly NOT ``$eq``/``$in``, and
``$not``/``$nor`` exactly NOT their operands, so all four match documents where the field is
missing. ``$exists`` is true when some branch reaches the path (even with null, ``[]`` or an
object); ``$gt``-style operators never match a missing path or null. ``$regex`` (with
``$options`` ``i``, ``m``, ``s``) matches a string value a regular expression finds a match in,
``$contains`` one holding a substring (CyborgDB's operator); like every operator they match a
list holding such a string, and never a missing path, null or another type.

Deliberate differences from MongoDB: operands are scalars only (no whole-list or object equality,
no ``$gte: null``, no NaN or infinity), regular expressions are RE2's (linear time: no
backreferences or lookaround; a pattern of at most 1,024 characters), there is no ``$type``,
``$elemMatch``, ``$size`` or
``$all``, and numeric path segments name object keys only (``"tags.0"`` is not the first
element). A key that itself contains a dot (``{"a.b": 1}``) is matched by the path ``"a.b"``
too (MongoDB would not reach it), and mixing such keys with nested objects of the same path
leaves the missing-branch rule approximate.

``actors.engine.filters.columns`` stores metadata and evaluates these trees over it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

import re2

from actors.errors import InvalidRequest

__all__ = [
    "And",
    "Cmp",
    "Exists",
    "FilterNode",
    "Not",
    "Or",
    "Pattern",
    "compiled",
    "parse_filter",
    "pattern_paths",
]


@dataclass(frozen=True)
class And:
    children: tuple[FilterNode, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[FilterNode, ...]


@dataclass(frozen=True)
class Not:
    child: FilterNode


@dataclass(frozen=True)
class Cmp:
    path: str
    op: str  # eq ne gt gte lt lte in nin; for in/nin ``value`` is a tuple
    value: Any


@dataclass(frozen=True)
class Exists:
    path: str
    exists: bool


@dataclass(frozen=True)
class Pattern:
    """``$regex`` (RE2 syntax, ``$options`` as inline flags) or ``$contains`` (a substring) on
    the string values at ``path`` (also the strings of a list there)."""

    path: str
    kind: str  # "regex" or "contains"
    text: str


FilterNode = Union[And, Or, Not, Cmp, Exists, Pattern]  # noqa: UP007 - runtime alias

# --------------------------------------------------------------------------- parsing

_OPS = {f"${op}": op for op in ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")}
_MAX_DEPTH = 32
MAX_PATTERN = 1024  # characters of a $regex or $contains operand
_FLAGS = frozenset("ims")  # $options: case-insensitive, multi-line, dot matches newline
_RE2_MEMORY = 8 << 20  # bytes one compiled $regex may use (RE2 refuses larger programs)


@functools.lru_cache(maxsize=256)
def compiled(pattern: str) -> Any:
    """A $regex compiled with RE2: matching takes time linear in the value, whatever the
    pattern (no backtracking), and a pattern too large for its memory bound is refused."""
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MEMORY
    return re2.compile(pattern, options)


def _tname(v: Any) -> str:
    if v is None:
        return "null"
    for types, name in ((bool, "bool"), (Mapping, "object"), ((list, tuple), "list")):
        if isinstance(v, types):
            return name
    return type(v).__name__


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_finite(v: Any, what: str) -> None:
    try:
        ok = math.isfinite(float(v))
    except OverflowError:
        ok = False
    if not ok:
        raise InvalidRequest(f"{what} must be a finite number")


def _scalar(v: Any, what: str) -> Any:
    """Validate an $eq/$ne/$in operand: str, int/float (finite), bool or None."""
    if v is None or isinstance(v, (str, bool)):
        return v
    if _is_num(v):
        _check_finite(v, what)
        return v
    if isinstance(v, (list, tuple)):
        raise InvalidRequest(f"{what} cannot be a list (use $in to match any of several values)")
    if isinstance(v, Mapping):
        raise InvalidRequest(f"{what} is an object without operators (use dot paths instead)")
    raise InvalidRequest(f"{what} must be a string, number, bool or null, got {_tname(v)}")


def _check_path(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidRequest(f"filter: field names must be strings, got {_tname(key)}")
    if not key or any(not seg for seg in key.split(".")):
        raise InvalidRequest(f"filter: empty field name or path segment in {key!r}")
    return key


def parse_filter(obj: Any) -> FilterNode | None:
    """Parse a filter object; ``None`` or ``{}`` mean "match everything" and give ``None``."""
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise InvalidRequest(f"filter: must be an object, got {_tname(obj)}")
    if not obj:
        return None
    return _parse_doc(obj, 0)


_COMBINATORS: dict[str, Callable[[tuple[FilterNode, ...]], FilterNode]] = {
    "$and": And,
    "$or": Or,
    "$nor": lambda children: Not(Or(children)),
}


def _too_deep(depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise InvalidRequest(f"filter: nested deeper than {_MAX_DEPTH} levels")


def _parse_doc(doc: Mapping[Any, Any], depth: int) -> FilterNode:
    _too_deep(depth)
    nodes: list[FilterNode] = []
    for key, val in doc.items():
        if isinstance(key, str) and key.startswith("$"):
            if key == "$not":
                raise InvalidRequest(
                    "filter: unknown operator '$not' at the top level ($not negates a field's "
                    'operators, as in {"f": {"$not": {"$gt": 5}}}; $nor negates whole filters)'
                )
            if key not in _COMBINATORS:
                raise InvalidRequest(f"filter: unknown operator {key!r}")
            if not isinstance(val, (list, tuple)) or not val:
                raise InvalidRequest(f"filter: {key} needs a non-empty list of filter objects")
            children: list[FilterNode] = []
            for i, child in enumerate(val):
                if not isinstance(child, Mapping):
                    raise InvalidRequest(
                        f"filter: {key}[{i}] must be a filter object, got {_tname(child)}"
                    )
                children.append(_parse_doc(child, depth + 1))
            nodes.append(_COMBINATORS[key](tuple(children)))
        else:
            nodes.append(_parse_field(_check_path(key), val, depth))
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))


def _parse_field(path: str, val: Any, depth: int) -> FilterNode:
    if not isinstance(val, Mapping):
        return Cmp(path, "eq", _scalar(val, f"filter: value for {path!r}"))
    keys = list(val)
    dollar = [isinstance(k, str) and k.startswith("$") for k in keys]
    if not any(dollar):
        raise InvalidRequest(
            f"filter: value for {path!r} is an object without operators "
            "(use dot paths for nested fields, $in for lists)"
        )
    if not all(dollar):
        raise InvalidRequest(f"filter: object for {path!r} mixes operators and field names")
    return _parse_ops(path, val, depth)


def _pattern_text(operand: Any, what: str) -> str:
    if not isinstance(operand, str):
        raise InvalidRequest(f"{what} needs a string, got {_tname(operand)}")
    if len(operand) > MAX_PATTERN:
        raise InvalidRequest(f"{what} is longer than {MAX_PATTERN} characters")
    return operand


def _parse_regex(path: str, operand: Any, options: Any, what: str) -> Pattern:
    text = _pattern_text(operand, what)
    if options is not None:
        if not isinstance(options, str) or not set(options) <= _FLAGS:
            raise InvalidRequest(f"{what}: $options takes the flags i, m and s, got {options!r}")
        if options:
            text = f"(?{''.join(sorted(set(options)))}){text}"
    try:
        compiled(text)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise InvalidRequest(
            f"{what}: not a valid regular expression in RE2 syntax (no backreferences or "
            f"lookaround): {detail}"
        ) from None
    return Pattern(path, "regex", text)


def pattern_paths(node: FilterNode | None) -> Iterator[tuple[str, str]]:
    """(path, "regex" | "contains" | "compare") of every condition in the tree."""
    if node is None:
        return
    if isinstance(node, (And, Or)):
        for child in node.children:
            yield from pattern_paths(child)
    elif isinstance(node, Not):
        yield from pattern_paths(node.child)
    elif isinstance(node, Pattern):
        yield node.path, node.kind
    else:
        yield node.path, "compare"


def _parse_not(path: str, operand: Any, depth: int) -> FilterNode:
    what = f"filter: $not on {path!r}"
    _too_deep(depth)
    if not isinstance(operand, Mapping):
        raise InvalidRequest(
            f'{what} needs an object of operators (such as {{"$gt": 5}}), got {_tname(operand)}'
        )
    if not operand:
        raise InvalidRequest(f"{what} cannot be empty (give it at least one operator)")
    for key in operand:
        if not (isinstance(key, str) and key.startswith("$")):
            raise InvalidRequest(
                f"{what} takes operators only, got the field name {key!r} "
                "(use a dot path on the outside, or $nor to negate whole filters)"
            )
    return _parse_ops(path, operand, depth)


def _parse_ops(path: str, ops: Mapping[str, Any], depth: int) -> FilterNode:
    """An object of operators on one path (every key starts with "$"); they are ANDed."""
    nodes: list[FilterNode] = []
    for key, operand in ops.items():
        what = f"filter: {key} on {path!r}"
        if key == "$not":
            nodes.append(Not(_parse_not(path, operand, depth + 1)))
        elif key == "$exists":
            if not isinstance(operand, bool):
                raise InvalidRequest(f"{what} needs a bool, got {_tname(operand)}")
            nodes.append(Exists(path, operand))
        elif key in ("$eq", "$ne"):
            nodes.append(Cmp(path, _OPS[key], _scalar(operand, what)))
        elif key in ("$gt", "$gte", "$lt", "$lte"):
            if not isinstance(operand, str) and not _is_num(operand):
                raise InvalidRequest(f"{what} needs a number or string, got {_tname(operand)}")
            if _is_num(operand):
                _check_finite(operand, what)
            nodes.append(Cmp(path, _OPS[key], operand))
        elif key in ("$in", "$nin"):
            if not isinstance(operand, (list, tuple)):
                raise InvalidRequest(f"{what} needs a list, got {_tname(operand)}")
            items = tuple(_scalar(v, f"{what} element") for v in operand)
            nodes.append(Cmp(path, _OPS[key], items))
        elif key == "$regex":
            nodes.append(_parse_regex(path, operand, ops.get("$options"), what))
        elif key == "$options":
            if "$regex" not in ops:
                raise InvalidRequest(f"{what}: $options goes with $regex")
        elif key == "$contains":
            nodes.append(Pattern(path, "contains", _pattern_text(operand, what)))
        else:
            raise InvalidRequest(f"filter: unknown operator {key!r} on {path!r}")
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))
