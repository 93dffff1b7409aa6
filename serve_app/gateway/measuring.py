"""How the gateway measures its automatic probing (serve_app.gateway.probing): which queries
of an answered batch are measured, and their exact answers in the background, one batch at a
time; and, for a batch of a kind with no fitted scale yet, some of its rows before it is
answered. serve_app.gateway.engine.Engine inherits it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from actors.control.client import ControlClient
from actors.types import EXACT_SCAN, Probing
from serve_app import constants
from serve_app import telemetry as stages
from serve_app.gateway.hits import Hits, Query
from serve_app.gateway.probing import IndexProbing, Needs, RecallMonitor, overlap

if TYPE_CHECKING:
    from serve_app.gateway.engine import CachedView

log = logging.getLogger("vaultvec.engine")


class Job(NamedTuple):
    """Sampled queries of one answered batch, with what they were served."""

    cv: CachedView
    x: np.ndarray
    q: Query
    probing: Probing
    served: list[list[str | None]]


class Warm(NamedTuple):
    """Rows of a batch measured before it was answered."""

    rows: np.ndarray


def _items(cv: CachedView) -> int:
    """The items a search covers: as the shards last reported, else as many as were trained on."""
    cfg = cv.config
    return sum(cv.counts.values()) if len(cv.counts) == cfg.n_shards else cfg.trained_size


def _needs(exact: Hits, probing: Probing) -> Needs:
    assert exact.needed is not None
    return Needs(exact.needed, exact.lists_needed, exact.reach, probing.first)


class Measuring:
    monitor: RecallMonitor
    control: ControlClient
    _measuring: set[asyncio.Task[None]]

    async def _search(
        self, cv: CachedView, x: np.ndarray, q: Query, nprobe: int, probing: Probing
    ) -> Hits:
        raise NotImplementedError

    async def _warm_up(
        self, cv: CachedView, x: np.ndarray, q: Query, probing: Probing, state: IndexProbing
    ) -> Warm | None:
        """A batch of a kind with no fitted scale yet (RecallMonitor.warm_rows): measure some
        of its rows before it is answered, so that the batch itself is answered with the
        scale they fit (one such batch of a kind at a time). Returns what :meth:`_warmed`
        records once it is answered."""
        filtered = q.filter is not None
        rows = self.monitor.warm_rows(len(x), q.top_k, state, _items(cv), filtered)
        if not len(rows):
            return None
        state.warming.add(filtered)
        try:
            exact = await self._exact(cv, x[rows], q, probing)
            if exact.needed is None:  # a shard on another training version searched as planned
                return None
            had_scale = state.buckets[exact.bucket].measured >= constants.RECALL_MIN_SAMPLES
            if had_scale or exact.bucket == EXACT_SCAN:
                state.warmed_in_vain += 1  # its kind had a scale, or needs none: need not wait
            state.learn(exact.bucket, _needs(exact, probing), ahead=False)
        except Exception as exc:  # answered without it, as after a failed measurement
            log.warning(
                "recall measurement on index %s failed: %s", cv.view.meta.name, type(exc).__name__
            )
            return None
        finally:
            state.warming.discard(filtered)
        return Warm(rows)

    def _warmed(self, cv: CachedView, warm: Warm, state: IndexProbing) -> None:
        """Count the rows :meth:`_warm_up` measured. Their served recall is not recorded: the
        scale was fitted on them, so it would flatter the estimate."""
        state.sampled += len(warm.rows)
        try:
            self._keep(cv, state, early=True)
        except Exception as exc:  # kept at the next measurement instead
            log.warning(
                "keeping the probing state of %s failed: %s", cv.view.meta.name, type(exc).__name__
            )

    async def _exact(self, cv: CachedView, x: np.ndarray, q: Query, probing: Probing) -> Hits:
        # The shards search every list themselves: the plan sent is one list wide.
        measure = replace(probing, mode="measure")
        return await self._search(cv, x, replace(q, with_metadata=False), 1, measure)

    def _keep(self, cv: CachedView, state: IndexProbing, early: bool) -> None:
        """Hand the learned state to the control plane (a restart starts from it): at every
        early measurement once learned, later every RECALL_SAVE_S."""
        now = time.monotonic()
        learned = state.seeded or state.sampled >= constants.RECALL_EARLY
        if learned and (early or now - state.saved_at > constants.RECALL_SAVE_S):
            state.saved_at = now
            cfg = cv.config
            self.control.save_probing(cv.view.meta.name, cv.key, cfg.version, state.pack())

    def _sample(
        self,
        cv: CachedView,
        x: np.ndarray,
        q: Query,
        probing: Probing,
        hits: Hits,
        state: IndexProbing,
    ) -> None:
        """Measure the rows RecallMonitor.pick chooses of a batch just answered, in the
        background (after the batch under way, for early ones)."""
        rows = self.monitor.pick(len(x), q.top_k, state, _items(cv), hits.bucket)
        if not len(rows):
            return
        job = Job(cv, x[rows], q, probing, hits.ids.take_rows(rows).tolist())
        if self.monitor.busy:  # an early one: measured after the one under way
            self.monitor.waiting.append(job)
            return
        task = asyncio.create_task(self._measure(job))
        self._measuring.add(task)
        task.add_done_callback(self._measuring.discard)

    async def _measure(self, job: Job) -> None:
        """Answer sampled queries exactly, with the scale each exact result needs, and record
        them (serve_app.gateway.probing); one batch at a time, then those that waited
        meanwhile (RecallMonitor.pick samples nothing else meanwhile). After each, it rests
        RECALL_REST times as long as the measurement took: measurements take at most a
        1 / (1 + RECALL_REST) share of the time, so of the shards' CPUs."""
        stages.detach()  # not a stage of the request whose context this task copied
        self.monitor.busy = True
        try:
            next_job: Any = job
            while next_job is not None:
                started = time.monotonic()
                await self._measure_one(next_job)
                await asyncio.sleep((time.monotonic() - started) * constants.RECALL_REST)
                next_job = self.monitor.waiting.popleft() if self.monitor.waiting else None
        finally:
            self.monitor.busy = False

    async def _measure_one(self, job: Job) -> None:
        cv = job.cv
        try:
            cfg = cv.config
            exact = await self._exact(cv, job.x, job.q, job.probing)
            assert exact.needed is not None
            state = self.monitor.of(cfg.index_id, cfg.version, cfg.recall_target)
            early = state.sampled < constants.RECALL_EARLY
            served = overlap(job.served, exact.ids.tolist())
            state.record(exact.bucket, served, _needs(exact, job.probing))
            self._keep(cv, state, early)
        except Exception as exc:  # the query went on without it; say why, never what it was
            log.warning(
                "recall measurement on index %s failed: %s", cv.view.meta.name, type(exc).__name__
            )
