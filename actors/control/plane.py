"""The control-plane actor: index catalog, index creation/deletion, partition placement on the
shard pool (actors.pool.placement) and moves between its actors (actors.control.rebalance),
training.

Gateways consult it only when their cached view of an index is missing or stale; queries never
pass through it. Training runs in a background thread of this (threaded) actor.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import faiss
import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors import constants
from actors.control import rotation, trainer
from actors.control.catalog import Catalog
from actors.control.options import EngineOptions, IndexView, default_shards
from actors.control.plane_metrics import PlaneMetrics
from actors.control.rebalance import Rebalancing, watch_joins
from actors.control.training import TrainParams
from actors.engine.ivf import centroids_of, deserialize
from actors.errors import (
    IndexExists,
    IndexNotFound,
    InvalidRequest,
    Unauthorized,
    UserNotFound,
    VaultvecError,
)
from actors.pool.client import ShardClient
from actors.pool.placement import Pool, place
from actors.process import heap
from actors.process.cpus import node_cpus
from actors.storage import Store, open_store, persistence, users
from actors.storage.crypto import fingerprint
from actors.types import IndexConfig, IndexMeta, KeyRotation, Partition, PoolStats

NAMESPACE = "vaultvec"
CONTROL_NAME = "vaultvec-control"


class ControlPlane(PlaneMetrics, Rebalancing):
    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.store: Store = open_store(options.store_url)
        self.pool = Pool(
            options.store_url,
            size_per_node=options.pool_size,
            budget_bytes=options.pool_memory_budget_mb << 20,
            idle_ttl_s=options.idle_ttl_s,
            num_cpus=options.shard_num_cpus,
            max_concurrency=options.shard_max_concurrency,
            wal_max_records=options.wal_max_records,
            snapshot_chunk_bytes=options.snapshot_chunk_mb << 20,
            vector_dir=options.vector_dir,
            threads=options.shard_threads,
            start_timeout_s=options.shard_start_timeout_s,
        )
        self._lock = threading.RLock()
        self._configs: dict[str, IndexConfig] = {}
        self._training: dict[str, Future[IndexConfig]] = {}
        self._catalog = Catalog()
        self._load: Counter[str] = Counter()  # partitions per pool actor
        self._moving: set[str] = set()
        self._switching: set[str] = set()
        self._settled = threading.Condition(self._lock)
        self._draining: frozenset[str] = frozenset()
        self._rebalancing = threading.Lock()
        self._unsettled = False
        for key in self.store.list("indexes/"):
            if key.endswith("/meta"):
                raw = self.store.get(key)
                if raw is not None:
                    meta = persistence.read_meta(raw)
                    self._catalog[meta.name] = meta
                    self._load.update(meta.placement)
        stale = [m for m in self._catalog.values() if m.rotation or m.retired_epoch >= 0]
        self._rotating: set[str] = {m.name for m in stale}  # names whose key rotation runs
        self._keys: dict[str, tuple[str, int, bytes]] = {}  # name -> (id, epoch, key digest)
        self._recovery = rotation.recover_in_background(
            self, stale, self._partition_set, self._rotation_settled
        )
        if options.start_pool and self._catalog:  # a restart: the pool starts meanwhile
            threading.Thread(target=self._start_pool, name="pool-start", daemon=True).start()
        if options.rebalance_check_s > 0:
            watch_joins(self, options.rebalance_check_s)

    def _start_pool(self) -> None:
        """Start the shard pool's actors before the first request needs them (it would wait
        for their processes otherwise), and undo a partition move this actor's restart cut
        short; a failure is left for the first request to meet."""
        with contextlib.suppress(Exception):
            self.pool.members()
            self.recover_moves()

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

    def create_index(
        self,
        meta: IndexMeta,
        key: bytes,
        cfg: IndexConfig,
        max_per_owner: int = 0,
        template: np.ndarray | None = None,
    ) -> None:
        """Persist a new index, its partitions placed on the pool; ``cfg.n_shards == 0`` picks
        the default. Starts no process (the pool's actors run already). ``max_per_owner``
        (0: none): the indexes ``meta.owner`` (an API key's name) may hold. ``template``: the
        trained template of ``cfg.version`` (an index restored from a backup)."""
        if cfg.n_shards == 0:
            cfg = cfg.evolve(n_shards=default_shards())
        members = self.placeable()  # Unavailable if the pool cannot start
        with self._lock:
            if meta.name in self._catalog:
                raise IndexExists(f"index {meta.name!r} already exists")
            if len(self._catalog) >= self.options.max_indexes:
                raise InvalidRequest(
                    f"the service holds {len(self._catalog)} indexes, its limit "
                    f"(VAULTVEC_MAX_INDEXES={self.options.max_indexes}); delete one first"
                )
            owned = sum(m.owner == meta.owner for m in self._catalog.values())
            if max_per_owner and owned >= max_per_owner:
                raise InvalidRequest(
                    f"API key {meta.owner!r} holds {owned} indexes, its limit "
                    f"(max_indexes_per_key={max_per_owner}); delete one first"
                )
            meta = replace(meta, placement=place(meta.index_id, cfg.n_shards, members, self._load))
            persistence.write_config(self.store, key, cfg)
            if template is not None:
                persistence.write_template(self.store, key, cfg, template)
            persistence.write_meta(self.store, meta)  # last: the index exists once this lands
            self._catalog[meta.name] = meta
            self._configs[meta.name] = cfg
            self._load.update(meta.placement)

    def delete_index(self, name: str, key: bytes) -> None:
        """Delete an index: catalog entry first, then retire its partitions, then its data.

        Partitions are retired before this returns, so a gateway still holding the placement
        gets IndexRetired (and looks the index up again) rather than answers from a deleted
        index.
        """
        self._await_move(name, whole=True)  # (a partition half moved would keep its new host)
        meta = self.lookup(name)
        self.config(name, key)  # the key is checked by the caller; this loads the config
        with self._lock:
            self.store.delete(persistence.meta_key(meta.index_id))  # first: the index is gone
            self._catalog.pop(name, None)
            self._configs.pop(name, None)
            self._load.subtract(meta.placement)
        # Every pool actor, not only the placement's: one a move was taking a partition to
        # holds a copy too.
        members: dict[str, str] = {}
        with contextlib.suppress(VaultvecError):  # (none can start: the placement's are tried)
            members = self.pool.members()
        actors = [self.pool.handle(a) for a in dict.fromkeys([*meta.placement, *members])]
        with contextlib.suppress(GetTimeoutError, RayActorError):  # a restarted one refuses too
            ray.get(
                [a.retire.remote(meta.index_id) for a in actors],
                timeout=self.options.retire_timeout_s,
            )
        self.store.delete_prefix(persistence.index_prefix(meta.index_id) + "/")

    def config(self, name: str, key: bytes) -> IndexConfig:
        meta = self._check_key(name, key)
        with self._lock:
            cfg = self._configs.get(name)
            if cfg is None:
                cfg = persistence.read_config(self.store, key, name, meta.index_id, meta.epoch)
                if cfg is None:
                    raise IndexNotFound(f"index {name!r} not found")
                self._configs[name] = cfg
            if cfg.key_epoch != meta.epoch:  # the key was rotated since it was checked
                raise Unauthorized("invalid index_key for this index")
            return cfg

    def _check_key(self, name: str, key: bytes) -> IndexMeta:
        """The index's entry, once ``key`` is known to be its current data key: it opens the
        current key epoch's config (checked once per key and epoch). Gateways verify keys
        first; this keeps a key a gateway verified against an entry it cached before a
        rotation from reading or writing anything of the index."""
        meta = self.lookup(name)
        seen = (meta.index_id, meta.epoch, fingerprint(key))
        if self._keys.get(name) == seen:
            return meta
        if persistence.opens_config(self.store, key, name, meta.index_id, meta.epoch) is False:
            raise Unauthorized("invalid index_key for this index")
        self._keys[name] = seen
        return meta

    def view(self, name: str, key: bytes) -> IndexView:
        self._await_move(name)  # a gateway refused by a partition's former host lands here
        meta = self.lookup(name)
        cfg = self.config(name, key)
        centroids = None
        if cfg.is_trained:
            template = persistence.read_template(self.store, key, cfg)
            if template is not None:
                centroids = centroids_of(deserialize(template))
        probing = persistence.read_probing(self.store, key, cfg) if cfg.is_trained else None
        return IndexView(meta, cfg, self._partitions(meta, cfg), centroids, probing)

    def save_probing(self, name: str, key: bytes, version: int, state: bytes) -> None:
        """Keep a gateway's learned probing state of training ``version`` (a later training
        makes it moot: not kept then)."""
        cfg = self.config(name, key)
        if cfg.version == version:
            persistence.write_probing(self.store, key, cfg, state)

    def template(self, name: str, key: bytes) -> np.ndarray | None:
        """The trained template of the index's current version (None before training)."""
        return persistence.read_template(self.store, key, self.config(name, key))

    def restored(self, name: str, key: bytes, backup_id: str) -> IndexMeta:
        """End the restore of ``backup_id`` into the index: from now on it answers."""
        meta = self._check_key(name, key)
        if meta.restoring != backup_id:
            raise InvalidRequest(f"index {name!r} is not being restored from backup {backup_id}")
        return self.update_meta(meta, lambda m: replace(m, restoring=""))

    def set_dimension(self, name: str, key: bytes, dimension: int) -> IndexConfig:
        """Fix an index's dimension at its first upsert (first writer wins)."""
        with self._lock:
            cfg = self.config(name, key)
            if cfg.dimension is None:
                cfg = cfg.evolve(dimension=dimension)
                persistence.write_config(self.store, key, cfg)
                self._configs[name] = cfg
            return cfg

    def _partitions(self, meta: IndexMeta, cfg: IndexConfig) -> tuple[Any, ...]:
        """The pool actor of each partition. An index stored without a placement (by an older
        vaultvec, which gave each index its own actors) is placed now, once."""
        if len(meta.placement) != cfg.n_shards:
            members = self.placeable()
            with self._lock:
                meta = self._catalog.get(meta.name, meta)
                if len(meta.placement) != cfg.n_shards:
                    placement = place(meta.index_id, cfg.n_shards, members, self._load)
                    meta = replace(meta, placement=placement)
                    persistence.write_meta(self.store, meta)
                    self._catalog[meta.name] = meta
                    self._load.update(placement)
        return tuple(self.pool.handle(a) for a in meta.placement)

    def _clients(self, meta: IndexMeta, cfg: IndexConfig) -> list[ShardClient]:
        return IndexView(meta, cfg, self._partitions(meta, cfg), None).clients()

    def pool_stats(self) -> list[PoolStats]:
        """Every pool actor's memory (budget, TTL, resident, partitions loaded)."""
        handles = [self.pool.handle(a) for a in self.pool.members()]
        return list(ray.get([h.pool_stats.remote() for h in handles]))

    def stop_pool(self) -> None:
        self.pool.stop()

    def _record_training(self, name: str, started: float, future: Future[IndexConfig]) -> None:
        meta = self._catalog.get(name)
        if meta is not None:
            ok = future.done() and future.exception() is None
            self._metrics().training(meta.index_id, time.monotonic() - started, ok)

    # -- training ---------------------------------------------------------------------------
    def train(self, name: str, key: bytes, params: TrainParams, wait: bool = True) -> str:
        """Start (or join) training; with ``wait``, block until it ends or train_wait_s passes."""
        with self._lock:
            self.lookup(name)
            if name in self._rotating or name in self._moving:
                raise rotation.Busy(f"index {name!r} {rotation.BUSY}")
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
        if due and not ({name} & (self._training.keys() | self._rotating | self._moving)):
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
        started = time.monotonic()
        try:
            future.set_result(self._train(name, key, params))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            self._record_training(name, started, future)
            with self._lock:
                if self._training.get(name) is future:
                    del self._training[name]
            heap.trim(collect=True)  # the training sample and k-means' buffers: their pages back

    def _train(self, name: str, key: bytes, params: TrainParams) -> IndexConfig:
        # Ray caps OMP threads at the actor's (fractional) CPUs; training is worth the cores.
        faiss.omp_set_num_threads(self.options.train_threads or node_cpus())
        meta = self.lookup(name)
        cfg = self.config(name, key)
        new_cfg = trainer.train(self.store, key, cfg, self._clients(meta, cfg), params)
        with self._lock:
            if name not in self._catalog:
                raise IndexNotFound(f"index {name!r} was deleted during training")
            latest = self._configs.get(name, cfg)
            new_cfg = new_cfg.evolve(dimension=latest.dimension)
            persistence.write_config(self.store, key, new_cfg)
            self._configs[name] = new_cfg
        persistence.prune_templates(self.store, new_cfg)
        return new_cfg

    # -- key rotation (actors.control.rotation) ------------------------------------------------------
    def rotate_key(
        self, name: str, key: bytes, salt: bytes, verifier: bytes, new_key: bytes
    ) -> None:
        """Re-seal every stored blob of the index under ``new_key`` (derived with ``salt``;
        ``verifier`` its verifier) while it serves; returns once the old key opens nothing."""
        cfg = self.config(name, key)
        meta = self.lookup(name)
        if len(meta.placement) != cfg.n_shards:  # stored before placement existed: place it
            self._partitions(meta, cfg)
        with self._lock:
            if name in self._training or name in self._rotating or name in self._moving:
                raise rotation.Busy(f"index {name!r} {rotation.BUSY}")
            self._rotating.add(name)
        settled = True
        try:
            meta = self.lookup(name)
            parts = self._partition_set(meta)
            rotation.rotate(self, parts, meta, key, KeyRotation(salt, verifier), new_key)
        except rotation.Unsettled:
            settled = False  # stays locked against rotation and training until a restart
            raise
        finally:
            if settled:
                with self._lock:
                    self._rotating.discard(name)

    def update_meta(self, meta: IndexMeta, change: Callable[[IndexMeta], IndexMeta]) -> IndexMeta:
        with self._lock:
            new = change(self._current(meta))
            persistence.write_meta(self.store, new)
            self._catalog[meta.name] = new
            return new

    def switch_key(
        self, meta: IndexMeta, key: bytes, next_key: KeyRotation, new_key: bytes
    ) -> IndexMeta:
        with self._lock:  # also orders the config's copy with set_dimension
            current = self._current(meta)
            cfg = self._configs[meta.name]
            epoch = current.epoch + 1
            new_cfg = cfg.evolve(key_epoch=epoch)
            persistence.reseal_templates(self.store, key, cfg, new_key, epoch)
            persistence.write_config(self.store, new_key, new_cfg)
            new = replace(
                current,
                salt=next_key.salt,
                verifier=next_key.verifier,
                epoch=epoch,
                rotation=None,
                retired_epoch=current.epoch,
                users=users.rewrap_all(current, key, epoch, new_key),
            )
            try:
                persistence.write_meta(self.store, new)  # the switch
            except Exception:
                if not rotation.landed(self.store, new):
                    raise
            self._catalog[meta.name] = new
            self._configs[meta.name] = new_cfg
            self._keys[meta.name] = (new.index_id, epoch, fingerprint(new_key))
            return new

    # -- per-index users (actors.storage.users) ------------------------------------------------
    def create_user(self, name: str, key: bytes, rights: list[str]) -> tuple[str, str]:
        """A new user of the index: (its id, its key: returned this once, never stored)."""
        meta = self._check_key(name, key)
        minted: list[str] = []

        def add(current: IndexMeta) -> IndexMeta:
            if current.epoch != meta.epoch:  # rotated since the key was checked
                raise Unauthorized("invalid index_key for this index: the key was rotated")
            if len(current.users) >= constants.MAX_USERS_PER_INDEX:
                raise InvalidRequest(f"index {name!r} has {len(current.users)} users, the most")
            api_key, grant = users.mint(current.index_id, current.epoch, key, rights)
            minted.append(api_key)
            return replace(current, users=(*current.users, grant))

        return self.update_meta(meta, add).users[-1].user_id, minted[0]

    def user_index(self, user_id: str) -> IndexMeta | None:
        """The entry of the index ``user_id`` belongs to (its grant is checked by the caller)."""
        with self._lock:
            return self._catalog.of_user(user_id)

    def list_users(self, name: str, key: bytes) -> list[tuple[str, tuple[str, ...]]]:
        return [(u.user_id, u.rights) for u in self._check_key(name, key).users]

    def delete_user(self, name: str, key: bytes, user_id: str) -> None:
        """Revoke a user: its grant leaves the catalog entry, so its key opens nothing."""

        def drop(current: IndexMeta) -> IndexMeta:
            kept = tuple(u for u in current.users if u.user_id != user_id)
            if len(kept) == len(current.users):
                raise UserNotFound(f"index {name!r} has no user {user_id!r}")
            return replace(current, users=kept)

        self.update_meta(self._check_key(name, key), drop)

    def _current(self, meta: IndexMeta) -> IndexMeta:
        """The catalog's entry for ``meta``'s index (caller holds the lock)."""
        current = self._catalog.get(meta.name)
        if current is None or current.index_id != meta.index_id:
            raise IndexNotFound(f"index {meta.name!r} was deleted")
        return current

    def _partition_set(self, meta: IndexMeta) -> rotation.Partitions:
        handles = [self.pool.handle(a) for a in meta.placement]
        clients = [
            ShardClient(h, Partition(meta.name, meta.index_id, s)) for s, h in enumerate(handles)
        ]
        return rotation.RayPartitions(clients)

    def _rotation_settled(self, name: str) -> None:
        with self._lock:
            self._rotating.discard(name)

    def ping(self) -> bool:
        return True
