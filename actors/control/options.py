"""What the control plane is started with (:class:`EngineOptions`, from serve_app.settings),
what a gateway caches of an index from it (:class:`IndexView`), and how a new index is named
and sharded by default."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from actors import constants
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
    snapshot_chunk_mb: int = constants.SNAPSHOT_CHUNK_BYTES >> 20
    # Where ivf/ivfpq partitions keep their full vectors, sealed, in unnamed files ("": the
    # system's temporary directory).
    vector_dir: str = ""
    auto_train_threshold: int = 10_000
    retrain_factor: float = 4.0
    recall_target: float = 0.95
    idle_ttl_s: float = 0.0
    pool_size: int = 0  # pool actors per node; 0 = one per CPU
    pool_memory_budget_mb: int = 0  # per pool actor; 0 = its share of the node's memory
    train_wait_s: float = 600.0
    train_threads: int = 0  # 0 = all cores of the node
    max_indexes: int = 100_000
    # Seconds between checks for a node that joined (partitions then move onto it); 0 = never.
    rebalance_check_s: float = 30.0
    # Start the shard pool's actors when the control plane finds indexes in its store (a
    # service restarting), not only when a request needs them.
    start_pool: bool = False


@dataclass(frozen=True)
class IndexView:
    """What a gateway caches per index: config, the pool actor hosting each partition (shard
    number order) and the coarse centroids."""

    meta: IndexMeta
    config: IndexConfig
    shards: tuple[Any, ...]
    centroids: np.ndarray | None
    probing: bytes | None = None  # what gateways learned of automatic probing, kept sealed

    def clients(self) -> list[ShardClient]:
        """Typed calls to each partition, in shard number order."""
        m = self.meta
        return [ShardClient(h, Partition(m.name, m.index_id, s)) for s, h in enumerate(self.shards)]


def default_shards() -> int:
    """Shards for an index created without a count: one per live Ray node with CPUs. Within a
    node one partition serves a query with one actor call (each call costs more than searching
    a small index: docs/performance.md) and a batch with every core (Shard.search)."""
    nodes = sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0))
    return max(1, nodes)


def new_index_id() -> str:
    return secrets.token_hex(8)
