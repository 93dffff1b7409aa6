"""A shard pool actor's metrics (actors.pool.actor.ShardPool): its calls, and what its
partitions hold when reported."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import ray

from actors import constants
from actors import metrics as m

if TYPE_CHECKING:
    from actors.pool.actor import ShardPool


def rss_bytes() -> int:
    """This process's resident memory."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


EVICTIONS = "partitions unloaded (idle past the TTL or over the memory budget)"
RESTARTS = "restarts of the pool actors (crashes, lost nodes)"
ITEMS = "items per index (partitions not loaded count as last loaded here)"
WAL = "write-ahead log records since the last snapshot, over the loaded partitions"
LOADED = "partitions of the index unlocked in memory"


class PoolMetrics:
    """A pool actor's series: recorded around its partition calls (under a lock: the actor
    runs calls on several threads) and computed from its partitions when reported."""

    def __init__(self, pool: ShardPool) -> None:
        # Not a reference that keeps the pool alive: the pool holds this, and a pool that is
        # dropped (tests, tear-down) frees its partitions and ends its housekeeping at once.
        self._pool = weakref.ref(pool)
        self.registry = m.Registry(threading.Lock())
        self.calls = self.registry.counter(
            "vaultvec_pool_calls_total", "partition calls answered by the shard pool", ("call",)
        )
        self.errors = self.registry.counter(
            "vaultvec_pool_errors_total", "partition calls that failed", ("call", "error")
        )
        self.search_s = self.registry.histogram(
            "vaultvec_shard_search_seconds",
            "one shard's search of a request inside its pool actor, by shard number",
            ("shard",),
            constants.STAGE_BUCKETS,
        )
        self.registry.collector(self.collect)
        self._items: dict[tuple[str, int], int] = {}  # last known items per partition
        self._restarts: int | None = None
        m.export_to_ray(self.registry)

    @contextmanager
    def call(self, name: str, shard_no: int = -1) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except Exception as exc:
            with self.registry.lock:
                self.calls.inc((name,))
                self.errors.inc((name, type(exc).__name__))
            raise
        elapsed = time.perf_counter() - start
        with self.registry.lock:
            self.calls.inc((name,))
            if shard_no >= 0:
                self.search_s.observe((str(shard_no),), elapsed)

    def collect(self) -> list[m.Family]:
        pool = self._pool()
        if pool is None:
            return []
        hosted = list(pool._hosted.items())
        items: dict[str, float] = {}
        wal: dict[str, float] = {}
        loaded: dict[str, float] = {}
        loaded_bytes = 0
        for slot in self._items.keys() - dict(hosted).keys():  # retired partitions
            self._items.pop(slot, None)
        for slot, shard in hosted:
            index = slot[0]
            if shard.loaded:
                self._items[slot] = len(shard.items)
                wal[index] = wal.get(index, 0.0) + shard.wal_records
                loaded[index] = loaded.get(index, 0.0) + 1
                loaded_bytes += shard.resident_bytes()
            items[index] = items.get(index, 0.0) + self._items.get(slot, 0)
        idx = ("index_id",)
        budget = pool.options.budget_bytes
        n_loaded = sum(loaded.values())
        return [
            m.single("vaultvec_pool_actors", "shard pool actors reporting", 1),
            m.single("vaultvec_pool_rss_bytes", "resident memory of the pool actors", rss_bytes()),
            m.single("vaultvec_pool_loaded_bytes", "memory of the loaded partitions", loaded_bytes),
            m.single("vaultvec_pool_budget_bytes", "pool actors' memory budgets (0: none)", budget),
            m.gauge(
                "vaultvec_pool_partitions",
                "partitions hosted by the pool actors, by state",
                ("state",),
                {("loaded",): n_loaded, ("locked",): len(hosted) - n_loaded},
            ),
            m.single("vaultvec_pool_evictions_total", EVICTIONS, pool._evictions, "counter"),
            m.single("vaultvec_pool_restarts_total", RESTARTS, self.restarts(), "counter"),
            m.gauge("vaultvec_index_items", ITEMS, idx, m.keyed(items)),
            m.gauge("vaultvec_index_wal_records", WAL, idx, m.keyed(wal)),
            m.gauge("vaultvec_index_partitions_loaded", LOADED, idx, m.keyed(loaded)),
        ]

    def restarts(self) -> int:
        """How often Ray restarted this actor (read once per incarnation from Ray's actor
        table; 0 outside Ray)."""
        if self._restarts is None:
            self._restarts = 0
            try:
                if not ray.get_runtime_context().was_current_actor_reconstructed:
                    return 0
                from ray._private import state

                info = state.actors(ray.get_runtime_context().get_actor_id())
                self._restarts = int(info.get("NumRestarts", 0))
            except Exception:  # outside Ray, or an actor table without the field
                pass
        return self._restarts
