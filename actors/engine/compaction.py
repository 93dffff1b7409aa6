"""Shard memory that follows the live items, not the history of writes.

A shard hands out item labels in order and never reuses them (actors.engine.items): a replaced or
deleted item leaves a dead row in every per-label array (ids, id map, metadata, contents,
norms, liveness, the filter columns, the partition's label -> list map): replacing the same
items a few times doubles a shard's bytes per live item (figures: docs/performance.md).

Compaction relabels the live items onto 0..n-1, keeping their order, once dead rows pile up
(:func:`due`). It runs in two steps so that searches go on meanwhile (Shard._lay_out_lists):

1. :func:`prepare`, under the shard's read lock: a relabelled copy of the item table and the
   map from old labels to new ones (ItemTable.relabelled).
2. :meth:`Compaction.apply`, under the write lock, only if nothing was written, loaded or
   rebuilt since step 1: the partition's ids are rewritten in place (PartitionIndex.relabel,
   an int64 gather per list) and the copy takes the table's place.

Labels never leave a shard and are not in its write-ahead log (records carry ids and vectors);
a snapshot stores the live rows with their labels and ``next_label``, so a snapshot taken after
a compaction holds the dense labels and the WAL written after it replays on top as on any
other. The relabelling keeps the labels' order, so every comparison faiss makes between two
labels (ties between equal distances) comes out as before: search results do not change.
A training rebuild holds labels while it runs (Shard._pending): no compaction while one is
in flight.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from actors import constants
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex

log = logging.getLogger("vaultvec.compaction")


def due(
    items: ItemTable,
    share: float = constants.COMPACT_DEAD_SHARE,
    minimum: int = constants.COMPACT_DEAD_MIN,
) -> bool:
    """Do the dead rows reach ``share`` of all rows and ``minimum``?"""
    dead = items.dead_rows()
    return dead > 0 and dead >= minimum and dead >= share * items.next_label


@dataclass(frozen=True)
class Compaction:
    """A relabelled copy of an item table, ready to take its place."""

    items: ItemTable  # the live items under labels 0..n-1
    new_of: np.ndarray  # old label -> new label, -1 for a dead row
    seconds: float  # time taken to copy it

    def apply(self, partition: PartitionIndex | None) -> ItemTable:
        """Relabel ``partition`` (which must hold exactly the source table's live items) in
        place and return the table that replaces the source. Caller holds the write lock and
        has checked that the source was not changed since :func:`prepare`."""
        start = time.perf_counter()
        if partition is not None:
            partition.relabel(self.new_of)
        log.debug(
            "compacted %d rows to %d: copy %.1f ms, relabel %.1f ms",
            len(self.new_of),
            self.items.next_label,
            self.seconds * 1e3,
            (time.perf_counter() - start) * 1e3,
        )
        return self.items


def prepare(
    items: ItemTable,
    partition: PartitionIndex | None,
    share: float = constants.COMPACT_DEAD_SHARE,
    minimum: int = constants.COMPACT_DEAD_MIN,
) -> Compaction | None:
    """A :class:`Compaction` of ``items`` when one is :func:`due`, else None. Only reads
    ``items`` and ``partition`` (caller holds at least the read lock)."""
    if not due(items, share, minimum):
        return None
    if partition is not None and partition.ntotal != len(items):
        log.warning("compaction skipped: %d items, %d vectors", len(items), partition.ntotal)
        return None
    start = time.perf_counter()
    table, new_of = items.relabelled()
    return Compaction(table, new_of, time.perf_counter() - start)


def compact(items: ItemTable, partition: PartitionIndex | None) -> ItemTable:
    """Relabel now, whatever the dead rows (both steps at once, for a caller holding the
    only reference): the table that replaces ``items``, ``partition`` relabelled in place."""
    table, new_of = items.relabelled()
    if partition is not None:
        partition.relabel(new_of)
    return table
