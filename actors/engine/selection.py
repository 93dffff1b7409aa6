"""A shard's recent filter evaluations, reused by the queries that repeat a filter.

A filtered search needs the filter's bitmap over the shard's labels, how many live items it
matches, and the matching items per inverted list (actors.engine.adaptive): at 1M items
per shard, a filter matching half of them costs several milliseconds to evaluate and count,
many times the search itself (docs/performance.md). Queries from one application repeat their
filters (a tenant, a category), so the shard keeps the last ``SELECTION_CACHE_ENTRIES``
evaluations, keyed by the filter (its repr, which keeps the types that ``==`` does not), and
drops them all on any change to the items or to the lists: every write, deletion, compaction
and training swap stamps the item table or the partition afresh (:data:`GENERATIONS`).

The bitmaps (and, for a filter looked up by value, its matching labels: at most 1/16 of the
shard's, 4 bytes each) hold which items match, nothing more than the filter columns they were
computed from; they live in the shard's memory only.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from actors import constants

if TYPE_CHECKING:
    from actors.engine.filters import FilterNode
    from actors.engine.items import ItemTable
    from actors.engine.ivf import PartitionIndex

#: Stamps for the item table's and the partition's states: each change takes the next one, so
#: a stamp never comes back, not even on a new table in an old one's place.
GENERATIONS = itertools.count(1)


@dataclass(eq=False)  # one evaluation is itself alone
class Selection:
    """A filter's evaluation on one shard: the packed bitmap of the labels it lets a query
    return (None: no filter) and how many live items match."""

    bits: np.ndarray | None
    matched: int
    owner: Selections | None = field(default=None, repr=False)
    labels: np.ndarray | None = field(default=None, repr=False)  # the matches, when looked up
    key: str = field(default="", repr=False)
    uses: int = 1
    _counts: np.ndarray | None = field(default=None, repr=False)
    _gathered: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def counts(self, part: PartitionIndex) -> np.ndarray:
        """The matching items per inverted list (computed on first use, then kept)."""
        if self._counts is None:
            if self.labels is not None:  # from the matches alone, not a pass over every label
                placed = part.list_of[self.labels[self.labels < len(part.list_of)]]
                self._counts = np.bincount(placed[placed >= 0], minlength=part.nlist)
            else:
                self._counts = part.list_counts(self.bits)
        return self._counts

    def scan_exactly(self, part: PartitionIndex, nq: int, probe_items: float) -> bool:
        """Whether ``nq`` queries under this filter are answered by an exact scan of the
        matching items (:meth:`gathered`) rather than by probing lists: on a flat index, when
        they are no more than ``probe_items`` (what an unfiltered probe computes distances
        for) nor EXACT_SCAN_WORK values, and their vectors are gathered already, or gathering
        them pays: the filter came again, the batch is large, or few lists hold them
        (docs/performance.md has the crossover)."""
        if not self.exact_eligible(part, probe_items):
            return False
        if self._gathered is not None or self.uses > 1 or nq >= constants.EXACT_SCAN_BATCH:
            return True
        return int(np.count_nonzero(self.counts(part))) <= constants.EXACT_SCAN_LISTS

    def exact_eligible(self, part: PartitionIndex, probe_items: float) -> bool:
        """Whether this filter's queries are answered by an exact scan once its vectors are
        gathered (:meth:`scan_exactly` without the question of when to gather)."""
        return (
            self.bits is not None
            and part.is_flat
            and self.matched <= probe_items
            and self.matched * part.dimension <= constants.EXACT_SCAN_WORK
        )

    def gathered(self, part: PartitionIndex) -> tuple[np.ndarray, np.ndarray]:
        """(labels, vectors) of the matching items in the partition, gathered on first use
        and kept (within SELECTION_GATHER_BYTES over the shard's selections)."""
        found = self._gathered
        if found is None:
            assert self.bits is not None
            placed = part.list_of
            if self.labels is not None:
                labels = self.labels[self.labels < len(placed)]
                labels = labels[placed[labels] >= 0]
            else:
                n = min(len(placed), len(self.bits) * 8)
                mask = np.unpackbits(self.bits, count=n, bitorder="little").view(bool)
                labels = np.flatnonzero(mask & (placed[:n] >= 0))
            found = (labels, part.reconstruct(labels))
            if self.owner is not None:
                found = self.owner.keep(self, found)
        return found

    def drop_gathered(self) -> int:
        size = self._gathered[1].nbytes if self._gathered is not None else 0
        self._gathered = None
        return size


class Selections:
    """The last ``entries`` selections of one shard (least recently used dropped first)."""

    def __init__(self, entries: int = constants.SELECTION_CACHE_ENTRIES) -> None:
        self.entries = entries
        self._cache: OrderedDict[str, Selection] = OrderedDict()
        self._stamp: tuple[int, int] = (0, 0)
        self._lock = threading.Lock()  # searches run on several threads at once
        self._gathered_bytes = 0

    def of(
        self, items: ItemTable, part: PartitionIndex | None, node: FilterNode | None
    ) -> Selection:
        if node is None:
            return Selection(None, len(items))
        key = repr(node)
        stamp = (items.generation, part.generation if part is not None else 0)
        with self._lock:
            if stamp != self._stamp:
                self._cache.clear()
                self._gathered_bytes = 0
                self._stamp = stamp
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                hit.uses += 1
                return hit
        bits, matched, labels = items.select(node)
        made = Selection(bits, matched, self, labels, key=key)
        if self.entries <= 0:
            return made
        with self._lock:
            if stamp == self._stamp:  # not made stale by a write meanwhile
                kept = self._cache.get(key)
                if kept is not None:  # another thread's, made meanwhile
                    return kept
                self._cache[key] = made
                while len(self._cache) > self.entries:
                    self._gathered_bytes -= self._cache.popitem(last=False)[1].drop_gathered()
        return made

    def keep(
        self, sel: Selection, found: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keep ``found``, ``sel``'s gathered vectors, if room for them can be made by dropping
        those of the least recently used selections (else ``sel`` gathers again when next
        used); what ``sel`` holds now (another thread's copy, if it kept one first)."""
        nbytes = found[1].nbytes
        with self._lock:
            if sel._gathered is not None:
                return sel._gathered
            if self._cache.get(sel.key) is not sel:  # no longer kept
                return found
            for other in self._cache.values():
                if self._gathered_bytes + nbytes <= constants.SELECTION_GATHER_BYTES:
                    break
                if other is not sel:
                    self._gathered_bytes -= other.drop_gathered()
            if self._gathered_bytes + nbytes <= constants.SELECTION_GATHER_BYTES:
                self._gathered_bytes += nbytes
                sel._gathered = found
            return found
