"""Columnar metadata store with a vectorised evaluator of filter trees to numpy bool masks.

The filter language and its matching rules are specified in ``actors.engine.filters.tree``.

Storage: each metadata document is flattened to (path, value) pairs by dot-joining keys. Per path
we keep typed "exploded" arrays (row label + value) in chunks, concatenated lazily on the first
evaluation after an append. Strings are stored as integer codes into a per-path vocabulary
(ordering for ``$gt``-style operators comes from a cached sort of that vocabulary). Numbers are
float64: NaN values never match a comparison (so they only satisfy ``$ne``/``$nin``), and
integers beyond 2**53 compare after rounding to float64 (beyond float range they are ignored).
Missing branches need two more row arrays, kept only below lists of objects (where one document
reaches a path along several branches): per path the rows of each object walked into there
("objs") and of scalars or nulls met there ("stop"). A row has a branch missing the key ``k`` of
``p.k`` when ``p`` has more such objects than there are ``p.k`` entries (a cached bincount).

Appends and evaluations are vectorised over all rows at once (figures: docs/performance.md,
measurements behind design choices).
"""

from __future__ import annotations

import math
import numbers
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from actors.engine.filters.eqindex import EQ_INDEX_AFTER, EqIndex, lookup, stale
from actors.engine.filters.tree import (
    And,
    Cmp,
    Exists,
    FilterNode,
    Not,
    Or,
    Pattern,
    _is_num,
    _tname,
    compiled,
)
from actors.errors import InvalidRequest

__all__ = ["MetadataColumns"]


# --------------------------------------------------------------------------- storage

_I64 = np.dtype(np.int64)
_DTYPES: dict[str, np.dtype[Any]] = {
    "present": _I64,  # rows where the path exists (duplicates allowed)
    "null": _I64,  # rows with a null value (or a list holding null)
    "nrow": _I64,
    "nval": np.dtype(np.float64),
    "srow": _I64,
    "scode": _I64,  # index into the column's vocabulary (insertion order)
    "brow": _I64,
    "bval": np.dtype(np.bool_),
    # below a list of objects only (where one document can reach a path along several branches):
    "objs": _I64,  # one entry per object at this path, so per object walked into for "path.key"
    "stop": _I64,  # a scalar or null here: a longer path's branch stops short (is "missing")
}


# the value array beside each row array that has one
_VALUES = {"nrow": "nval", "srow": "scode", "brow": "bval"}

# one append batch for one path: Python lists named like _DTYPES, plus "sval" (the strings)
_Pending = dict[str, list[Any]]
_PENDING_KEYS = (*_DTYPES, "sval")


class _Column:
    """Chunked typed arrays for one path plus lazily built contiguous views."""

    __slots__ = ("_arrays", "_eq", "_eq_uses", "_order", "_srank", "chunks", "dups", "vocab")

    def __init__(self) -> None:
        self.chunks: dict[str, list[np.ndarray]] = {name: [] for name in _DTYPES}
        self.vocab: dict[str, int] = {}
        self.dups: set[str] = set()  # row arrays holding a label twice (lists in a document)
        self._arrays: dict[str, np.ndarray] | None = None
        self._order: tuple[list[str], list[int]] | None = None
        self._srank: np.ndarray | None = None
        self._eq: dict[str, EqIndex] = {}  # "nrow" / "srow": equality index (eqindex)
        self._eq_uses = 0

    def add(self, p: _Pending) -> None:
        vocab = self.vocab
        p["scode"] = [vocab.setdefault(s, len(vocab)) for s in p["sval"]]
        for name in _DTYPES:
            self._add(name, p[name])
        self._arrays = self._order = self._srank = None

    def _add(self, name: str, values: list[Any]) -> None:
        if values:
            try:
                arr = np.array(values, dtype=_DTYPES[name])
            except OverflowError:  # "nval": an int beyond float range, ignored like NaN
                arr = np.array([math.nan if abs(v) > 1e308 else v for v in values])
            self._add_array(name, arr)

    def relabelled(self, new_of: np.ndarray) -> _Column | None:
        """A copy holding the entries of the rows that ``new_of`` keeps (old label -> new,
        -1: dropped) under their new labels, and only the strings they use; None if no row
        is kept."""
        a = self.arrays()
        out = _Column()
        for name, rows in a.items():
            if name in _VALUES.values() or not len(rows):
                continue
            new = new_of[rows]
            keep = new >= 0
            out._add_array(name, new[keep])
            if name in _VALUES:
                out._add_array(_VALUES[name], a[_VALUES[name]][keep])
        if not out.chunks["present"]:
            return None
        codes = out.arrays()["scode"]
        used = np.unique(codes)  # the old codes still in use, in insertion order
        keys = list(self.vocab)
        out.vocab = {keys[c]: i for i, c in enumerate(used.tolist())}
        out.chunks["scode"] = [np.searchsorted(used, codes)] if len(codes) else []
        out._arrays = None
        return out

    def _add_array(self, name: str, arr: np.ndarray) -> None:
        if len(arr):
            self.chunks[name].append(arr)
            # a document's entries are contiguous, and no label is appended twice
            if name.endswith("row") and (arr[1:] == arr[:-1]).any():
                self.dups.add(name)

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            out = {}
            for name, lst in self.chunks.items():
                if len(lst) > 1:
                    lst[:] = [np.concatenate(lst)]
                out[name] = lst[0] if lst else np.empty(0, dtype=_DTYPES[name])
            self._arrays = out
        return self._arrays

    def equal_rows(self, kind: str, keys: list[Any], build: bool = True) -> np.ndarray | None:
        """Rows of the entries of ``kind`` (``nrow``: numbers, ``srow``: strings, as codes)
        equal to one of ``keys``, through the column's equality index; None while it has none
        (``build``: count this lookup, building the index from the EQ_INDEX_AFTER-th on)."""
        a = self.arrays()
        rows, values = a[kind], a[_VALUES[kind]]
        if not len(values):
            return rows
        index = self._eq.get(kind)
        if stale(index, len(values)):
            if not build:
                return None
            self._eq_uses += 1
            if self._eq_uses < EQ_INDEX_AFTER:
                return None
            index = self._eq[kind] = EqIndex.build(rows, values)
        assert index is not None
        want = np.asarray(keys, dtype=values.dtype)
        found = index.find(want)
        if index.covered < len(values):  # entries appended since it was built
            tail = values[index.covered :]
            hit = tail == want[0] if len(want) == 1 else np.isin(tail, want)
            found.append(rows[index.covered :][hit])
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def string_ranks(self) -> tuple[list[str], list[int], np.ndarray]:
        """(vocab keys, codes sorted by string, rank of every string entry); cached."""
        if self._order is None or self._srank is None:
            keys = list(self.vocab)
            order = sorted(range(len(keys)), key=keys.__getitem__)
            rank_of_code = np.empty(len(keys), dtype=np.int64)
            rank_of_code[np.asarray(order, dtype=np.int64)] = np.arange(len(keys))
            self._order = (keys, order)
            self._srank = rank_of_code[self.arrays()["scode"]]
        return self._order[0], self._order[1], self._srank


_NORMALIZE: tuple[tuple[Any, Any], ...] = (
    ((bool, np.bool_), bool),
    (str, str),
    (numbers.Integral, int),
    (numbers.Real, float),
    (Mapping, dict),
    ((list, tuple), list),
)


_SCALAR_TYPES = frozenset((str, int, float, bool, type(None)))


def _is_container(v: Any) -> bool:
    """Does the walk continue into ``v`` (an object or a list after normalisation)?"""
    return isinstance(v, (Mapping, list, tuple))


def _normalize(v: Any) -> Any:
    """Map uncommon value types onto the JSON ones; unknown types become ``...`` (no value)."""
    for types, convert in _NORMALIZE:
        if isinstance(v, types):
            return convert(v)
    return ...


_CMP = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}


class MetadataColumns:
    """Append-only columnar store of metadata for integer row labels 0..n-1 (labels may have gaps;
    a label never appended behaves as metadata {}). :meth:`relabelled` copies it without the
    rows of dropped labels, so its memory can follow the rows in use."""

    def __init__(self) -> None:
        self._cols: dict[str, _Column] = {}
        self._count = 0
        self._width = 0  # max label + 1
        self._holes: dict[str, np.ndarray] = {}  # path -> rows with a branch missing its last key

    def __len__(self) -> int:
        return self._count

    def append(self, rows: np.ndarray, metadatas: Sequence[dict[str, Any] | None]) -> None:
        labels = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(labels) != len(metadatas):
            raise ValueError(f"{len(labels)} row labels for {len(metadatas)} metadata documents")
        if not len(labels):
            return
        if labels.min() < 0:
            raise ValueError("row labels must be non-negative")
        pend: dict[str, _Pending] = {}
        get = pend.get

        def walk(row: int, doc: Mapping[Any, Any], prefix: str, holder: _Pending | None) -> None:
            # ``holder``: the batch of the path holding ``doc`` when below a list of objects
            fan = holder is not None
            if holder is not None:
                holder["objs"].append(row)
            for k, v in doc.items():
                path = prefix + (k if type(k) is str else str(k))
                p = get(path)
                if p is None:
                    p = pend[path] = {name: [] for name in _PENDING_KEYS}
                p["present"].append(row)
                if fan:
                    t = type(v)
                    if t in _SCALAR_TYPES or not (t is dict or t is list or _is_container(v)):
                        p["stop"].append(row)
                put(p, row, v, path, False, fan)

        def put(p: _Pending, row: int, v: Any, path: str, in_list: bool, fan: bool) -> None:
            t = type(v)
            if t is str:
                p["srow"].append(row)
                p["sval"].append(v)
            elif t is int or t is float:
                p["nrow"].append(row)
                p["nval"].append(v)
            elif t is bool:
                p["brow"].append(row)
                p["bval"].append(v)
            elif v is None:
                p["null"].append(row)
            elif t is dict:
                walk(row, v, path + ".", p if fan or in_list else None)
            elif t is list:
                if not in_list:  # lists nested in lists are not traversed
                    for e in v:
                        put(p, row, e, path, True, fan)
            elif v is not ...:
                n = _normalize(v)
                if n is not ...:
                    put(p, row, n, path, in_list, fan)

        for row, md in zip(labels.tolist(), metadatas):
            if md is None:
                continue
            if not isinstance(md, Mapping):
                raise InvalidRequest(f"metadata must be an object, got {_tname(md)}")
            walk(row, md, "", None)

        for path, p in pend.items():
            col = self._cols.get(path)
            if col is None:
                col = self._cols[path] = _Column()
            col.add(p)
        self._count += len(labels)
        self._width = max(self._width, int(labels.max()) + 1)
        self._holes.clear()

    def relabelled(self, new_of: np.ndarray) -> MetadataColumns:
        """A copy holding only the rows that ``new_of`` keeps (``new_of[old label]``: the new
        label, -1 to drop the row), under their new labels, with the paths and strings that
        those rows use. Filters match the same documents under the new labels."""
        new_of = np.asarray(new_of, dtype=np.int64)
        if len(new_of) < self._width:
            raise ValueError("relabelled: new_of must cover every appended label")
        out = MetadataColumns()
        for path, col in self._cols.items():
            kept = col.relabelled(new_of)
            if kept is not None:
                out._cols[path] = kept
        kept_labels = new_of[: self._width]
        kept_labels = kept_labels[kept_labels >= 0]
        out._count = len(kept_labels)  # a kept label counts as appended
        out._width = int(kept_labels.max()) + 1 if len(kept_labels) else 0
        return out

    def nbytes(self) -> int:
        """Bytes held by the columns' arrays and equality indexes (not the vocabularies'
        strings)."""
        return sum(
            arr.nbytes for col in self._cols.values() for lst in col.chunks.values() for arr in lst
        ) + sum(ix.nbytes() for col in self._cols.values() for ix in col._eq.values())

    def evaluate(self, node: FilterNode | None, n_rows: int) -> np.ndarray:
        """Bool mask of length ``n_rows``; ``None`` matches everything."""
        if n_rows < 0:
            raise ValueError("n_rows must be non-negative")
        if node is None:
            return np.ones(n_rows, dtype=np.bool_)
        width = max(n_rows, self._width)
        mask = self._eval(node, width)
        return mask if width == n_rows else mask[:n_rows].copy()

    def lookup(self, node: FilterNode, width: int, most: int) -> np.ndarray | None:
        """The labels below ``width`` that ``node`` matches, ascending and distinct, found
        through the columns' equality indexes when it is their kind of filter (eqindex.lookup);
        None otherwise: :meth:`evaluate` answers it."""
        return lookup(self._cols.get, node, width, most)

    # ------------------------------------------------------------------ evaluation

    def _eval(self, node: FilterNode, width: int) -> np.ndarray:
        if isinstance(node, And):
            mask = np.ones(width, dtype=np.bool_)
            for child in node.children:
                mask &= self._eval(child, width)
            return mask
        if isinstance(node, Or):
            mask = np.zeros(width, dtype=np.bool_)
            for child in node.children:
                mask |= self._eval(child, width)
            return mask
        if isinstance(node, Not):
            mask = self._eval(node.child, width)
            return np.logical_not(mask, out=mask)
        if isinstance(node, Exists):
            mask = self._present(node.path, width)
            return mask if node.exists else np.logical_not(mask, out=mask)
        if isinstance(node, Cmp):
            op = node.op
            if op in ("eq", "ne"):
                mask = self._match_any(node.path, (node.value,), width)
            elif op in ("in", "nin"):
                mask = self._match_any(node.path, tuple(node.value), width)
            elif op in _CMP:
                mask = self._match_range(node.path, op, node.value, width)
            else:
                raise InvalidRequest(f"filter: unknown comparison {op!r} on {node.path!r}")
            return np.logical_not(mask, out=mask) if op in ("ne", "nin") else mask
        if isinstance(node, Pattern):
            return self._match_pattern(node, width)
        raise InvalidRequest(f"filter: unsupported node {type(node).__name__}")

    def _match_pattern(self, node: Pattern, width: int) -> np.ndarray:
        """Rows with a string at the path that the regex finds a match in (or that holds the
        substring): tested once per distinct string of the path's vocabulary."""
        mask = np.zeros(width, dtype=np.bool_)
        col = self._cols.get(node.path)
        if col is None or not col.vocab:
            return mask
        if node.kind == "regex":
            search = compiled(node.text).search
            lut = np.fromiter((search(s) is not None for s in col.vocab), np.bool_, len(col.vocab))
        else:
            text = node.text
            lut = np.fromiter((text in s for s in col.vocab), np.bool_, len(col.vocab))
        a = col.arrays()
        _scatter(mask, a["srow"], lut[a["scode"]], "srow" not in col.dups)
        return mask

    def _present(self, path: str, width: int) -> np.ndarray:
        mask = np.zeros(width, dtype=np.bool_)
        col = self._cols.get(path)
        if col is not None:
            mask[col.arrays()["present"]] = True
        return mask

    def _match_any(self, path: str, values: tuple[Any, ...], width: int) -> np.ndarray:
        """Rows where the path equals any of ``values`` (None = missing or null)."""
        has_null = any(v is None for v in values)
        mask = ~self._present(path, width) if has_null else np.zeros(width, dtype=np.bool_)
        col = self._cols.get(path)
        if col is None:
            return mask
        a = col.arrays()
        if has_null:
            mask[a["null"]] = True
            self._mark_missing_branches(path, mask)
        nums = [float(v) for v in values if _is_num(v)]
        if nums and len(a["nval"]):
            found = col.equal_rows("nrow", nums)
            if found is not None:
                mask[found] = True
            else:
                hit = a["nval"] == nums[0] if len(nums) == 1 else np.isin(a["nval"], nums)
                _scatter(mask, a["nrow"], hit, "nrow" not in col.dups)
        codes = [col.vocab[v] for v in values if isinstance(v, str) and v in col.vocab]
        found = col.equal_rows("srow", codes) if codes else None
        if found is not None:
            mask[found] = True
        elif len(codes) == 1:
            _scatter(mask, a["srow"], a["scode"] == codes[0], "srow" not in col.dups)
        elif codes:
            lut = np.zeros(len(col.vocab), dtype=np.bool_)
            lut[codes] = True
            _scatter(mask, a["srow"], lut[a["scode"]], "srow" not in col.dups)
        bools = {v for v in values if isinstance(v, bool)}
        if bools and len(a["bval"]):
            hit = a["bval"] == bools.pop() if len(bools) == 1 else np.ones_like(a["bval"])
            _scatter(mask, a["brow"], hit, "brow" not in col.dups)
        return mask

    def _mark_missing_branches(self, path: str, mask: np.ndarray) -> None:
        """Set rows where some branch of the walk along ``path`` stops short: an object walked
        into lacks the next key, or a scalar or null sits where an object would continue it."""
        segments = path.split(".")
        parent: _Column | None = None
        for i in range(1, len(segments) + 1):
            prefix = ".".join(segments[:i])
            col = self._cols.get(prefix)
            if col is not None:
                if parent is not None:
                    mask[self._missing_key(prefix, parent, col)] = True
                if i < len(segments):
                    mask[col.arrays()["stop"]] = True
            parent = col

    def _missing_key(self, path: str, parent: _Column, col: _Column) -> np.ndarray:
        """Rows where fewer objects at the parent path hold the last key of ``path`` than there
        are such objects (only objects below a list of objects are counted); cached."""
        rows = self._holes.get(path)
        if rows is None:
            objs = parent.arrays()["objs"]
            if len(objs):
                held = np.bincount(col.arrays()["present"], minlength=self._width)
                rows = np.flatnonzero(np.bincount(objs, minlength=self._width) > held)
            else:
                rows = np.empty(0, dtype=np.int64)
            self._holes[path] = rows
        return rows

    def _match_range(self, path: str, op: str, value: Any, width: int) -> np.ndarray:
        mask = np.zeros(width, dtype=np.bool_)
        col = self._cols.get(path)
        if col is None:
            return mask
        a = col.arrays()
        if _is_num(value):
            hit = _CMP[op](a["nval"], float(value))
            _scatter(mask, a["nrow"], hit, "nrow" not in col.dups)
        elif isinstance(value, str) and len(a["scode"]):
            keys, order, srank = col.string_ranks()
            bisect = bisect_right if op in ("gt", "lte") else bisect_left
            cut = bisect(order, value, key=keys.__getitem__)
            hit = srank >= cut if op in ("gt", "gte") else srank < cut
            _scatter(mask, a["srow"], hit, "srow" not in col.dups)
        return mask


def _scatter(mask: np.ndarray, rows: np.ndarray, hit: np.ndarray, unique: bool) -> None:
    """``mask[rows[hit]] = True``; with unique rows and many hits an in-place OR is quicker."""
    if unique and np.count_nonzero(hit) * 8 > len(hit):
        mask[rows] |= hit
    else:
        mask[rows[hit]] = True
