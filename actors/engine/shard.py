"""Shard: the decrypted IVF partitions, metadata and contents of the items on one shard.

A shard starts locked: it holds nothing until a call carrying the index's data key arrives, then
loads its latest snapshot and replays its write-ahead log. Writes are sealed and appended to the
WAL (durable) before they are applied and acknowledged. The WAL rolls into a new snapshot once it
grows past a bound; training swaps in a rebuilt partition index atomically while reads and
writes continue.

The class is plain Python (unit-testable without Ray); a pool actor (actors.pool) hosts the
partitions of many indexes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson

from actors import constants
from actors.engine import compaction, shard_state, updates
from actors.engine.filters import FilterNode
from actors.engine.fullvectors import FullVectors
from actors.engine.items import ItemTable
from actors.engine.ivf import MAX_NORM, PartitionIndex, too_large
from actors.engine.rwlock import RWLock
from actors.engine.selection import Selections
from actors.engine.shard_backup import ShardBackup
from actors.engine.shard_keys import KeyRotated, ShardKeys
from actors.engine.shard_log import ShardLog
from actors.engine.shard_moves import ShardMoves
from actors.engine.shard_reads import ShardReads
from actors.engine.shard_training import ShardTraining
from actors.errors import IndexRetired, InvalidRequest
from actors.process import heap
from actors.process.cpus import node_cpus
from actors.process.quiet import WhenQuiet
from actors.storage import Store, StoreError, codec, open_store, persistence
from actors.types import ShardStats, UpsertBatch

log = logging.getLogger("vaultvec.shard")


class Shard(ShardReads, ShardBackup, ShardMoves, ShardTraining):
    """One partition (index, shard number); a pool actor (actors.pool) hosts many."""

    def __init__(
        self,
        store: Store | str,
        index_name: str,
        index_id: str,
        shard_no: int,
        *,
        wal_max_records: int = 256,
        wal_max_bytes: int = 256 << 20,
        threads: int = 1,
        snapshot_chunk_bytes: int = constants.SNAPSHOT_CHUNK_BYTES,
        vector_dir: str = "",
    ) -> None:
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.name = index_name
        self.index_id = index_id
        self.shard_no = shard_no
        self.wal_max_records = wal_max_records
        self.wal_max_bytes = wal_max_bytes
        self.snapshot_chunk_bytes = snapshot_chunk_bytes
        self.vector_dir = vector_dir  # where compressed partitions keep full vectors ("": temp)
        self.threads = threads if threads > 0 else node_cpus()
        self._lock = RWLock()  # searches share it; writes, loads and swaps take it alone
        self._snapshot_lock = threading.Lock()
        self._loaded = False
        self._retired = False
        self.last_used = time.monotonic()
        self._quiet = WhenQuiet(self._tidy, f"vaultvec-tidy-{id(self):x}")
        self._reset()

    def _reset(self) -> None:
        self._sized: tuple[tuple[int, int, int], int] | None = None  # resident_bytes' cache
        self.keys = ShardKeys()
        self.log = ShardLog(
            self.store,
            self.name,
            self.index_id,
            self.shard_no,
            self.keys,
            self.wal_max_records,
            self.wal_max_bytes,
            self.snapshot_chunk_bytes,
        )
        self.items = ItemTable()
        self.selections = Selections()  # recent filter evaluations (actors.engine.selection)
        self.partition: PartitionIndex | None = None
        self.vectors: FullVectors | None = None  # compressed lists' full vectors, on disk
        self.version = 0
        self.nprobe_table: tuple[tuple[int, int], ...] = ()
        self._pending: list[tuple[str, Any]] | None = None  # ops arriving during a rebuild

    # -- loading ----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def wal_records(self) -> int:
        """WAL records written since the last snapshot."""
        return self.log.records

    @property
    def seq(self) -> int:
        """The number of the last write applied."""
        return self.log.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.log.seq = value

    def _ensure_loaded(self, key: bytes) -> None:
        self.last_used = time.monotonic()
        if self._loaded:
            self.keys.check(key)
            return
        if self._retired:
            raise IndexRetired(f"index {self.name!r} (id {self.index_id}) was deleted")
        self._reset()
        self.keys.open_epoch(self.store, self.name, self.index_id, self.shard_no, key)
        frame = self.log.snapshot(key)
        if frame is not None:
            self._install(shard_state.restore(frame, self.vector_dir))
        self.log.replay(key, self._replayed)
        self._loaded = True
        heap.trim()  # the snapshot frame, WAL records and outgrown lists were freed

    def _install(self, state: shard_state.State) -> None:
        self.version, self.nprobe_table = state.version, state.nprobe_table
        self.items, self.partition, self.seq = state.items, state.partition, state.seq
        self.vectors = state.vectors

    def _replayed(self, op: str, payload: Any) -> None:
        if isinstance(payload, UpsertBatch):
            payload = shard_state.searchable(payload)
        self._apply(op, payload)

    @contextmanager
    def _reading(self, key: bytes) -> Iterator[None]:
        """Shared access for reads, loading the shard first if it is locked."""
        while True:
            if not self._loaded:
                with self._lock.write():
                    self._ensure_loaded(key)
            with self._lock.read():
                if self._loaded:  # not evicted in between
                    self.keys.check(key)
                    self.last_used = time.monotonic()
                    yield
                    return

    def unload(self) -> bool:
        """Drop the decrypted data (it is all in the store) if nothing uses the partition right
        now: no request, snapshot or training swap in flight. True if it was unloaded."""
        if not self._snapshot_lock.acquire(blocking=False):
            return False
        try:
            with self._lock.try_write() as free:
                busy = self._pending is not None or self.keys.next is not None
                if not free or not self._loaded or busy:
                    return False
                self._loaded = False
                self._reset()
                return True
        finally:
            self._snapshot_lock.release()

    def resident_bytes(self) -> int:
        """An estimate of the memory the loaded partition holds: its lists, and per item the id,
        metadata, contents and the table's fixed columns."""
        if not self._loaded:
            return 0
        # A pass over every item's metadata and contents: computed again only once the
        # partition changed (a write, a compaction or a training swap).
        at = (self.seq, id(self.items), id(self.partition))
        if self._sized is not None and self._sized[0] == at:
            return self._sized[1]
        size = shard_state.footprint(self.items, self.partition)
        self._sized = (at, size)
        return size

    # -- writes -----------------------------------------------------------------------------
    def _wrote(self) -> None:
        """Note a write (or a rebuild): once writes pause for constants.TRIM_AFTER_WRITES_S, memory is
        tidied (:meth:`_tidy`)."""
        self._quiet.poke(constants.TRIM_AFTER_WRITES_S)

    def _tidy(self) -> None:
        """Growing lists and arrays leave their outgrown blocks free inside the heap, where
        glibc keeps them resident: churned lists are laid out afresh, the rows of replaced and
        deleted items compacted away, and the free pages (after what only the cycle collector
        frees) go back to the system (figures: docs/performance.md)."""
        self._lay_out_lists()
        heap.trim(collect=True)

    def _lay_out_lists(self) -> None:
        """Relabel the live items densely once replaced and deleted items' rows pile up
        (actors.engine.compaction), and lay the partition's lists out exactly once writes have churned
        them (PartitionIndex.laid_out): copied while searches go on, swapped in unless a write,
        a load or a training rebuild came meanwhile (the next pause tries again)."""
        with self._lock.read():
            part, items, seq, full = self.partition, self.items, self.seq, self.vectors
            if part is None or self._pending is not None:
                return
            plan = compaction.prepare(items, part)
            lists = part.laid_out() if part.needs_layout() else None
        if plan is None and lists is None:
            return
        # A compressed partition's full vectors are copied under their new labels with no
        # lock held (the records below the plan's labels never change).
        moved = full.relabelled(plan.new_of) if plan is not None and full is not None else None
        with self._lock.write():
            if (
                self.partition is part
                and self.items is items
                and self.seq == seq
                and self._pending is None
            ):
                if lists is not None:
                    part.use_lists(lists)
                if plan is not None:
                    self.items, self.vectors = plan.apply(part), moved

    def _log(self, key: bytes, frame: bytes) -> None:
        """Seal and durably append one WAL record (caller holds the lock); while the key rotates,
        under the next key first, then under the current one (actors.control.rotation)."""
        try:
            self.keys.gate_write(self.store, self.index_id)
        except KeyRotated:
            self._loaded = False  # the next call loads the new epoch with its key
            raise
        try:
            self.log.append(key, frame)
        except Exception:
            if self._pending is None:  # reload from the store: it, not memory, is the truth
                self._loaded = False
            raise

    def upsert(self, key: bytes, batch: UpsertBatch) -> ShardStats:
        bad = too_large(batch.vectors)
        if len(bad):  # the gateway refuses these first; nothing unsearchable is acknowledged
            raise InvalidRequest(
                f"item {batch.ids[bad[0]]!r}: vector norm above {MAX_NORM:.3g} or not finite"
            )

        def check() -> tuple[str, Any]:
            if self.partition is not None and batch.vectors.shape[1] != self.partition.dimension:
                raise InvalidRequest(
                    f"vector dimension {batch.vectors.shape[1]} does not match the index dimension "
                    f"{self.partition.dimension}"
                )
            return "upsert", batch

        self._write(key, check)
        return self.stats(key)

    def delete(self, key: bytes, ids: list[str]) -> int:
        return self.delete_matching(key, None, ids)

    def delete_matching(
        self, key: bytes, node: FilterNode | None, ids: Sequence[str] | None = None
    ) -> int:
        """Delete the items ``node`` matches (every item when None), only among ``ids`` when
        given; durable like every write (one WAL record of the ids, before it is applied).
        Returns how many were deleted."""
        present: list[str] = []

        def chosen() -> tuple[str, Any] | None:
            present.extend(self.items.ids_of(self._matching(node, ids)))
            return ("delete", present) if present else None

        self._write(key, chosen)
        return len(present)

    def update(
        self,
        key: bytes,
        node: FilterNode | None,
        ids: Sequence[str] | None,
        update: updates.Update,
    ) -> int:
        """Apply ``update`` to the items ``node`` matches (every item when None), only among
        ``ids`` when given: their vectors as stored, new metadata (and contents), as one
        upsert written to the WAL before it is applied. Returns how many were updated."""
        count = 0

        def rewritten() -> tuple[str, Any] | None:
            nonlocal count
            labels = self._matching(node, ids)
            if not len(labels) or self.partition is None:
                return None
            count = len(labels)
            return "upsert", self._updated(labels, update)

        self._write(key, rewritten)
        return count

    def _matching(self, node: FilterNode | None, ids: Sequence[str] | None) -> np.ndarray:
        """Labels of the items ``node`` matches (all when None), among ``ids`` when given."""
        if ids is None:
            return self.items.matching(node)
        among = np.unique(self.items.find(ids)[1])  # by id: no pass over every item
        if node is None:
            return among
        return np.intersect1d(self.items.matching(node), among)

    def _write(self, key: bytes, prepare: Callable[[], tuple[str, Any] | None]) -> None:
        """One durable write: under the write lock ``prepare()`` names it, (op, payload) or
        None for nothing to do; it is sealed into the WAL, then applied; the WAL rolls into a
        snapshot past its bound."""
        with self._lock.write():
            self._ensure_loaded(key)
            write = prepare()
            if write is not None:
                op, payload = write
                encode = persistence.encode_upsert if op == "upsert" else persistence.encode_delete
                self._log(key, encode(payload))
                self._apply(op, payload)
                self._wrote()
            roll = self.log.due()
        if roll:
            try:
                self.snapshot(key)
            except (StoreError, IndexRetired) as exc:  # the write is durable: acknowledged
                log.warning(
                    "snapshot of %s shard %d failed (%s); tried again at the next roll",
                    self.name,
                    self.shard_no,
                    exc,
                )

    def _updated(self, labels: np.ndarray, update: updates.Update) -> UpsertBatch:
        """The upsert that rewrites ``labels``'s items with ``update`` applied (every new
        metadata computed, and checked, before anything changes)."""
        assert self.partition is not None
        items = self.items
        found = items.ids_of(labels)
        metadata = []
        for item_id, blob in zip(found, items.metadata[labels].tolist(), strict=True):
            new = orjson.dumps(updates.apply(orjson.loads(blob) if blob else None, update, item_id))
            if update.max_metadata_bytes and len(new) > update.max_metadata_bytes:
                raise InvalidRequest(
                    f"update: item {item_id!r}'s metadata would be {len(new)} bytes as JSON; "
                    f"the limit is {update.max_metadata_bytes} (VAULTVEC_MAX_METADATA_BYTES)"
                )
            metadata.append(new)
        contents = items.contents[labels].tolist()
        if update.set_contents:
            contents = [update.contents] * len(labels)
        norms = items.norms[labels] if items.norms.size and np.any(items.norms[labels]) else None
        return UpsertBatch(
            tuple(found), self._vectors(labels), norms, tuple(metadata), tuple(contents)
        )

    def _apply(self, op: str, payload: Any) -> None:
        if op == "upsert":
            batch: UpsertBatch = payload
            labels, replaced = self.items.insert(
                batch.ids, batch.metadata, batch.contents, batch.norms
            )
            if self.partition is None:
                self.partition = PartitionIndex.from_template(None, batch.vectors.shape[1])
            self.partition.remove(replaced)
            self.partition.add(labels, batch.vectors)
            self._keep_full(labels, batch.vectors, replaced_any=len(replaced) > 0)
            if self._pending is not None:
                self._pending.append(("remove", replaced))
                self._pending.append(("add", (labels, batch.vectors)))
        else:
            labels = self.items.remove(payload)
            if self.partition is not None:
                self.partition.remove(labels)
            if self._pending is not None:
                self._pending.append(("remove", labels))

    def _keep_full(self, labels: np.ndarray, x: np.ndarray, replaced_any: bool) -> None:
        """Seal a compressed partition's new items' full vectors into its file (made with its
        first items). If the disk refuses, the state in memory lacks them: the shard loads
        again from the store, which holds them, on its next call."""
        part = self.partition
        try:
            if self.vectors is None and part is not None and not part.is_flat:
                # Trained before full vectors were kept: only a partition that held nothing
                # before this batch gets a file (a replaced item's vector may be its codes).
                if part.ntotal > len(labels) or replaced_any:
                    return
                self.vectors = FullVectors(part.dimension, self.vector_dir)
            if self.vectors is not None:
                self.vectors.put(labels, x)
        except OSError:
            self._loaded = False
            self._pending = None  # (a rebuild under way then fails rather than swap in a gap)
            raise

    # -- snapshots --------------------------------------------------------------------------
    def snapshot(self, key: bytes) -> None:
        """Roll the WAL into a new snapshot; writes continue into the next WAL generation.

        Skipped when another snapshot or a rebuild (which snapshots itself) is under way.
        """
        if not self._snapshot_lock.acquire(blocking=False):
            return
        try:
            with self._lock.write():
                self._ensure_loaded(key)
                if self._pending is not None:
                    return  # a rebuild is in flight; it snapshots when it swaps
                # Writes that never pause never let the idle tidy compact: do it here, at
                # most once per WAL roll (not where full vectors would be copied under the
                # lock: those wait for a pause).
                plan = compaction.prepare(self.items, self.partition)
                if plan is not None and self.partition is not None and self.vectors is None:
                    self.items = plan.apply(self.partition)
                frame = self._capture()
                gen = self.log.roll()
            self.log.write_snapshot(key, frame, gen)
        finally:
            self._snapshot_lock.release()

    def _capture(self) -> codec.Frame:
        state = shard_state.State(
            self.seq, self.version, self.nprobe_table, self.items, self.partition, self.vectors
        )
        return shard_state.capture(state)

    # -- reads (the searches and lookups: actors.engine.shard_reads) ---------------------
    def stats(self, key: bytes, footprint: bool = False) -> ShardStats:
        """Items and training version; with ``footprint`` also the resident size (a pass over
        the metadata and contents: for describe, not for every write)."""
        with self._reading(key):
            size = self.resident_bytes() if footprint else 0
            return ShardStats(len(self.items), self.version, size)

    # -- key rotation (actors.control.rotation; the key state: actors.engine.shard_keys) ----
    def begin_rotation(self, key: bytes, new_key: bytes, epoch: int) -> None:
        """Step 2 of a rotation to ``epoch``: the whole state as a snapshot under ``new_key``
        into the next epoch, a new WAL generation, and every later record under both keys."""
        with self._snapshot_lock:
            with self._lock.write():
                self._ensure_loaded(key)
                self.keys.begin(key, new_key, epoch)
                frame = self._capture()
                gen = self.log.roll()
            self.log.write_rotation_snapshot(new_key, epoch, frame, gen)

    def commit_rotation(self, epoch: int) -> None:
        """Step 5, after the switch to ``epoch``: write under the next key only. A partition
        loaded under an earlier key (it reloaded during the rotation) drops its state and
        loads the new epoch on its next call."""
        with self._snapshot_lock, self._lock.write():
            if not self.keys.commit(epoch) and self._loaded:
                self._loaded = False
                self._reset()

    def abort_rotation(self, epoch: int) -> None:
        """The rotation to ``epoch`` ended without a switch: write under the current key only."""
        with self._snapshot_lock, self._lock.write():
            self.keys.abort(epoch)

    def retire(self) -> None:
        """Refuse every later call (the index is being deleted) and drop the loaded data.

        Gateways still holding this shard's handle then learn that their view is stale instead
        of reading a deleted index; the control plane kills the actor afterwards.
        """
        with self._snapshot_lock, self._lock.write():
            self._retired = True
            self._loaded = False
            self._reset()
            self._incoming = None  # a restore's chunks, if one was under way

    def ping(self) -> bool:
        return True
