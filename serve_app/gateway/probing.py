"""The gateway's live recall estimate per index, and the probing rules it fits.

The first RECALL_EARLY queries of each kind, then a share of the queries answered with
automatic probing (``VAULTVEC_RECALL_SAMPLE_SHARE``, default 1%), are answered once more in
the background, exactly (every list, same filter); a batch of a kind with no fitted rule yet
has some of its rows measured before it is answered (:meth:`RecallMonitor.warm_rows`). The
shards then also tell, for each exact result, the smallest probing scale with which automatic
probing scans its list (actors.engine.adaptive.slack_needed: the first pass of the rule does not
depend on the slack, so one exact search gives the whole curve of that query's recall against
the scale) and how many lists in centroid order find it; and per query, the lists the rule
scans at each of a range of scales. Two things follow per index:

* the estimate: the recall@k of the answers actually served, measured on the sampled queries
  (the share of the exact top-k the served top-k held), over the last ``RECALL_WINDOW`` of
  them;
* the rules: per kind of query (unfiltered or a filter matching at least 95% of the items, a
  filter matching at least 30%, a more selective one), the smallest multiple of the calibrated
  slack whose recall over the last ``RECALL_WINDOW`` sampled queries of that kind reaches the
  target plus a margin (computed exactly from the needs: :func:`_fitted`); and
  the smallest fixed count of lists (a multiple of the calibrated first pass, so it grows with
  top_k as the first pass does) that reaches it too. The kind is probed with the fixed count
  where it scans clearly fewer lists on those queries (``RECALL_FIXED_SAVING``; a first batch
  answered with what its own measured rows fit, wherever it scans fewer), else with the
  adaptive rule, which follows a drift in how hard the queries are: on sets whose hard queries
  stand out the adaptive rule wins; under a filter that pushes the k-th match out, a fixed
  count may (docs/performance.md). Probing thus widens when real queries need more than
  calibration on stored items predicted, and narrows when they need less; a kind keeps scale 1
  until it has ``RECALL_MIN_SAMPLES`` measured queries.

Bounded: one background exact search in flight per gateway replica, at most
``RECALL_MAX_ROWS`` queries in it past the early ones (RECALL_EARLY_ROWS and RECALL_EARLY_WORK
bound those and the first batches'), top_k up to ``RECALL_MAX_K`` (serve_app.constants), a rest
of RECALL_REST times its duration after each; queries sampled meanwhile are not measured
(early ones wait their turn, RECALL_EARLY_WAITING at most). The sampled vectors, filters and
results live only in that task's memory; nothing about them is stored or logged. Each gateway
replica keeps its own estimate and scales; a training swap (new version) starts them afresh.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from actors.control.training import smallest_scale
from actors.storage import codec
from actors.types import BUCKETS, EXACT_SCAN, REACH_SCALES, fixed_lists
from serve_app import constants

log = logging.getLogger("vaultvec.probing")


class Needs(NamedTuple):
    """What measured queries' exact results need (a measure search's answer): per result the
    probing scale (rows, nan = no result) and the lists in centroid order; per query the lists
    the adaptive rule scans at each REACH_SCALES; the ``first`` they were measured with."""

    needed: np.ndarray
    lists: np.ndarray | None = None
    reach: np.ndarray | None = None
    first: int = 1


@dataclass
class Bucket:
    """One kind of query's rule: the adaptive rule at ``scale``, or where a fixed count of
    lists reached the recall aim in fewer lists on the measured queries, that count (``fixed``
    times the query's ``first``). Per measured query with results: the scale each result
    needs, the lists in centroid order each needs as a multiple of the query's ``first``
    (None: not told, by a state an earlier vaultvec kept), and the lists the adaptive rule
    scans at each REACH_SCALES."""

    scale: float = 1.0
    fixed: float = 0.0
    needed: deque[np.ndarray] = field(default_factory=lambda: deque(maxlen=constants.RECALL_WINDOW))
    lists: deque[np.ndarray | None] = field(
        default_factory=lambda: deque(maxlen=constants.RECALL_WINDOW)
    )
    reach: deque[np.ndarray | None] = field(
        default_factory=lambda: deque(maxlen=constants.RECALL_WINDOW)
    )
    firsts: deque[int] = field(default_factory=lambda: deque(maxlen=constants.RECALL_WINDOW))
    measured: int = 0  # queries measured, with or without an exact result

    def add(
        self, needed: np.ndarray, lists: np.ndarray | None, reach: np.ndarray | None, first: int
    ) -> None:
        """One measured query's needs (rows of one length; lists None when not told)."""
        self.needed.append(needed)
        self.firsts.append(first)
        if lists is None or reach is None or np.isnan(lists).any():
            self.lists.append(None)
            self.reach.append(None)
        else:
            self.lists.append(lists / max(first, 1))
            self.reach.append(np.asarray(reach, dtype=np.float64))

    def fit(self, target: float, ahead: bool = True) -> None:
        """The adaptive rule's scale, and a fixed count of lists instead where it costs clearly
        fewer lists on the measured queries (RECALL_FIXED_SAVING), each reaching the target plus
        the margin :func:`_fitted` gives: for queries not seen yet (``ahead``), or for the
        batch the measured queries were drawn from, answered next. For that batch the fixed
        count is taken wherever it costs fewer lists: the bar guards against queries to come
        growing harder, which a batch sampled by its own measured rows does not."""
        if len(self.needed) < constants.RECALL_MIN_SAMPLES:
            return
        self.scale = _fitted(self.needed, target, ahead)
        self.fixed = 0.0
        told = self.told()
        if told is None:
            return
        lists, reach = told
        fixed = _fitted(lists, target, ahead)
        fixed_cost = np.mean([fixed_lists(fixed, f) for f in self.firsts])
        # interpolating is linear in the values: the mean of the queries' lists at the scale
        adaptive_cost = np.interp(math.log2(self.scale), _REACH_LOG2, np.mean(reach, axis=0))
        if fixed_cost < (constants.RECALL_FIXED_SAVING if ahead else 1.0) * adaptive_cost:
            self.fixed = fixed

    def told(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """(lists, reach) of every query in the window; None when some were not told."""
        lists = [r for r in self.lists if r is not None]
        reach = [r for r in self.reach if r is not None]
        if not len(lists) or not len(self.needed) == len(lists) == len(reach):
            return None
        return lists, reach


_REACH_LOG2 = np.log2(REACH_SCALES)


def _fitted(needs: Sequence[np.ndarray], target: float, ahead: bool = True) -> float:
    """The smallest value (scale, or multiple of ``first``) at which the mean recall of the
    queries whose per-result needs are ``needs`` reaches ``target``, then once more the target
    plus a margin of RECALL_MARGIN_SE standard errors of the difference between their recall
    there and the recall of the queries the rule answers:

    * ``ahead``, as many queries not seen yet: both means err by one standard error, so their
      difference by sqrt(2) of them;
    * else a batch the measured queries are ``m`` of ``m + u`` rows of: the batch's mean differs
      from theirs by u/(m+u) times the difference of two means, at most one standard error.

    The rule is then unlikely to fall short on the next queries as many as it learned from (a
    user's evaluation set), not only on average over all queries to come."""
    width = max(len(r) for r in needs)
    rows = np.full((len(needs), width), np.nan)
    for i, r in enumerate(needs):
        rows[i, : len(r)] = r
    value = smallest_scale(rows, target)
    valid = ~np.isnan(rows)
    per_query = (np.where(valid, rows, np.inf) < value).sum(axis=1) / np.maximum(
        valid.sum(axis=1), 1
    )
    se = float(np.std(per_query)) / math.sqrt(len(per_query)) * (math.sqrt(2) if ahead else 1)
    return smallest_scale(rows, min(1.0, target + constants.RECALL_MARGIN_SE * se))


@dataclass
class IndexProbing:
    """One index's counters and scales at one gateway replica (for its training version)."""

    version: int
    target: float
    buckets: tuple[Bucket, ...] = field(default_factory=lambda: tuple(Bucket() for _ in BUCKETS))
    served: deque[float] = field(default_factory=lambda: deque(maxlen=constants.RECALL_WINDOW))
    sampled: int = 0  # queries measured
    queries: int = 0  # queries answered with automatic probing
    lists_scanned: float = 0.0  # their lists scanned (per query, averaged over shards), summed
    # When this replica last handed it to the control plane (monotonic), and whether it may:
    # one it started afresh only once it measured RECALL_EARLY queries, so that it does not
    # replace a longer-learned state another replica (or an earlier run) kept.
    saved_at: float = field(default_factory=time.monotonic)
    seeded: bool = False
    # Filtered batches measured before being answered whose bucket had a scale already.
    warmed_in_vain: int = 0
    warming: set[bool] = field(default_factory=set)  # (filtered?) kinds measured first now

    @property
    def scales(self) -> tuple[float, ...]:
        """The probing kinds' scales (not EXACT_SCAN's: no scale applies to it)."""
        return tuple(b.scale for b in self.buckets[:EXACT_SCAN])

    @property
    def fixed(self) -> tuple[float, ...]:
        """The probing kinds' fixed counts of lists, as multiples of ``first`` (0: adaptive)."""
        return tuple(b.fixed for b in self.buckets[:EXACT_SCAN])

    def record(self, bucket: int, served: np.ndarray, exact: Needs) -> None:
        """Measured queries: recall of what was served (per query), and what their exact
        results need (:meth:`learn`)."""
        self.learn(bucket, exact)
        self.count_served(served)

    def learn(self, bucket: int, exact: Needs, ahead: bool = True) -> None:
        """What each exact result of measured queries needs, and the bucket's rule fitted
        again (for queries not seen yet, or ``ahead`` False: for the batch they are rows of)."""
        b = self.buckets[bucket]
        b.measured += len(exact.needed)
        for i, row in enumerate(exact.needed):
            keep = ~np.isnan(row)
            if keep.any():
                lists = None if exact.lists is None else exact.lists[i][keep]
                reach = None if exact.reach is None else exact.reach[i]
                b.add(row[keep], lists, reach, exact.first)
        b.fit(self.target, ahead)

    def count_served(self, served: np.ndarray) -> None:
        """The recall of what measured queries were served (per query)."""
        self.served.extend(float(r) for r in served)
        self.sampled += len(served)

    def early_left(self, bucket: int) -> int:
        """How many more queries of ``bucket`` are measured early (all of them, up to
        RECALL_EARLY measured per bucket; none of those scanned exactly, which have no scale
        to learn: they are sampled at the share)."""
        if bucket == EXACT_SCAN:
            return 0
        return max(0, constants.RECALL_EARLY - self.buckets[bucket].measured)

    def cold(self, filtered: bool) -> bool:
        """Whether a query's bucket may still have no fitted scale: unfiltered, the first
        bucket; filtered, a selective bucket (which one the shards tell only once they
        searched)."""
        buckets = self.buckets[1:EXACT_SCAN] if filtered else self.buckets[:1]
        return any(b.measured < constants.RECALL_MIN_SAMPLES for b in buckets)

    def pack(self) -> bytes:
        """The learned state (scales, measured needs, served recall, counters) as bytes, for
        the control plane to keep sealed with the index (restored by :meth:`unpack`)."""
        meta = {
            "version": self.version,
            "target": self.target,
            "scales": list(self.scales),
            "fixed": list(self.fixed),
            "sampled": self.sampled,
            "queries": self.queries,
            "lists_scanned": self.lists_scanned,
            "measured": [b.measured for b in self.buckets],
        }
        arrays: dict[str, np.ndarray] = {"served": np.asarray(self.served, dtype=np.float64)}
        for i, b in enumerate(self.buckets):
            lens = np.array([len(r) for r in b.needed], dtype=np.int64)
            arrays[f"lens{i}"] = lens
            arrays[f"needed{i}"] = (
                np.concatenate(list(b.needed)) if len(b.needed) else np.zeros(0, np.float64)
            )
            told = b.told()
            if len(b.needed) and told is not None:
                arrays[f"lists{i}"] = np.concatenate(told[0])
                arrays[f"reach{i}"] = np.stack(told[1])
                arrays[f"firsts{i}"] = np.asarray(b.firsts, dtype=np.int64)
        return codec.pack(meta, arrays)

    @classmethod
    def unpack(cls, data: bytes) -> IndexProbing:
        meta, arrays = codec.unpack(data)
        state = cls(int(meta["version"]), float(meta["target"]))
        state.served.extend(arrays["served"].tolist())
        state.sampled, state.queries = int(meta["sampled"]), int(meta["queries"])
        state.lists_scanned = float(meta["lists_scanned"])
        scales = meta["scales"]
        kept = len(meta["measured"]) if "measured" in meta else len(scales)
        # a state kept before a kind was added has none of it: that kind starts afresh
        fixed = meta.get("fixed", [])  # a state kept before fixed counts: adaptive throughout
        for i, b in enumerate(state.buckets[:kept]):
            b.scale = float(scales[i]) if i < len(scales) else 1.0
            b.fixed = float(fixed[i]) if i < len(fixed) else 0.0
            lens = arrays[f"lens{i}"]
            b.measured = int(meta["measured"][i]) if "measured" in meta else len(lens)
            if not len(lens):
                continue
            cuts = np.cumsum(lens)[:-1]
            needed = np.split(arrays[f"needed{i}"].astype(np.float64), cuts)
            if f"lists{i}" in arrays:
                lists = np.split(arrays[f"lists{i}"].astype(np.float64), cuts)
                reach, firsts = arrays[f"reach{i}"].astype(np.float64), arrays[f"firsts{i}"]
                for n, li, r, f in zip(needed, lists, reach, firsts.tolist()):
                    b.needed.append(n)
                    b.lists.append(li)
                    b.reach.append(r)
                    b.firsts.append(int(f))
            else:
                for n in needed:
                    b.add(n, None, None, 1)
        return state

    def report(self) -> dict[str, Any]:
        """describe's ``recall``: the live estimate and what drives automatic probing."""
        return {
            "estimate": round(float(np.mean(self.served)), 4) if self.served else None,
            "target": self.target,
            "sampled_queries": self.sampled,
            "probe_scale": {
                name: round(b.scale, 4)
                for name, b in zip(BUCKETS[:EXACT_SCAN], self.buckets[:EXACT_SCAN])
            },
            "probe_fixed": {
                name: round(b.fixed, 4)
                for name, b in zip(BUCKETS[:EXACT_SCAN], self.buckets[:EXACT_SCAN])
                if b.fixed > 0
            },
            "auto_queries": self.queries,
            "lists_scanned_per_query": (
                round(self.lists_scanned / self.queries, 2) if self.queries else None
            ),
        }


class RecallMonitor:
    def __init__(self, share: float = 0.01, seed: int | None = None) -> None:
        self.share = share
        self.busy = False
        self.waiting: deque[tuple[Any, ...]] = deque()  # early batches, measured after busy
        self._rng = random.Random(seed)
        self._indexes: OrderedDict[str, IndexProbing] = OrderedDict()

    def of(
        self, index_id: str, version: int, target: float, stored: bytes | None = None
    ) -> IndexProbing:
        """The index's state (fresh for a new training version, or what ``stored`` kept of
        this one: IndexProbing.pack); the least recently queried of more than
        RECALL_MAX_INDEXES are dropped (their scales start again at 1)."""
        state = self._indexes.get(index_id)
        if state is None or state.version != version:
            kept = _unpacked(stored) if stored else None
            if kept is not None and kept.version == version:
                kept.seeded = True
                state = self._indexes[index_id] = kept
            else:
                state = self._indexes[index_id] = IndexProbing(version, target)
            while len(self._indexes) > constants.RECALL_MAX_INDEXES:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(index_id)
        return state

    def states(self) -> list[tuple[str, IndexProbing]]:
        """Every index's state at this replica (a copy of the table: safe to iterate)."""
        return list(self._indexes.items())

    def peek(self, index_id: str, version: int) -> IndexProbing | None:
        state = self._indexes.get(index_id)
        return state if state is not None and state.version == version else None

    def warm_rows(
        self, nq: int, k: int, state: IndexProbing, items: int, filtered: bool
    ) -> np.ndarray:
        """Rows of a batch to measure before it is answered: while the batch's bucket has no
        fitted scale (IndexProbing.cold), as many as an exact search over ``items`` items
        within RECALL_EARLY_WORK allows (at most RECALL_EARLY_ROWS), provided they are enough
        to fit one (RECALL_MIN_SAMPLES); else none, and the batch is measured after it is
        answered (:meth:`pick`). A filtered batch's bucket is known only once it is searched:
        after RECALL_WARM_IN_VAIN filtered batches measured for a bucket that had a scale,
        filtered batches are no longer measured first."""
        if self.share <= 0 or k > constants.RECALL_MAX_K or not state.cold(filtered):
            return np.zeros(0, dtype=np.int64)
        if filtered and state.warmed_in_vain >= constants.RECALL_WARM_IN_VAIN:
            return np.zeros(0, dtype=np.int64)
        if filtered in state.warming:  # another batch of the kind is measured first already
            return np.zeros(0, dtype=np.int64)
        fit = constants.RECALL_EARLY_WORK // items if items > 0 else constants.RECALL_MAX_ROWS
        count = min(nq, fit, constants.RECALL_EARLY_ROWS)
        if count < constants.RECALL_MIN_SAMPLES:
            return np.zeros(0, dtype=np.int64)
        return np.sort(np.asarray(self._rng.sample(range(nq), count), dtype=np.int64))

    def pick(
        self, nq: int, k: int, state: IndexProbing | None = None, items: int = 0, bucket: int = 0
    ) -> np.ndarray:
        """Rows of a batch of ``nq`` queries to measure (none while a measurement runs, except
        early ones, up to RECALL_EARLY_WAITING batches that wait their turn): every one while
        ``state`` has measured fewer than RECALL_EARLY queries of the batch's ``bucket`` (so
        its estimate and scales settle within its first few hundred), as many of a batch as an exact
        search over ``items`` items within RECALL_EARLY_WORK allows (RECALL_MAX_ROWS when the
        count is not known, at most RECALL_EARLY_ROWS); then each with probability ``share``,
        up to RECALL_MAX_ROWS."""
        left = state.early_left(bucket) if state is not None else 0
        early = left > 0
        if self.share <= 0 or nq == 0 or k > constants.RECALL_MAX_K:
            return np.zeros(0, dtype=np.int64)
        if self.busy and not (early and len(self.waiting) < constants.RECALL_EARLY_WAITING):
            return np.zeros(0, dtype=np.int64)
        if early:
            assert state is not None
            fit = constants.RECALL_EARLY_WORK // items if items > 0 else constants.RECALL_MAX_ROWS
            fit = max(1, min(fit, constants.RECALL_EARLY_ROWS))
            count = min(nq, fit, left)
            return np.sort(np.asarray(self._rng.sample(range(nq), count), dtype=np.int64))
        count = sum(self._rng.random() < self.share for _ in range(min(nq, 64)))
        if nq > 64:
            count = int(np.random.default_rng(self._rng.getrandbits(32)).binomial(nq, self.share))
        if count == 0:  # most single queries
            return np.zeros(0, dtype=np.int64)
        rows = self._rng.sample(range(nq), min(count, constants.RECALL_MAX_ROWS))
        return np.sort(np.asarray(rows, dtype=np.int64))


def _unpacked(stored: bytes) -> IndexProbing | None:
    """The kept state, or None when it does not read (a vaultvec that kept it otherwise): the
    index then learns afresh rather than fail its queries."""
    try:
        return IndexProbing.unpack(stored)
    except (KeyError, IndexError, ValueError, TypeError):
        log.warning("the kept probing state does not read; learning afresh")
        return None


def overlap(found: list[list[str | None]], exact: list[list[str | None]]) -> np.ndarray:
    """Per query: the share of the exact top-k (its non-empty entries) that ``found`` holds;
    1.0 where the exact answer is empty."""
    out = np.ones(len(exact), dtype=np.float64)
    for i, (f, e) in enumerate(zip(found, exact)):
        truth = {x for x in e if x is not None}
        if truth:
            out[i] = len(truth.intersection(f)) / len(truth)
    return out
