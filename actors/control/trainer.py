"""One training of an index, across its partitions: a sample drawn from every partition in
proportion to its items, the template trained and automatic probing calibrated on it
(actors.control.training), the template stored, and every partition rebuilt from it."""

from __future__ import annotations

import math

import numpy as np
import ray

from actors import constants
from actors.control.training import (
    TrainParams,
    auto_n_lists,
    calibrate_nprobe,
    calibrate_probing,
    sample_size,
    train_template,
)
from actors.engine.ivf import serialize
from actors.errors import InvalidRequest
from actors.pool.client import ShardClient
from actors.storage import Store, persistence
from actors.types import IndexConfig


def train(
    store: Store, key: bytes, cfg: IndexConfig, shards: list[ShardClient], params: TrainParams
) -> IndexConfig:
    """Train ``cfg``'s index and rebuild its partitions; the new config (not yet stored)."""
    counts = [s.count for s in ray.get([sh.stats(key) for sh in shards])]
    total = sum(counts)
    if total == 0 or cfg.dimension is None:
        raise InvalidRequest("cannot train an empty index")
    n_lists = params.n_lists or cfg.n_lists_requested or auto_n_lists(total)
    if not params.n_lists and cfg.n_lists_requested:  # asked at create time: as many as fit
        n_lists = min(n_lists, max(1, total // 39))
    if n_lists > total:
        raise InvalidRequest(f"n_lists={n_lists} exceeds the number of items ({total})")
    size = sample_size(n_lists, total, cfg.dimension, params.max_memory)
    streams = [
        sh.sample(key, math.ceil(size * c / total) + 1, seed)
        for seed, (sh, c) in enumerate(zip(shards, counts))
    ]
    parts = [ray.get(ref) for stream in streams for ref in stream]
    sample = np.concatenate([p for p in parts if len(p)]).astype(np.float32, copy=False)
    del parts
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
    persistence.write_template(store, key, new_cfg, blob)
    batch = params.batch_size or constants.REBUILD_BATCH
    ray.get(ShardClient.rebuild_all(shards, key, new_cfg.version, blob, table, batch))
    return new_cfg
