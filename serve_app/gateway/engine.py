"""The gateway's engine: unlock an index, plan a request, fan out one call per shard, merge.

No HTTP here: routes hand validated models in and get plain data back. Per index the engine
caches a view (config, shard handles, coarse quantizer); it consults the control plane only when
the view is missing or a shard reports a newer training version.
"""

from __future__ import annotations

import asyncio
import heapq
import hmac
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

import faiss
import numpy as np
from ray.exceptions import ActorDiedError

from actors.control.client import ControlClient, cause
from actors.control.options import IndexView
from actors.engine.filters import FilterNode
from actors.errors import IndexNotFound, IndexRetired, Unauthorized, Unavailable, VaultvecError
from actors.pool.client import PiecesWritten, ShardClient
from actors.storage.crypto import IndexKeys, derive_keys, parse_index_key, verify
from actors.types import (
    IndexConfig,
    IndexMeta,
    PoolStats,
    Probing,
    SearchRequest,
    SearchResult,
    ShardStats,
    UpsertBatch,
    fixed_lists,
)
from serve_app import constants
from serve_app import telemetry as stages
from serve_app.access import context
from serve_app.coalesce import Coalescer
from serve_app.gateway.calls import (
    SHARD_ERRORS,
    StaleIndex,
    T,
    assign_shards,
    within,
)
from serve_app.gateway.hits import Hits, Merge, Query, entries, patch, top_k
from serve_app.gateway.measuring import Measuring
from serve_app.gateway.probing import RecallMonitor

log = logging.getLogger("vaultvec.engine")
ShardCall = tuple[int, Callable[[ShardClient], Awaitable[Any]]]  # (shard number, the call)


@dataclass
class CachedView:
    view: IndexView
    key: bytes
    quantizer: faiss.IndexFlatL2 | None
    counts: dict[int, int] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.monotonic)
    shards: list[ShardClient] = field(init=False)  # one per partition, shard number order

    def __post_init__(self) -> None:
        self.shards = self.view.clients()

    @property
    def config(self) -> IndexConfig:
        return self.view.config


class Engine(Measuring):
    def __init__(
        self,
        control: ControlClient,
        *,
        retries: int = 3,
        retry_backoff_s: float = 0.2,
        timeout_s: float = 300.0,
        recall_sample_share: float = 0.01,
    ) -> None:
        self.control = control
        self.monitor = RecallMonitor(recall_sample_share)
        self._measuring: set[asyncio.Task[None]] = set()
        self.retries = retries
        self.timeout_s = timeout_s
        self.retry_backoff_s = retry_backoff_s
        self._metas: dict[str, IndexMeta] = {}
        self._views: dict[str, CachedView] = {}
        self._singles: dict[Any, Coalescer[Single, Hits]] = {}

    # -- unlocking --------------------------------------------------------------------------
    async def keys(self, name: str, key_hex: str) -> tuple[IndexMeta, IndexKeys]:
        """Verify ``key_hex`` against the index's stored verifier (constant time), from the
        cached entry, then from a fresh one (the key may have been rotated since)."""
        context.note(index=name)
        key = parse_index_key(key_hex)
        for fresh in (False, True):
            cached = None if fresh else self._metas.get(name)
            meta: IndexMeta = cached if cached is not None else await self.control.lookup(name)
            self._metas[name] = meta
            keys = derive_keys(key, name, meta.salt)
            if verify(keys, meta.verifier):
                return meta, keys
        if meta.rotation is not None and verify(
            derive_keys(key, name, meta.rotation.salt), meta.rotation.verifier
        ):  # the key the index is being rotated to: it opens the index once the rotation ends
            raise Unavailable("the index's key is being rotated to this key; retry shortly")
        raise Unauthorized("invalid index_key for this index")

    async def view(self, name: str, key_hex: str) -> CachedView:
        meta, keys = await self.keys(name, key_hex)
        return await self.view_unlocked(meta, keys.data_key)

    async def view_unlocked(self, meta: IndexMeta, data_key: bytes) -> CachedView:
        """The view of ``meta``'s index for a data key already known to open it."""
        cached = self._views.get(meta.name)
        if (
            cached is not None
            and cached.view.meta.index_id == meta.index_id
            and hmac.compare_digest(cached.key, data_key)
        ):
            return cached
        return await self._load_view(meta.name, data_key)

    async def _load_view(self, name: str, data_key: bytes) -> CachedView:
        view = await self.control.view(name, data_key)
        quantizer = None
        if view.centroids is not None:
            quantizer = faiss.IndexFlatL2(view.centroids.shape[1])
            quantizer.add(view.centroids)
        cached = CachedView(view, data_key, quantizer)
        self._views[name] = cached
        return cached

    async def reload(self, cv: CachedView) -> CachedView:
        """The index's view fetched anew from the control plane."""
        return await self._load_view(cv.view.meta.name, cv.key)

    def forget(self, name: str) -> None:
        self._views.pop(name, None)
        self._metas.pop(name, None)

    async def refresh_if_stale(
        self, cv: CachedView, versions: Sequence[int], *, now: bool = False
    ) -> CachedView:
        """The view, reloaded when a shard reports another training version than it holds.

        While a training swap is under way shards and config disagree for a while; reloading
        at most every constants.REFRESH_S (unless ``now``) keeps that window from costing a control call
        per request (shards answer correctly meanwhile, assigning lists themselves).
        """
        stale = any(v != cv.config.version for v in versions)
        if stale and (now or time.monotonic() - cv.loaded_at >= constants.REFRESH_S):
            return await self.reload(cv)
        return cv

    # -- fan-out ----------------------------------------------------------------------------
    async def fan_out(
        self, cv: CachedView, calls: Sequence[ShardCall], *, idempotent: bool = True
    ) -> list[Any]:
        """One call per shard (a ShardClient method, which may make several Ray calls: an
        upsert's pieces), concurrently; shard outages are retried within a bounded budget.

        A shard that is restarting (crash, node loss) is retried with backoff. A shard that is
        gone for good or retired means the view may be out of date: the index is looked up
        again (deleted -> 404, re-created -> :class:`StaleIndex`, same -> fresh handles). Every
        shard answers or the request fails with 503: results are never silently partial.
        """

        async def one(s: int, make: Callable[[ShardClient], Awaitable[Any]]) -> Any:
            attempts = self.retries + 1 if idempotent else 1
            client = cv.shards[s]
            for attempt in range(attempts):
                try:
                    return await within(make(client), self.timeout_s)
                except asyncio.TimeoutError:
                    raise Unavailable(
                        f"shard {s} of index {cv.view.meta.name!r} did not answer within "
                        f"{self.timeout_s:.0f}s"
                    ) from None
                except Exception as exc:
                    failure = cause(exc)
                    if isinstance(failure, IndexRetired) or isinstance(exc, ActorDiedError):
                        client = (await self.revalidate(cv)).shards[s]
                    elif isinstance(failure, VaultvecError):
                        raise failure from None
                    elif not isinstance(exc, SHARD_ERRORS):
                        raise
                    if attempt == attempts - 1:
                        raise Unavailable(
                            f"shard {s} of index {cv.view.meta.name!r} is unavailable "
                            f"(tried {attempts} times); retry later"
                        ) from None
                    log.warning("shard %d of %s failed (%s); retrying", s, cv.view.meta.name, exc)
                    await asyncio.sleep(self.retry_backoff_s * (2**attempt))
            raise Unavailable()

        if len(calls) == 1:  # one shard: no task for gather to wrap it in
            return [await one(*calls[0])]
        return await asyncio.gather(*(one(s, make) for s, make in calls))

    async def revalidate(self, cv: CachedView) -> CachedView:
        """Look the index up again after a shard refused or vanished.

        Raises IndexNotFound if it was deleted, StaleIndex if it was re-created (another
        incarnation: new id, salt and shards); otherwise returns a freshly loaded view (the
        control plane restarts shard actors that died for good).
        """
        name = cv.view.meta.name
        try:
            meta = await self.control.lookup(name)
        except IndexNotFound:
            self.forget(name)
            raise
        if meta.index_id != cv.view.meta.index_id:
            self.forget(name)
            raise StaleIndex(f"index {name!r} was re-created while the request ran; retry")
        return await self.reload(cv)

    # -- queries ----------------------------------------------------------------------------
    def plan(self, cv: CachedView, x: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        """Coarse assignment computed once per request: (list numbers, centroid distances)."""
        if cv.quantizer is None:
            zeros = np.zeros((len(x), 1), dtype=np.int64)
            return zeros, np.zeros((len(x), 1), dtype=np.float32)
        coarse, lists = cv.quantizer.search(x, nprobe)
        return lists, coarse

    async def search(self, cv: CachedView, x: np.ndarray, q: Query) -> Hits:
        """Top-k of a batch of queries ``x`` (nq, d), in index space.

        An explicit ``q.n_probes`` scans exactly that many lists per query, ``q.greedy`` probes
        until its bound stops it; otherwise automatic probing (actors.engine.adaptive)
        chooses per query, with the calibrated slack times this replica's probing scale, and a
        share of the queries is measured against the exact answer (:meth:`_measure`)."""
        cfg = cv.config
        auto = None
        if not (q.n_probes or q.greedy) and cv.quantizer is not None:
            auto = cfg.auto_probing(q.top_k)
        if auto is None:
            nprobe = q.n_probes or cfg.auto_nprobe(q.top_k)
            given = GREEDY if q.greedy else Probing("fixed", n_probes=q.n_probes)
            return await self._search(cv, x, q, nprobe, given)
        state = self.monitor.of(cfg.index_id, cfg.version, cfg.recall_target, cv.view.probing)
        first, slacks = auto
        probing = Probing(
            "adaptive", first=first, slacks=slacks, scales=state.scales, fixed=state.fixed
        )
        warm = await self._warm_up(cv, x, q, probing, state)
        if warm is not None:  # the rules it fitted answer the batch
            probing = replace(probing, scales=state.scales, fixed=state.fixed)
        hits = await self._search(cv, x, q, plan_width(probing), probing)
        state.queries += len(x)
        state.lists_scanned += hits.lists_scanned
        if warm is not None:
            self._warmed(cv, warm, state)
        else:
            self._sample(cv, x, q, probing, hits, state)
        return hits

    async def search_one(self, cv: CachedView, x: np.ndarray, q: Query) -> Hits:
        """:meth:`search` of one query (``x`` of one row), together with the other single
        queries of the same index and options that arrive while one of theirs is searched: a
        batch of them costs one fan-out, one call per shard, where each call costs far more CPU
        in Ray than its search (docs/performance.md). An idle index's query goes at once, and
        two batches of a kind may be under way, so a lone pair of queries is not serialised.

        Options are told apart by their repr, which keeps the types that ``==`` does not: a
        filter on ``true`` and one on ``1`` match different items (actors.engine.filters)."""
        kind = (cv.config.index_id, cv.config.version, cv.key, repr(q))
        batcher = self._singles.get(kind)
        if batcher is None:
            batcher = Coalescer(
                partial(self._search_rows, q), constants.SINGLES_PER_BATCH, concurrency=2
            )
            batcher.on_idle = partial(self._singles_idle, kind, batcher)
            self._singles[kind] = batcher
        return await batcher.submit(Single(cv, x, stages.current()))

    def _singles_idle(self, kind: tuple[Any, ...], batcher: Coalescer[Single, Hits]) -> None:
        if self._singles.get(kind) is batcher:
            del self._singles[kind]

    async def _search_rows(self, q: Query, items: list[Single]) -> list[Hits]:
        cv = items[-1].cv  # the view most recently looked up (a stale one was reloaded)
        if len(items) == 1 and items[0].timer is stages.current():
            return [await self.search(cv, items[0].x, q)]  # alone, in its own request's task
        with stages.measuring() as batch:  # each request gets the stages of its batch
            hits = await self.search(cv, np.concatenate([s.x for s in items]), q)
        stages.share(batch, (s.timer for s in items))
        return hits.rows()

    async def _search(
        self,
        cv: CachedView,
        x: np.ndarray,
        q: Query,
        nprobe: int,
        probing: Probing,
        merge_parts: Merge | None = None,
    ) -> Hits:
        """One fan-out of ``x`` planned ``nprobe`` lists wide (``probing`` says how each shard
        goes on from there: actors.engine.search), its parts merged by ``merge_parts``, widened
        for the queries whose probed lists ran dry (default: :data:`top_k`)."""
        merge_parts = merge_parts or top_k
        cfg, k = cv.config, q.top_k
        n_lists = cfg.n_lists if cv.quantizer is not None else 1
        nprobe = max(1, min(nprobe, n_lists))
        t = stages.now()
        lists, coarse = self.plan(cv, x, nprobe)
        t = stages.lap("plan", t)
        req = SearchRequest(
            x, k, cfg.version, lists, coarse, q.filter, q.with_metadata, probing, q.rerank_mult
        )
        search = ShardClient.searching(cv.key, req, len(cv.shards))
        parts: list[SearchResult] = await self.fan_out(
            cv, [(s, search) for s in range(len(cv.shards))]
        )
        t = stages.lap("search", t)
        hits = merge_parts(parts, k, q.with_metadata)
        stages.lap("merge", t)
        # A shard on another training version assigned lists itself (results stay right);
        # refresh the view so the next plans use the new quantizer.
        cv = await self.refresh_if_stale(cv, [p.version for p in parts])
        # Fewer than top_k results while more items match: the probed lists ran dry, so probe
        # more lists for those queries (rare: tiny lists or a very selective filter; automatic
        # probing widens by itself and does not get here).
        need = min(k, sum(p.matched for p in parts))
        short = np.flatnonzero(hits.counts < need)
        n_lists = cv.config.n_lists if cv.quantizer is not None else 1
        if len(short) == 0 or probing.mode in ("greedy", "measure") or nprobe >= n_lists:
            return hits
        sub = await self._search(cv, x[short], q, min(n_lists, nprobe * 4), probing, merge_parts)
        return patch(hits, short, sub)

    async def upsert_batches(
        self, cv: CachedView, ids: list[str], make_batch: Callable[[np.ndarray], UpsertBatch]
    ) -> int:
        assign = await assign_shards(ids, cv.config.n_shards)
        calls: list[ShardCall] = []
        for s in range(len(cv.shards)):
            rows = np.flatnonzero(assign == s)
            if len(rows):
                calls.append((s, partial(_upsert, cv.key, make_batch(rows))))
        outcomes = await asyncio.gather(
            *(self.fan_out(cv, [call]) for call in calls), return_exceptions=True
        )
        failed = [(s, o) for (s, _), o in zip(calls, outcomes) if isinstance(o, BaseException)]
        if failed:
            raise unwritten(ids, assign, failed)
        stats = [o[0] for o in outcomes]  # type: ignore[index]
        touched = [s for s, _ in calls]
        for s, st in zip(touched, stats):
            cv.counts[s] = st.count
        await self.refresh_if_stale(cv, [st.version for st in stats])
        return sum(cv.counts.values()) if len(cv.counts) == cv.config.n_shards else -1

    async def by_shard(
        self,
        cv: CachedView,
        ids: list[str],
        call: Callable[[ShardClient, list[str]], Awaitable[T]],
    ) -> list[T]:
        """``call(shard, its ids)`` on every shard holding some of ``ids``."""
        assign = await assign_shards(ids, cv.config.n_shards)
        calls: list[ShardCall] = []
        for s in range(len(cv.shards)):
            sub = [ids[i] for i in np.flatnonzero(assign == s)]
            if sub:
                calls.append((s, partial(_with_ids, call, sub)))
        return await self.fan_out(cv, calls)

    async def all_shards(
        self, cv: CachedView, call: Callable[[ShardClient], Awaitable[T]]
    ) -> list[T]:
        return await self.fan_out(cv, [(s, call) for s in range(len(cv.shards))])

    async def count(self, cv: CachedView, footprint: bool = False) -> tuple[int, CachedView]:
        """Items in the index, and the view refreshed if a shard reported a newer version."""
        stats = await self.shard_stats(cv, footprint)
        fresh = await self.refresh_if_stale(cv, [st.version for st in stats], now=True)
        return sum(cv.counts.values()), fresh

    async def shard_stats(self, cv: CachedView, footprint: bool = False) -> list[ShardStats]:
        """Each shard's stats (with ``footprint``, its resident size too)."""
        stats = await self.all_shards(cv, lambda c: c.stats(cv.key, footprint))
        cv.counts = {s: st.count for s, st in enumerate(stats)}
        return stats

    async def memory(self, cv: CachedView) -> tuple[list[ShardStats], list[PoolStats]]:
        """Each partition's stats with its resident size, and its pool actor's memory."""
        stats = await self.shard_stats(cv, footprint=True)
        pools = await self.all_shards(cv, lambda c: c.pool_stats())
        return stats, pools

    async def delete(self, cv: CachedView, ids: list[str]) -> int:
        """Delete ``ids`` (distinct); returns how many existed."""
        if not ids:
            return 0
        return sum(await self.by_shard(cv, ids, lambda c, sub: c.delete(cv.key, sub)))

    async def match_ids(
        self,
        cv: CachedView,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None = None,
        ascending: bool = True,
    ) -> list[str]:
        """The ids of up to ``limit`` (None: all) items ``node`` matches, in ``order_by``'s order if given
        (each shard's matches in order, merged)."""
        parts = await self.all_shards(
            cv, lambda c: c.match_ids(cv.key, node, limit, order_by, ascending)
        )
        if order_by is None:
            return [i for part in parts for i in part][:limit]
        pairs = heapq.merge(*(map(tuple, p) for p in parts), reverse=not ascending)
        return [item_id for _, item_id in itertools.islice(pairs, limit)]

    async def page_ids(
        self, cv: CachedView, node: FilterNode | None, after: str, limit: int
    ) -> tuple[list[str], bool]:
        """One page of a cursor's scan: the first ``limit`` ids above ``after`` in id order
        of the items ``node`` matches (each shard's first ``limit + 1``, merged), and whether
        any is left after them."""
        parts = await self.all_shards(
            cv, lambda c: c.match_ids(cv.key, node, limit + 1, None, True, after)
        )
        merged = list(itertools.islice(heapq.merge(*parts), limit + 1))
        return merged[:limit], len(merged) > limit

    async def fetch(
        self, cv: CachedView, ids: list[str], vectors: bool, metadata: bool, contents: bool
    ) -> dict[str, dict[str, Any]]:
        """The stored fields of ``ids`` that exist: id -> {id, vector?, contents?, metadata?}."""
        parts = await self.by_shard(
            cv, ids, lambda c, sub: c.get(cv.key, sub, vectors, metadata, contents)
        )
        if len(ids) <= constants.INLINE_HASHES:
            return entries(parts)
        return await asyncio.to_thread(entries, parts)


class Single(NamedTuple):
    """A single query waiting for its batch (Engine.search_one)."""

    cv: CachedView
    x: np.ndarray  # (1, d)
    timer: stages.Timer | None  # its request's stage timer


def unwritten(
    ids: list[str], assign: np.ndarray, failed: list[tuple[int, BaseException]]
) -> BaseException:
    """The error of an upsert some shards failed: the first failure, as it was when nothing
    of the request was written; else saying which items were not (``errors[0]["ids"]``), the
    others being written (upserting the same items again is safe)."""
    first = failed[0][1]
    failure = cause(first.failure) if isinstance(first, PiecesWritten) else first
    if not isinstance(failure, VaultvecError):
        return failure
    written = {i for _, o in failed if isinstance(o, PiecesWritten) for i in o.written}
    lost = {s for s, _ in failed}
    missing = [i for i, s in zip(ids, assign.tolist()) if s in lost and i not in written]
    if len(missing) == len(ids):
        return failure
    detail = (
        f"{failure.detail} ({len(missing)} of the request's {len(ids)} items were not written: "
        "their ids are in errors; the others were, and upserting the same items again is safe)"
    )
    errors = [{"loc": ["items"], "msg": "not written", "type": "not_written", "ids": missing}]
    return type(failure)(detail, errors=errors)


def plan_width(probing: Probing) -> int:
    """Lists the gateway assigns a query under automatic probing: room for the rule to widen
    well past ``first`` (a shard assigns more itself for a query that needs them), and every
    list a kind probed with a fixed count scans."""
    fixed = max((fixed_lists(m, probing.first) for m in probing.fixed if m > 0), default=0)
    return max(4 * probing.first + 8, fixed)


def _with_ids(
    call: Callable[[ShardClient, list[str]], Awaitable[T]], ids: list[str], shard: ShardClient
) -> Awaitable[T]:
    return call(shard, ids)


def _upsert(key: bytes, batch: UpsertBatch, shard: ShardClient) -> Awaitable[ShardStats]:
    return shard.upsert(key, batch)


GREEDY = Probing("greedy")
