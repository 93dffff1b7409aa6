"""ShardPool: a long-lived actor hosting the partitions (index, shard number) of any number of
indexes, within a memory budget.

The control plane starts a pool of these per node (actors.pool.placement) and places each index's S
partitions on S different pool actors. A partition is a :class:`~actors.engine.shard.Shard` with its
own key, locks, write-ahead log and snapshots: a wrong key for one index never unlocks another,
and one index's training or heavy query holds only its own locks. Hosting a partition costs
nothing until a request with its key loads it; partitions idle past the TTL, or the least
recently used ones while the actor's resident memory is over its budget, are unloaded again
(everything is in the store, encrypted). A restarted actor reloads its partitions lazily.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import ray

from actors import constants
from actors import metrics as m
from actors.engine.filters import FilterNode
from actors.engine.shard import Shard
from actors.engine.updates import Update
from actors.errors import IndexRetired, PartitionMoved
from actors.pool import channel, wire
from actors.pool.calls import ShardCalls
from actors.pool.moves import PoolMoves
from actors.pool.pool_metrics import PoolMetrics, rss_bytes
from actors.process import heap
from actors.process.cpus import node_cpus
from actors.storage import Store, open_store, persistence
from actors.types import (
    BackupSource,
    Fetched,
    Partition,
    PoolStats,
    SearchRequest,
    SearchResult,
    ShardStats,
    TextHits,
    TextQuery,
    TextStats,
    UpsertBatch,
)

log = logging.getLogger("vaultvec.pool")

# Housekeeping (actors.constants.HOUSEKEEPING_PERIOD_S): a pool actor evicts (when it has a
# budget or a TTL) and, after a whole period without calls, trims its heap once its private
# memory grew by TRIM_GROWTH_BYTES since its last trim. What calls leave free (request and
# result buffers, a search's scratch) and what Ray's own periodic work in the process leaves
# stays resident until a trim; a trim walks the whole heap, so one that can return little is
# not made (figures: docs/performance.md).
#
# Large upserts (over actors.constants.LARGE_UPSERT_BYTES) run on call threads of their own,
# UPSERT_THREADS of them (the concurrency group wire.UPSERT_GROUP, to which
# actors.pool.client.ShardClient sends them). Each of an actor's call threads keeps what Ray
# received for the last call it ran (in Ray's core, not as Python objects), so with pieces on
# every thread the actor's private memory swings with which threads last took one (figures:
# docs/performance.md). Nor does a bulk write hold the threads that the actor's reads, and
# small writes, of any index need.


@dataclass(frozen=True)
class PoolOptions:
    store_url: str
    name: str = ""
    budget_bytes: int = 0  # 0 = no budget
    idle_ttl_s: float = 0.0  # 0 = never
    wal_max_records: int = 256
    snapshot_chunk_bytes: int = constants.SNAPSHOT_CHUNK_BYTES
    vector_dir: str = ""  # where ivf/ivfpq partitions keep full vectors ("": temp)
    threads: int = 0  # 0 = the node's CPUs (actors.process.cpus.node_cpus)


class ShardPool(PoolMoves):
    """Implements actors.pool.client.ShardCalls for the partitions it hosts."""

    def __init__(self, options: PoolOptions) -> None:
        heap.configure()  # one malloc arena, request buffers recycled (see actors.process.heap)
        self.options = options
        self.threads = options.threads or node_cpus()  # for the shards' batches and rebuilds
        self.store: Store = open_store(options.store_url)
        self._lock = threading.Lock()
        self._hosted: dict[tuple[str, int], Shard] = {}
        self._retired: set[str] = set()
        self._moved: set[tuple[str, int]] = set()  # partitions released to another actor
        self._incoming: set[tuple[str, int]] = set()  # partitions moving here, not yet admitted
        self._channel: channel.ChannelServer | None = None
        self._no_channel = False  # none can be made here
        self._evictions = 0
        self._metrics = PoolMetrics(self)
        # Free memory in the heap is given back once the actor goes quiet (housekeep): memory
        # follows the partitions. The calls in flight and since the last pass:
        self._idle = heap.IdleTrim(0, quiet_s=constants.HOUSEKEEPING_PERIOD_S)
        # Private memory after the last trim (or the least since, when it fell without one).
        self._trimmed_at = heap.resident_anon_bytes() or 0
        threading.Thread(
            target=_housekeep, args=(weakref.ref(self),), name="vaultvec-housekeep", daemon=True
        ).start()

    # -- hosting ----------------------------------------------------------------------------
    def _shard(self, partition: Partition | str, placed: bool = True) -> Shard:
        """The hosted partition, made (unloaded) at its first call if the catalog places it
        here (``placed``; a partition moving here is made before the catalog says so)."""
        p = Partition.of(partition)
        slot = (p.index_id, p.shard_no)
        if placed and (slot in self._moved or slot in self._incoming):
            raise PartitionMoved(f"shard {p.shard_no} of index {p.name!r} is moving")
        shard = self._hosted.get(slot)
        if shard is not None:
            return shard
        with self._lock:
            shard = self._hosted.get(slot)
            if shard is None:
                if placed:
                    if slot in self._moved or slot in self._incoming:  # (meanwhile)
                        raise PartitionMoved(f"shard {p.shard_no} of index {p.name!r} is moving")
                    self._check_placed(p)
                elif slot not in self._incoming:  # a warm whose move was called off
                    raise PartitionMoved(f"shard {p.shard_no} of index {p.name!r} is not coming")
                shard = Shard(
                    self.store,
                    p.name,
                    p.index_id,
                    p.shard_no,
                    wal_max_records=self.options.wal_max_records,
                    snapshot_chunk_bytes=self.options.snapshot_chunk_bytes,
                    vector_dir=self.options.vector_dir,
                    threads=self.threads,
                )
                self._hosted[slot] = shard
        return shard

    def _check_placed(self, p: Partition) -> None:
        """Refuse a partition the catalog does not place here: one of a deleted index (a stale
        gateway, a restarted actor) rather than create it empty, and one that moved to another
        actor (this one restarted since) rather than load it beside its new host."""
        if p.index_id in self._retired:
            raise IndexRetired(f"index {p.name!r} (id {p.index_id}) was deleted")
        raw = self.store.get(persistence.meta_key(p.index_id))
        if raw is None:
            raise IndexRetired(f"index {p.name!r} (id {p.index_id}) was deleted")
        here = persistence.read_meta(raw).placement[p.shard_no : p.shard_no + 1]
        if self.options.name and here and here[0] != self.options.name:
            raise PartitionMoved(f"shard {p.shard_no} of index {p.name!r} is placed elsewhere")

    def retire(self, index_id: str) -> None:
        """Refuse every later call for the index (it is being deleted) and drop its partitions.
        Gateways still holding its placement then learn that their view is stale."""
        with self._lock:
            self._retired.add(index_id)
            self._moved = {slot for slot in self._moved if slot[0] != index_id}
            self._incoming = {slot for slot in self._incoming if slot[0] != index_id}
            gone = [slot for slot in self._hosted if slot[0] == index_id]
            shards = [self._hosted.pop(slot) for slot in gone]
        for shard in shards:
            shard.retire()
        if shards:
            heap.trim()

    # -- the partition calls ----------------------------------------------------------------
    @contextmanager
    def _call(self, name: str, shard_no: int = -1) -> Iterator[None]:
        """Around every partition call: counted and timed (PoolMetrics), and seen by the idle
        trim."""
        self._idle.begin()
        try:
            with self._metrics.call(name, shard_no):
                yield
        finally:
            self._idle.end(0)

    def search(self, p: Partition | str, key: bytes, req: SearchRequest) -> SearchResult:
        part = Partition.of(p)
        with self._call("search", part.shard_no):
            return self._shard(part).search(key, req)

    def framed(self, call: bytes, payload: bytes | None = None) -> bytes:
        """A framed call (actors.pool.wire), from a Ray call or the same-node socket."""
        return wire.answer(self, call, payload)

    def upsert(self, p: Partition | str, key: bytes, batch: UpsertBatch) -> ShardStats:
        with self._call("upsert"):
            return self._shard(p).upsert(key, batch)

    def delete(self, p: Partition | str, key: bytes, ids: list[str]) -> int:
        with self._call("delete"):
            return self._shard(p).delete(key, ids)

    def delete_matching(
        self, p: Partition | str, key: bytes, node: FilterNode | None, ids: list[str] | None
    ) -> int:
        with self._call("delete_matching"):
            return self._shard(p).delete_matching(key, node, ids)

    def count_matching(self, p: Partition | str, key: bytes, node: FilterNode | None) -> int:
        with self._call("count_matching"):
            return self._shard(p).count_matching(key, node)

    def update(
        self,
        p: Partition | str,
        key: bytes,
        node: FilterNode | None,
        ids: list[str] | None,
        update: Update,
    ) -> int:
        with self._call("update"):
            return self._shard(p).update(key, node, ids, update)

    def get(
        self,
        p: Partition | str,
        key: bytes,
        ids: list[str],
        vectors: bool,
        metadata: bool,
        contents: bool,
    ) -> Fetched:
        with self._call("get"):
            return self._shard(p).get(key, ids, vectors, metadata, contents)

    def match_ids(
        self,
        p: Partition | str,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None,
        ascending: bool,
        after: str | None = None,
    ) -> list[Any]:
        with self._call("match_ids"):
            return self._shard(p).match_ids(key, node, limit, order_by, ascending, after)

    def text_stats(
        self, p: Partition | str, key: bytes, fields: tuple[str, ...], terms: tuple[str, ...]
    ) -> tuple[TextStats, ...]:
        with self._call("text_stats"):
            return self._shard(p).text_stats(key, fields, terms)

    def text_search(self, p: Partition | str, key: bytes, q: TextQuery) -> TextHits:
        with self._call("text_search"):
            return self._shard(p).text_search(key, q)

    def stats(self, p: Partition | str, key: bytes, footprint: bool) -> ShardStats:
        with self._call("stats"):
            return self._shard(p).stats(key, footprint)

    def sample(self, p: Partition | str, key: bytes, n: int, seed: int) -> Iterator[np.ndarray]:
        """The partition's training sample in :func:`~actors.pool.client.chunks`: a Ray
        generator, each piece passed inside Ray's calls rather than through its object store."""
        with self._call("sample"):
            x = self._shard(p).sample(key, n, seed)
        yield from wire.chunks(x)

    def backup(
        self, p: Partition | str, key: bytes, backup_id: str
    ) -> Iterator[tuple[int, int, bytes]]:
        """The partition's part of a backup in sealed chunks (Shard.backup): a Ray generator."""
        with self._call("backup"):
            chunks = self._shard(p).backup(key, backup_id)
            first = next(chunks)  # the state is taken now, when the call starts
        yield first
        yield from chunks

    def restore_chunk(
        self, p: Partition | str, key: bytes, source: BackupSource, n: int, total: int, chunk: bytes
    ) -> int | None:
        with self._call("restore_chunk"):
            return self._shard(p).restore_chunk(key, source, n, total, chunk)

    def restored(self, p: Partition | str) -> tuple[str, int] | None:
        """(backup id, items) of the backup part this partition installed, if it did."""
        with self._call("restored"):
            return self._shard(p).restored

    def rebuild(
        self,
        p: Partition | str,
        key: bytes,
        version: int,
        template: np.ndarray,
        nprobe_table: tuple[tuple[int, int], ...],
        batch_size: int,
    ) -> ShardStats:
        # Ray caps OMP threads at the actor's (fractional) CPUs; a rebuild's adds use its own.
        with self._call("rebuild"):
            shard = self._shard(p)
            faiss.omp_set_num_threads(shard.threads)
            return shard.rebuild(key, version, template, nprobe_table, batch_size)

    # -- key rotation (actors.control.rotation) ------------------------------------------------------
    def begin_rotation(self, p: Partition | str, key: bytes, new_key: bytes, epoch: int) -> None:
        with self._call("begin_rotation"):
            self._shard(p).begin_rotation(key, new_key, epoch)

    def commit_rotation(self, p: Partition | str, epoch: int) -> None:
        with self._call("commit_rotation"):
            self._shard(p).commit_rotation(epoch)

    def abort_rotation(self, p: Partition | str, epoch: int) -> None:
        with self._call("abort_rotation"):
            self._shard(p).abort_rotation(epoch)

    def ping(self) -> str:
        """The node this actor runs on (the control plane spreads partitions by it)."""
        return node_id()

    def local_channel(self) -> tuple[str, str] | None:
        """(this actor's node, its socket) for gateways on the same node (actors.pool.channel),
        started on first asking; None where no private socket can be made."""
        with self._lock:
            if self._channel is None and not self._no_channel:
                directory = channel.socket_directory()
                try:
                    if directory is None:
                        raise OSError("no private directory for the socket")
                    handlers = {channel.FRAMED: self.framed}
                    self._channel = channel.ChannelServer(handlers, directory)
                except OSError as exc:
                    log.warning("no same-node channel (calls go through Ray): %s", exc)
                    self._no_channel = True
            if self._channel is None:
                return None
            return node_id(), self._channel.path

    # -- memory -----------------------------------------------------------------------------
    def pool_stats(self) -> PoolStats:
        shards = list(self._hosted.values())
        loaded = [s for s in shards if s.loaded]
        return PoolStats(
            name=self.options.name,
            node_id=node_id(),
            budget_bytes=self.options.budget_bytes,
            idle_ttl_s=self.options.idle_ttl_s,
            rss_bytes=rss_bytes(),
            partitions=len(shards),
            loaded=len(loaded),
            loaded_bytes=sum(s.resident_bytes() for s in loaded),
            evictions=self._evictions,
        )

    def metrics(self) -> list[m.Family]:
        """This actor's series (actors.metrics): calls, errors and search time, memory,
        partitions, evictions, restarts, and per index (by id) items, WAL records since the
        last snapshot and partitions loaded."""
        return self._metrics.registry.snapshot()

    def evict(self, now: float | None = None) -> int:
        """Unload the partitions idle past the TTL, then, while resident memory is over the
        budget, the least recently used ones; returns how many were unloaded. Partitions in use
        (a request, snapshot or training swap in flight) are skipped."""
        now = time.monotonic() if now is None else now
        loaded = sorted(
            (s for s in list(self._hosted.values()) if s.loaded), key=lambda s: s.last_used
        )
        ttl, budget = self.options.idle_ttl_s, self.options.budget_bytes
        unloaded = 0
        for shard in loaded:
            if ttl and now - shard.last_used > ttl and shard.unload():
                unloaded += 1
        if budget and rss_bytes() > budget:
            for shard in loaded:
                if not shard.loaded or not shard.unload():
                    continue
                unloaded += 1
                heap.trim(collect=True)
                if rss_bytes() <= constants.BUDGET_HEADROOM * budget:
                    break
        if unloaded:
            self._evictions += unloaded
            heap.trim()
        return unloaded

    def housekeep(self) -> None:
        """One pass of the actor's housekeeping thread (every HOUSEKEEPING_PERIOD_S): drop
        abandoned restores' chunks, evict (with a budget or a TTL), and trim the heap when no call ran since the last pass and
        private memory grew TRIM_GROWTH_BYTES since the last trim (actors.constants)."""
        for shard in list(self._hosted.values()):  # abandoned restores' chunks
            shard.drop_abandoned(constants.RESTORE_IDLE_S)
        if self.options.budget_bytes or self.options.idle_ttl_s:
            self.evict()
        quiet = self._idle.quiet()  # asked every pass, so that it spans a whole period
        resident = heap.resident_anon_bytes() or 0
        # Memory given back otherwise (eviction, a retired index, a shard's own trim) lowers
        # the mark, so that growth is counted from there.
        self._trimmed_at = min(self._trimmed_at, resident)
        if quiet and resident > self._trimmed_at + constants.TRIM_GROWTH_BYTES:
            heap.trim()
            self._trimmed_at = heap.resident_anon_bytes() or 0


def _housekeep(pool_ref: weakref.ref[ShardPool]) -> None:
    """The housekeeping thread: ends with its pool (which it does not keep alive)."""
    while True:
        time.sleep(constants.HOUSEKEEPING_PERIOD_S)
        pool = pool_ref()
        if pool is None:
            return
        try:
            pool.housekeep()
        except Exception:  # never let the loop die; say what, not which data
            log.exception("housekeeping pass failed")
        del pool


def node_id() -> str:
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside Ray (unit tests)
        return "local"


# (Ray takes concurrency groups only where the class is declared remote, not in .options();
# its type stubs do not name the argument.)
PoolActor = ray.remote(concurrency_groups={wire.UPSERT_GROUP: constants.UPSERT_THREADS})(ShardPool)  # type: ignore[call-overload]


def _contract(pool: ShardPool) -> ShardCalls:
    """mypy checks here that ShardPool answers every call of the shard contract."""
    return pool
