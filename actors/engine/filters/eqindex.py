"""Equality lookups on one metadata column: its rows ordered by value.

``{"f": v}`` and ``{"f": {"$in": [...]}}`` otherwise compare every value the path holds, at
each evaluation: half a millisecond at 500,000 items, however few match. An :class:`EqIndex`
finds the rows holding given values by binary search, in time proportional to the matches.
A column builds one on its second equality lookup (MetadataColumns keeps it with the column);
:func:`lookup` then answers such a filter (and an ``$and`` of them) as the labels it matches,
without a pass over every row.
Appends leave it valid for the entries it covers (a prefix of the column's arrays, which only
grow); the entries appended since are compared one by one until they are more than
1 / ``EQ_INDEX_TAIL`` of the covered ones, and the index is then built again.

Memory: 4 bytes per covered entry (8 past 2**31 rows) plus 16 per distinct value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from actors.engine.filters.tree import And, Cmp, FilterNode, _is_num

if TYPE_CHECKING:
    from actors.engine.filters.columns import _Column

EQ_INDEX_AFTER = 2  # a column's equality lookups before it builds its index
EQ_INDEX_TAIL = 8  # rebuilt once the uncovered entries exceed 1/8 of the covered ones


@dataclass(frozen=True, eq=False)
class EqIndex:
    """The first ``covered`` entries of a column's (rows, values) arrays, grouped by value."""

    covered: int
    rows: np.ndarray  # the covered entries' rows, by value (in entry order within one value)
    values: np.ndarray  # the distinct covered values, ascending (each NaN its own, last)
    starts: np.ndarray  # rows[starts[i] : starts[i + 1]] hold values[i]

    @classmethod
    def build(cls, rows: np.ndarray, values: np.ndarray) -> EqIndex:
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        cut = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        starts = np.concatenate(([0], cut, [len(ordered)])).astype(np.int64)
        small = len(rows) == 0 or int(rows.max()) < 2**31
        return cls(
            len(values),
            rows[order].astype(np.int32 if small else np.int64),
            ordered[starts[:-1]] if len(ordered) else ordered,
            starts if len(ordered) else starts[:1],
        )

    def find(self, keys: np.ndarray) -> list[np.ndarray]:
        """The covered rows holding each of ``keys`` that the column holds (a row once per
        entry: a document's list may hold a value twice)."""
        at = np.searchsorted(self.values, keys)
        inside = at < len(self.values)
        at, keys = at[inside], keys[inside]
        at = at[self.values[at] == keys]
        starts = self.starts
        return [self.rows[starts[i] : starts[i + 1]] for i in at.tolist()]

    def nbytes(self) -> int:
        return self.rows.nbytes + self.values.nbytes + self.starts.nbytes


def stale(index: EqIndex | None, entries: int) -> bool:
    """Whether a column of ``entries`` entries should build its index (again)."""
    return index is None or (entries - index.covered) * EQ_INDEX_TAIL > index.covered


def lookup(
    column: Callable[[str], _Column | None], node: FilterNode, width: int, most: int
) -> np.ndarray | None:
    """The labels below ``width`` that ``node`` matches, ascending and distinct, from the
    equality indexes of the columns ``column`` names by path, in time proportional to the
    matches: for ``$eq`` and ``$in`` on numbers and strings, and an ``$and`` of them. None for
    any other filter, where an index is not built yet, or where more than ``most`` entries
    match (a pass over every row then costs no more)."""
    if isinstance(node, And):
        out: np.ndarray | None = None
        for child in node.children:
            found = lookup(column, child, width, most)
            if found is None:
                return None
            out = found if out is None else np.intersect1d(out, found, assume_unique=True)
        return out
    if not isinstance(node, Cmp) or node.op not in ("eq", "in"):
        return None
    values = (node.value,) if node.op == "eq" else tuple(node.value)
    if not all(isinstance(v, str) or _is_num(v) for v in values):
        return None  # null (a missing path matches it) and booleans: the mask's way
    col = column(node.path)
    if col is None:
        return np.zeros(0, dtype=np.int64)
    nums = [float(v) for v in values if _is_num(v)]
    codes = [col.vocab[v] for v in values if isinstance(v, str) and v in col.vocab]
    parts = []
    for kind, keys in (("nrow", nums), ("srow", codes)):
        if keys:
            found = col.equal_rows(kind, keys, build=False)
            if found is None:
                return None
            parts.append(found)
    if sum(len(p) for p in parts) > most:
        return None
    rows = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    several = len(nums) + len(codes) > 1 or bool(col.dups & {"nrow", "srow"})
    rows = np.unique(rows) if several else np.sort(rows, kind="stable")
    return rows[rows < width]
