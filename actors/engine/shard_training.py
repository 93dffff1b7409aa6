"""A shard's side of training: every item re-inserted into lists from a new template, swapped in
atomically while reads and writes go on. actors.engine.shard.Shard inherits it.

A partition whose new lists hold compressed codes (``ivf``, ``ivfpq``) keeps its items' full
vectors sealed on local disk (actors.engine.fullvectors) for reranking: they come from the
flat lists an untrained index holds, or from the file of the previous training, never from
codes. A partition trained before it kept full vectors has none to keep, and stays without.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from actors.engine.fullvectors import BLOCK_ROWS, FullVectors
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex
from actors.engine.rwlock import RWLock
from actors.engine.shard_log import ShardLog
from actors.process import heap
from actors.storage import codec
from actors.types import ShardStats


class ShardTraining:
    items: ItemTable
    partition: PartitionIndex | None
    vectors: FullVectors | None
    vector_dir: str
    version: int
    nprobe_table: tuple[tuple[int, int], ...]
    log: ShardLog
    _lock: RWLock
    _snapshot_lock: threading.Lock
    _pending: list[tuple[str, Any]] | None
    _ensure_loaded: Callable[[bytes], None]
    _capture: Callable[[], codec.Frame]
    _wrote: Callable[[], None]
    stats: Callable[[bytes], ShardStats]

    def rebuild(
        self,
        key: bytes,
        version: int,
        template: np.ndarray,
        nprobe_table: tuple[tuple[int, int], ...] = (),
        batch_size: int = 65536,
    ) -> ShardStats:
        """Re-insert every item into a fresh index from ``template`` and swap it in atomically."""
        with self._snapshot_lock:
            with self._lock.write():
                self._ensure_loaded(key)
                if self.partition is None or not (self.partition.ntotal or len(self.items)):
                    # No items: later ones go to the new lists (and their full vectors to a
                    # file of their own, made with the first of them).
                    dimension = self.partition.dimension if self.partition is not None else 0
                    self.partition = PartitionIndex.from_template(template, dimension)
                    self.vectors = None
                    self.version, self.nprobe_table = version, tuple(nprobe_table)
                    frame, gen = self._capture(), self.log.roll()  # kept across a reload
                    self.log.write_snapshot(key, frame, gen)
                    return self.stats(key)
                dimension, was_flat = self.partition.dimension, self.partition.is_flat
                alive = self.items.alive[: self.items.next_label].copy()
                if int(alive.sum()) != self.partition.ntotal:
                    raise RuntimeError("the lists do not hold exactly the live items")
                source = self.vectors
                live_end = int(np.flatnonzero(alive)[-1]) + 1 if alive.any() else 0
                if source is not None and source.count < live_end:
                    raise RuntimeError("the full vectors' file does not hold every item")
                labels = vectors = None
                if source is None:
                    labels, vectors = self.partition.entries()
                self._pending = []
            keep: FullVectors | None = None
            try:
                fresh = PartitionIndex.from_template(template, dimension)
                if source is not None:  # the full vectors from their file, a block at a time
                    for start, block in source.blocks(BLOCK_ROWS):
                        rows = np.flatnonzero(alive[start : start + len(block)])
                        fresh.add(rows + start, block[rows])
                    keep = source if not fresh.is_flat else None
                else:
                    assert labels is not None and vectors is not None
                    # Each list allocated once at its size (PartitionIndex.fill): lists grown
                    # entry by entry reserve up to twice their size and leave outgrown blocks
                    # in the heap.
                    fresh.fill(labels, vectors, batch_size)
                    if was_flat and not fresh.is_flat:  # exact vectors: kept for reranking
                        keep = FullVectors(dimension, self.vector_dir)
                        keep.put(labels, vectors)
                    del vectors
            except BaseException:
                with self._lock.write():  # writes stop queueing for a swap that never comes
                    self._pending = None
                raise
            with self._lock.write():
                if self._pending is None:  # (reloaded meanwhile: the disk refused a write)
                    raise RuntimeError("the partition was reloaded during the rebuild")
                try:
                    for op, arg in self._pending:
                        if op == "remove":
                            fresh.remove(arg)
                        else:
                            fresh.add(*arg)
                            if keep is not None and keep is not source:
                                keep.put(*arg)
                except BaseException:
                    self._pending = None  # the old partition holds every write: it stays
                    raise
                self.partition, self.version, self._pending = fresh, version, None
                self.vectors = keep
                self.nprobe_table = tuple(nprobe_table)
                frame = self._capture()
                gen = self.log.roll()
            self.log.write_snapshot(key, frame, gen)
            del frame
        heap.trim()  # the replaced partition's lists were freed: return their pages
        self._wrote()  # and once more when quiet, for what was freed after this point
        return self.stats(key)
