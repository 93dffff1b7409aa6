"""What an upsert does, whatever the transport (JSON items, base64 matrices, the Ray transport):
the transport builds serve_app.service.params.UpsertRows; these functions unlock the index,
embed items that came without a vector, check the vectors against the index and its key's item
quota, and write them to the shards."""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.errors import InvalidRequest
from actors.types import UpsertBatch
from serve_app.access import context
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.service import text
from serve_app.service.checks import check_dimension, check_norms, to_index_space
from serve_app.service.params import UpsertRows, unique_ids
from serve_app.service.unlock import open_index
from serve_app.telemetry import lap, now


async def upsert(engine: Engine, rows: UpsertRows, embedder: Any = None) -> int:
    """Store ``rows``; returns the number upserted. JSON items without a vector are embedded
    from their contents with the index's model (one call through ``embedder``)."""
    cv = await open_index(engine, rows.index_name, rows.index_key, Right.WRITE)
    x = rows.vectors
    if not isinstance(x, np.ndarray):
        x = await text.item_vectors(embedder, cv.config, rows)
    return await store(engine, cv, rows, x)


async def store(engine: Engine, cv: CachedView, rows: UpsertRows, x: np.ndarray) -> int:
    """Store ``rows`` with their vectors ``x`` (n, d)."""
    t = now()
    ids = rows.ids
    context.note(items=len(ids))
    unique_ids(ids, "items ids")
    await check_items_quota(engine, cv, ids)
    cv = await fix_dimension(engine, cv, x.shape[1])
    cfg = cv.config
    check_dimension(x, cfg.dimension, rows.field)
    check_norms(x, rows.field, ids)
    x, norms = to_index_space(x, cfg.metric, rows.field)

    def batch(at: np.ndarray) -> UpsertBatch:
        r = at.tolist()
        return UpsertBatch(
            ids=tuple(ids[i] for i in r),
            vectors=x[at],
            norms=None if norms is None else norms[at],
            metadata=tuple(rows.metadata[i] for i in r),
            contents=tuple(rows.contents[i] for i in r),
        )

    t = lap("parse", t)
    total = await engine.upsert_batches(cv, ids, batch)
    if total < 0:
        total, _ = await engine.count(cv)
    engine.control.maybe_autotrain(cfg.name, cv.key, total)
    lap("write", t)
    return len(ids)


async def check_items_quota(engine: Engine, cv: CachedView, ids: list[str]) -> None:
    """Refuse an upsert that would grow the index past its API key's ``max_items_per_index``:
    the items it holds now and the ids it does not hold yet (only looked up when the plain sum
    is over the limit). Upserts under way together may each pass: the index can end up over the
    limit by what they carry at most."""
    ctx = context.current()
    limit = ctx.limits.max_items_per_index if ctx is not None and ctx.limits else 0
    if not limit:
        return
    held, _ = await engine.count(cv)
    if held + len(ids) <= limit:
        return
    new = len(ids) - len(await engine.fetch(cv, ids, False, False, False))
    if held + new > limit:
        raise InvalidRequest(
            f"API key {ctx.key!r} may grow an index to {limit} items (max_items_per_index): "  # type: ignore[union-attr]
            f"{cv.config.name!r} holds {held}, this upsert adds {new}"
        )


async def fix_dimension(engine: Engine, cv: CachedView, dimension: int) -> CachedView:
    """The view, with the dimension fixed to ``dimension`` if this is the first upsert."""
    cfg = cv.config
    if cfg.dimension is not None:
        return cv
    if cfg.index_type == "ivfpq" and cfg.pq_dim and dimension % cfg.pq_dim:
        raise InvalidRequest(f"pq_dim {cfg.pq_dim} must divide the dimension {dimension}")
    await engine.control.set_dimension(cfg.name, cv.key, dimension)
    return await engine.reload(cv)
