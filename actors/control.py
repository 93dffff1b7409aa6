"""The control-plane actor: index catalog, index creation/deletion, shard placement, training.

Gateways consult it only when their cached view of an index is missing or stale; queries never
pass through it. Training runs in a background thread of this (threaded) actor.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors import heap, persistence
from actors.errors import IndexExists, IndexNotFound, InvalidRequest, Unavailable, VaultvecError
from actors.partition import centroids_of, deserialize, serialize
from actors.shard import Shard
from actors.store import Store, open_store
from actors.training import (
    TrainParams,
    auto_n_lists,
    calibrate_nprobe,
    calibrate_probing,
    sample_size,
    train_template,
)
from actors.types import IndexConfig, IndexMeta

NAMESPACE = "vaultvec"
CONTROL_NAME = "vaultvec-control"


@dataclass(frozen=True)
class EngineOptions:
    store_url: str
    shard_num_cpus: float = 0.05
    shard_start_timeout_s: float = 60.0
    retire_timeout_s: float = 30.0
    shard_threads: int = 1
    shard_max_concurrency: int = 32
    wal_max_records: int = 256
    auto_train_threshold: int = 10_000
    retrain_factor: float = 4.0
    recall_target: float = 0.95
    idle_ttl_s: float = 0.0
    train_wait_s: float = 600.0
    train_threads: int = 0  # 0 = all cores of the node
    max_indexes: int = 1000


@dataclass(frozen=True)
class IndexView:
    """What a gateway caches per index: config, shard handles and the coarse centroids."""

    meta: IndexMeta
    config: IndexConfig
    shards: tuple[Any, ...]
    centroids: np.ndarray | None


ShardActor = ray.remote(Shard)


def shard_actor_name(index_id: str, shard: int) -> str:
    return f"vaultvec-shard-{index_id}-{shard}"


class ControlPlane:
    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.store: Store = open_store(options.store_url)
        self._lock = threading.RLock()
        self._configs: dict[str, IndexConfig] = {}
        self._training: dict[str, Future[IndexConfig]] = {}
        self._catalog: dict[str, IndexMeta] = {}
        for key in self.store.list("indexes/"):
            if key.endswith("/meta"):
                raw = self.store.get(key)
                if raw is not None:
                    meta = persistence.read_meta(raw)
                    self._catalog[meta.name] = meta

    # -- catalog ----------------------------------------------------------------------------
    def list_indexes(self) -> list[str]:
        with self._lock:
            return sorted(self._catalog)

    def lookup(self, name: str) -> IndexMeta:
        with self._lock:
            meta = self._catalog.get(name)
        if meta is None:
            raise IndexNotFound(f"index {name!r} not found")
        return meta

    def create_index(self, meta: IndexMeta, key: bytes, cfg: IndexConfig) -> None:
        """Persist a new index and start its shards; ``cfg.n_shards == 0`` picks the default."""
        if cfg.n_shards == 0:
            cfg = cfg.evolve(n_shards=default_shards())
        with self._lock:
            if meta.name in self._catalog:
                raise IndexExists(f"index {meta.name!r} already exists")
            if len(self._catalog) >= self.options.max_indexes:
                raise InvalidRequest(
                    f"the service holds {len(self._catalog)} indexes, its limit "
                    f"(VAULTVEC_MAX_INDEXES={self.options.max_indexes}); delete one first"
                )
            persistence.write_config(self.store, key, cfg)
            persistence.write_meta(self.store, meta)  # last: the index exists once this lands
            self._catalog[meta.name] = meta
            self._configs[meta.name] = cfg
        try:
            self._shards(meta, cfg)
        except Unavailable:
            self.delete_index(meta.name, key)  # no half-created index is left behind
            raise

    def delete_index(self, name: str, key: bytes) -> None:
        """Delete an index: catalog entry first, then retire and kill its shards, then data.

        Shards are retired before this returns, so a gateway still holding their handles gets
        IndexRetired (and looks the index up again) rather than answers from a deleted index.
        """
        meta = self.lookup(name)
        cfg = self.config(name, key)
        with self._lock:
            self.store.delete(persistence.meta_key(meta.index_id))  # first: the index is gone
            self._catalog.pop(name, None)
            self._configs.pop(name, None)
        handles = []
        for s in range(cfg.n_shards):
            with contextlib.suppress(ValueError):  # never started
                handles.append(ray.get_actor(shard_actor_name(meta.index_id, s), NAMESPACE))
        with contextlib.suppress(GetTimeoutError, RayActorError):  # unreachable: killed below
            ray.get([h.retire.remote() for h in handles], timeout=self.options.retire_timeout_s)
        for h in handles:
            ray.kill(h)
        self.store.delete_prefix(persistence.index_prefix(meta.index_id) + "/")

    def config(self, name: str, key: bytes) -> IndexConfig:
        meta = self.lookup(name)
        with self._lock:
            cfg = self._configs.get(name)
            if cfg is None:
                cfg = persistence.read_config(self.store, key, name, meta.index_id)
                if cfg is None:
                    raise IndexNotFound(f"index {name!r} not found")
                self._configs[name] = cfg
            return cfg

    def view(self, name: str, key: bytes) -> IndexView:
        meta = self.lookup(name)
        cfg = self.config(name, key)
        centroids = None
        if cfg.is_trained:
            template = persistence.read_template(self.store, key, cfg)
            if template is not None:
                centroids = centroids_of(deserialize(template))
        return IndexView(meta, cfg, tuple(self._shards(meta, cfg)), centroids)

    def set_dimension(self, name: str, key: bytes, dimension: int) -> IndexConfig:
        """Fix an index's dimension at its first upsert (first writer wins)."""
        with self._lock:
            cfg = self.config(name, key)
            if cfg.dimension is None:
                cfg = cfg.evolve(dimension=dimension)
                persistence.write_config(self.store, key, cfg)
                self._configs[name] = cfg
            return cfg

    def _shards(self, meta: IndexMeta, cfg: IndexConfig) -> list[Any]:
        """Handles of the index's shard actors, created on first use (named, detached).

        Waits until every shard runs: a shard Ray cannot place (no free CPU for it) is a clear
        503, not a request that hangs.
        """
        handles = self._shard_handles(meta, cfg)
        try:
            ray.get([h.ping.remote() for h in handles], timeout=self.options.shard_start_timeout_s)
        except GetTimeoutError:
            raise Unavailable(
                f"could not start the {cfg.n_shards} shards of index {meta.name!r} within "
                f"{self.options.shard_start_timeout_s:.0f}s: the cluster has no room for more "
                f"shard actors ({self.options.shard_num_cpus} CPU each; see "
                "VAULTVEC_SHARD_NUM_CPUS) or a node is down"
            ) from None
        return handles

    def _shard_handles(self, meta: IndexMeta, cfg: IndexConfig) -> list[Any]:
        o = self.options
        return [
            ShardActor.options(
                name=shard_actor_name(meta.index_id, s),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=o.shard_num_cpus,
                max_restarts=-1,
                max_task_retries=3,
                max_concurrency=o.shard_max_concurrency,
                scheduling_strategy="SPREAD",
                runtime_env={"env_vars": heap.ENV},  # glibc reads them at process start
            ).remote(
                o.store_url,
                meta.name,
                meta.index_id,
                s,
                wal_max_records=o.wal_max_records,
                threads=o.shard_threads,
                idle_ttl_s=o.idle_ttl_s,
            )
            for s in range(cfg.n_shards)
        ]

    # -- training ---------------------------------------------------------------------------
    def train(self, name: str, key: bytes, params: TrainParams, wait: bool = True) -> str:
        """Start (or join) training; with ``wait``, block until it ends or train_wait_s passes."""
        with self._lock:
            self.lookup(name)
            future = self._training.get(name)
            if future is None:
                future = Future()
                self._training[name] = future
                threading.Thread(
                    target=self._train_job, args=(name, key, params, future), daemon=True
                ).start()
        if not wait:
            return "in_progress"
        try:
            future.result(timeout=self.options.train_wait_s)
        except TimeoutError:
            return "in_progress"
        return "success"

    def maybe_autotrain(self, name: str, key: bytes, total: int) -> bool:
        try:
            cfg = self.config(name, key)
        except VaultvecError:
            return False
        o = self.options
        due = (not cfg.is_trained and total >= o.auto_train_threshold) or (
            cfg.is_trained and total >= o.retrain_factor * max(cfg.trained_size, 1)
        )
        if due and name not in self._training:
            self.train(name, key, TrainParams(), wait=False)
            return True
        return False

    def training_status(self) -> dict[str, Any]:
        """Every field CyborgDB's clients read: trainings run at once, so none is queued."""
        with self._lock:
            running = sorted(n for n, f in self._training.items() if not f.done())
        return {
            "training_indexes": running,
            "retrain_threshold": self.options.auto_train_threshold,
            "worker_pid": os.getpid(),
            "global_training": {},
            "currently_training": running[0] if running else None,
            "queued_indexes": [],
            "worker_running": bool(running),
        }

    def _train_job(
        self, name: str, key: bytes, params: TrainParams, future: Future[IndexConfig]
    ) -> None:
        try:
            future.set_result(self._train(name, key, params))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            with self._lock:
                if self._training.get(name) is future:
                    del self._training[name]

    def _train(self, name: str, key: bytes, params: TrainParams) -> IndexConfig:
        # Ray caps OMP threads at the actor's (fractional) CPUs; training is worth the cores.
        faiss.omp_set_num_threads(self.options.train_threads or os.cpu_count() or 1)
        meta = self.lookup(name)
        cfg = self.config(name, key)
        shards = self._shards(meta, cfg)
        counts = [s.count for s in ray.get([sh.stats.remote(key) for sh in shards])]
        total = sum(counts)
        if total == 0 or cfg.dimension is None:
            raise InvalidRequest("cannot train an empty index")
        n_lists = params.n_lists or cfg.n_lists_requested or auto_n_lists(total)
        if not params.n_lists and cfg.n_lists_requested:  # asked at create time: as many as fit
            n_lists = min(n_lists, max(1, total // 39))
        if n_lists > total:
            raise InvalidRequest(f"n_lists={n_lists} exceeds the number of items ({total})")
        size = sample_size(n_lists, total, cfg.dimension, params.max_memory)
        parts = ray.get(
            [
                sh.sample.remote(key, math.ceil(size * c / total) + 1, seed)
                for seed, (sh, c) in enumerate(zip(shards, counts))
            ]
        )
        sample = np.concatenate([p for p in parts if len(p)]).astype(np.float32)
        template = train_template(
            sample, cfg.index_type, n_lists, cfg.pq_dim, cfg.pq_bits, params, sq_bits=cfg.sq_bits
        )
        table = calibrate_nprobe(template, sample, cfg.recall_target)
        probing = calibrate_probing(template, sample, cfg.recall_target, table, len(shards))
        new_cfg = cfg.evolve(
            version=cfg.version + 1,
            n_lists=n_lists,
            trained_size=total,
            nprobe_table=table,
            probe_table=probing,
        )
        blob = serialize(template)
        persistence.write_template(self.store, key, new_cfg, blob)
        ref = ray.put(blob)
        ray.get(
            [
                sh.rebuild.remote(key, new_cfg.version, ref, table, params.batch_size or 65536)
                for sh in shards
            ]
        )
        with self._lock:
            if name not in self._catalog:
                raise IndexNotFound(f"index {name!r} was deleted during training")
            latest = self._configs.get(name, cfg)
            new_cfg = new_cfg.evolve(dimension=latest.dimension)
            persistence.write_config(self.store, key, new_cfg)
            self._configs[name] = new_cfg
        persistence.prune_templates(self.store, new_cfg)
        return new_cfg

    def ping(self) -> bool:
        return True


def default_shards() -> int:
    """Shards for an index created without a count: one per live Ray node with CPUs, at least
    two (so a single machine still exercises the sharded path and uses both its cores)."""
    nodes = sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0))
    return max(2, nodes)


def new_index_id() -> str:
    return secrets.token_hex(8)
