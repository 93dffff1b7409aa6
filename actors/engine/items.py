"""Per-shard item table: string ids <-> integer labels, metadata, contents, liveness.

Labels are integers handed out in order and never reused, so every per-item column is a numpy
array indexed by label and lookups for a whole result block are single gathers. Replaced and
deleted items leave dead rows behind; :meth:`ItemTable.relabelled` copies the table onto a dense
range of labels (actors.engine.compaction decides when).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from actors.engine.filters import FilterNode, MetadataColumns
from actors.engine.fulltext import FieldIndex, TextIndex
from actors.engine.idmap import IdMap
from actors.engine.idorder import IdOrder
from actors.engine.selection import GENERATIONS
from actors.engine.strings import StringBlock, StringColumn
from actors.storage.codec import pack_strings, unpack_strings

LOOKUP_SHARE = 16  # filters matching at most 1/16 of the labels are looked up, not scanned
COLUMN_BUILD_ROWS = 65_536  # items parsed at a time when the filter columns are first built


def _grow(arr: np.ndarray, size: int) -> np.ndarray:
    if size <= len(arr):
        return arr
    new = np.empty(max(size, 2 * len(arr), 1024), dtype=arr.dtype)
    if arr.dtype == object:
        new[:] = None
    elif arr.dtype == bool:
        new[:] = False
    else:
        new[:] = 0
    new[: len(arr)] = arr
    return new


class ItemTable:
    def __init__(self) -> None:
        self.next_label = 0
        self.ids = StringColumn()  # packed: search results gather ids as bytes, not objects
        self.id_map = IdMap(self.ids.get)  # id -> label, checked against the stored ids
        self.metadata = np.empty(0, dtype=object)  # orjson bytes or None
        self.contents = np.empty(0, dtype=object)  # str or None
        self.norms = np.empty(0, dtype=np.float32)  # original norms (cosine indexes)
        self.alive = np.empty(0, dtype=bool)
        # The filter columns: built from the metadata on first use (a filter), then kept up
        # to date; a loaded partition that is only searched without filters never builds them.
        self._columns: MetadataColumns | None = None
        self._columns_lock = threading.Lock()  # readers share the shard's lock; one builds
        self.text = TextIndex()  # full-text postings, per field on first use
        self.id_order: IdOrder | None = None  # live labels by id, for cursors (on first use)
        self.generation = next(GENERATIONS)  # a new one at every change (actors.engine.selection)

    def __len__(self) -> int:
        return len(self.id_map)

    def find(self, ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
        """The ids that exist, in the given order, and their labels (one lookup)."""
        labels = self.id_map.lookup(ids)
        ok = labels >= 0
        return [i for i, f in zip(ids, ok.tolist()) if f], labels[ok]

    def present(self, ids: Sequence[str]) -> list[str]:
        """The ids that exist, in the given order."""
        return self.find(ids)[0]

    def all_ids(self) -> list[str]:
        return self.ids_of(self.live_labels())

    def ids_of(self, labels: np.ndarray) -> list[str]:
        return [i for i in self.ids.get(labels).flat() if i is not None]

    def order(self, labels: np.ndarray, path: str, ascending: bool) -> list[tuple[Any, str]]:
        """``(sort key, id)`` of ``labels`` ordered by the metadata value at dot ``path``, in
        MongoDB's type order: missing and null, then numbers, strings, objects, arrays,
        booleans; descending reverses it. Ties go by id."""
        ids = self.ids_of(labels)
        keys = [sort_key(self.metadata[label], path) for label in labels.tolist()]
        pairs = sorted(zip(keys, ids), reverse=not ascending)
        return pairs

    def matching(self, node: FilterNode | None) -> np.ndarray:
        """Labels of the live items that ``node`` matches (every live item when None)."""
        if node is None:
            return self.live_labels()
        found = self._looked_up(node)
        if found is not None:
            return found
        mask = self.columns.evaluate(node, self.next_label) & self.alive[: self.next_label]
        return np.flatnonzero(mask).astype(np.int64)

    def page(self, node: FilterNode | None, after: str, limit: int) -> list[str]:
        """The first ``limit`` ids above ``after``, in id order, of the live items ``node``
        matches (every live item when None): one page of a cursor's scan."""
        n = self.next_label
        order = self.id_order
        if order is None or order.stale(n):
            live = self.live_labels()
            order = self.id_order = IdOrder(live, self.ids_of(live), n)
        allowed = self.alive[:n]
        if node is not None:
            allowed = self.columns.evaluate(node, n) & allowed
        return order.page(allowed, after, limit, self._id_of, self.ids_of)

    def _id_of(self, label: int) -> str:
        found = self.ids.get(np.array([label], dtype=np.int64)).flat()[0]
        assert found is not None, "a live label has an id"
        return found

    def text_field(self, path: str) -> FieldIndex:
        """The full-text postings of the metadata field at ``path`` (built on first use)."""
        n = self.next_label
        return self.text.field(path, self.metadata[:n], self.alive[:n])

    def insert(
        self,
        ids: Sequence[str],
        metadata: Sequence[bytes | None],
        contents: Sequence[str | None],
        norms: np.ndarray | None,
        labels: np.ndarray | None = None,
        packed_ids: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add items under fresh labels (or the given ones, when restoring a snapshot, with
        the ids as it packed them).

        Returns (new labels, labels of replaced items that must leave the vector index).
        """
        n = len(ids)
        if len(set(ids)) != n:  # before any change: the table stays as it was
            raise ValueError("ItemTable.insert: ids must be distinct")
        self.generation = next(GENERATIONS)
        replaced = self.id_map.remove(ids) if len(self.id_map) else np.zeros(0, dtype=np.int64)
        if len(replaced):
            self.alive[replaced] = False
            self.ids.clear(replaced)
            self.text.remove(replaced)
        if labels is None:
            labels = np.arange(self.next_label, self.next_label + n, dtype=np.int64)
        end = int(labels.max()) + 1 if n else self.next_label
        self.next_label = max(self.next_label, end)
        self._reserve(self.next_label)
        self.ids.set(labels, ids, packed_ids)
        self.ids.compact()
        self.metadata[labels] = list(metadata)
        self.contents[labels] = list(contents)
        if norms is not None:
            self.norms[labels] = norms
        self.alive[labels] = True
        self.id_map.add(ids, labels)
        if self._columns is not None or self.text.fields:
            parsed = [None if m is None else orjson.loads(m) for m in metadata]
            if self._columns is not None:
                self._columns.append(labels, parsed)
            self.text.add(labels.tolist(), parsed)
        return labels, replaced

    @property
    def columns(self) -> MetadataColumns:
        """The filter columns of the live items (built now, from their metadata, if this is
        their first use)."""
        built = self._columns
        if built is None:
            with self._columns_lock:
                built = self._columns
                if built is None:
                    built = MetadataColumns()
                    live = np.flatnonzero(self.alive[: self.next_label])
                    for start in range(0, len(live), COLUMN_BUILD_ROWS):
                        rows = live[start : start + COLUMN_BUILD_ROWS]
                        blobs = self.metadata[rows].tolist()
                        built.append(rows, [None if m is None else orjson.loads(m) for m in blobs])
                    self._columns = built
        return built

    def _reserve(self, size: int) -> None:
        """Room for labels below ``size`` in every per-label array."""
        self.metadata = _grow(self.metadata, size)
        self.contents = _grow(self.contents, size)
        self.norms = _grow(self.norms, size)
        self.alive = _grow(self.alive, size)

    def remove(self, ids: Sequence[str]) -> np.ndarray:
        labels = self.id_map.remove(ids)
        if len(labels):
            self.generation = next(GENERATIONS)
            self.alive[labels] = False
            self.ids.clear(labels)
            self.ids.compact()
            self.text.remove(labels)
        return labels

    def live_labels(self) -> np.ndarray:
        return np.flatnonzero(self.alive[: self.next_label]).astype(np.int64)

    def selection(self, node: FilterNode | None) -> tuple[np.ndarray | None, int]:
        """(packed bitmap of the labels a query may return, how many live items match).

        No filter: (None, every live item). The filter is evaluated once for both.
        """
        return self.select(node)[:2]

    def select(self, node: FilterNode | None) -> tuple[np.ndarray | None, int, np.ndarray | None]:
        """:meth:`selection`, and the matching live labels (ascending) when the filter was
        answered by the columns' equality indexes without a pass over every label
        (MetadataColumns.lookup: a filter matching at most 1 / LOOKUP_SHARE of them)."""
        if node is None:
            return None, len(self), None
        n = self.next_label
        found = self._looked_up(node)
        if found is None:
            mask = self.columns.evaluate(node, n) & self.alive[:n]
            return np.packbits(mask, bitorder="little"), int(mask.sum()), None
        mask = np.zeros(n, dtype=bool)
        mask[found] = True
        labels = found.astype(np.int32) if n < 2**31 else found  # kept with the selection
        return np.packbits(mask, bitorder="little"), len(found), labels

    def _looked_up(self, node: FilterNode) -> np.ndarray | None:
        """The live labels ``node`` matches, ascending, when the columns' equality indexes
        find them (MetadataColumns.lookup, at most 1 / LOOKUP_SHARE of the labels); else None."""
        n = self.next_label
        found = self.columns.lookup(node, n, n // LOOKUP_SHARE)
        return None if found is None else found[self.alive[found]]

    # -- compaction (actors.engine.compaction) ----------------------------------------------------
    def dead_rows(self) -> int:
        """Labels handed out whose items were since replaced or deleted."""
        return self.next_label - len(self)

    def relabelled(self) -> tuple[ItemTable, np.ndarray]:
        """A copy holding the live items under labels 0..n-1, in their label order, with
        every per-label array exactly n long; and ``new_of``, each old label's new label
        (-1 for the dead rows). The copy answers every lookup, filter and gather as this
        table does, through ``new_of``; this table is left as it is."""
        live = self.live_labels()
        n = len(live)
        new_of = np.full(self.next_label, -1, dtype=np.int64)
        new_of[live] = np.arange(n, dtype=np.int64)
        out = ItemTable()
        out.next_label = n
        out.ids = self.ids.relabelled(live)
        out.id_map = self.id_map.relabelled(new_of, out.ids.get)
        out.metadata = self.metadata[live]
        out.contents = self.contents[live]
        out.norms = self.norms[live]
        out.alive = np.ones(n, dtype=bool)
        out._columns = None if self._columns is None else self._columns.relabelled(new_of)
        out.text = self.text.relabelled(new_of)
        return out, new_of

    def nbytes(self) -> int:
        """Bytes of the per-label arrays, the id map and the filter columns (the metadata and
        contents arrays count their references, not the objects)."""
        arrays = (self.metadata, self.contents, self.norms, self.alive)
        return (
            sum(a.nbytes for a in arrays)
            + self.ids.nbytes()
            + self.id_map.nbytes()
            + (0 if self._columns is None else self._columns.nbytes())
            + self.text.nbytes()
        )

    # -- snapshots --------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        labels = self.live_labels()
        ids = self.ids.get(labels)
        ids_blob, ids_len = ids.blob, ids.lens.astype(np.int64)
        meta_blob, meta_len = pack_strings(self.metadata[labels].tolist())
        cont_blob, cont_len = pack_strings(self.contents[labels].tolist())
        return {
            "labels": labels,
            "ids_blob": ids_blob,
            "ids_len": ids_len,
            "meta_blob": meta_blob,
            "meta_len": meta_len,
            "contents_blob": cont_blob,
            "contents_len": cont_len,
            "norms": self.norms[labels],
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], next_label: int) -> ItemTable:
        table = cls()
        labels = arrays["labels"].astype(np.int64)
        table.insert(
            unpack_strings(arrays["ids_blob"], arrays["ids_len"]),
            unpack_strings(arrays["meta_blob"], arrays["meta_len"], as_bytes=True),
            unpack_strings(arrays["contents_blob"], arrays["contents_len"]),
            arrays["norms"].astype(np.float32),
            labels=labels,
            packed_ids=(arrays["ids_blob"], arrays["ids_len"]),
        )
        table.next_label = max(table.next_label, next_label)
        table._reserve(table.next_label)  # labels above the last live one were handed out too
        return table

    def gather_ids(self, labels: np.ndarray) -> StringBlock:
        """The ids of ``labels`` (any shape); label -1 (no result) maps to None."""
        return self.ids.get(labels)

    def gather(self, labels: np.ndarray, column: str) -> np.ndarray:
        """Per-label values of an object column; label -1 (no result) maps to None."""
        values: Any = getattr(self, column)
        out = np.empty(labels.shape, dtype=object)
        ok = labels >= 0
        out[ok] = values[labels[ok]]
        return out


def sort_key(blob: bytes | None, path: str) -> tuple[int, Any]:
    """The sort key of one item's metadata value at ``path`` (see ItemTable.order)."""
    value: Any = None if blob is None else orjson.loads(blob)
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (5, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    # Objects before arrays, as MongoDB orders them; within each, by their JSON text (MongoDB
    # compares an array by its elements).
    return (3 if isinstance(value, dict) else 4, orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
