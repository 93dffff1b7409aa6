"""What the control plane is started with (:class:`EngineOptions`, from serve_app.settings) and
what a gateway caches of an index from it (:class:`IndexView`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.pool.client import ShardClient
from actors.types import IndexConfig, IndexMeta, Partition


@dataclass(frozen=True)
class EngineOptions:
    store_url: str
    shard_num_cpus: float = 0.05
    shard_start_timeout_s: float = 60.0
    retire_timeout_s: float = 30.0
    shard_threads: int = 0  # 0 = the Ray node's CPUs (for batches of queries)
    # Calls one pool actor runs at once, each on its own thread: every thread that ran a call
    # keeps part of its stack resident (docs/performance.md, memory).
    shard_max_concurrency: int = 16
    wal_max_records: int = 256
    auto_train_threshold: int = 10_000
    retrain_factor: float = 4.0
    recall_target: float = 0.95
    idle_ttl_s: float = 0.0
    pool_size: int = 0  # pool actors per node; 0 = one per CPU
    pool_memory_budget_mb: int = 0  # per pool actor; 0 = its share of the node's memory
    train_wait_s: float = 600.0
    train_threads: int = 0  # 0 = all cores of the node
    max_indexes: int = 100_000


@dataclass(frozen=True)
class IndexView:
    """What a gateway caches per index: config, the pool actor hosting each partition (shard
    number order) and the coarse centroids."""

    meta: IndexMeta
    config: IndexConfig
    shards: tuple[Any, ...]
    centroids: np.ndarray | None

    def clients(self) -> list[ShardClient]:
        """Typed calls to each partition, in shard number order."""
        m = self.meta
        return [ShardClient(h, Partition(m.name, m.index_id, s)) for s, h in enumerate(self.shards)]
