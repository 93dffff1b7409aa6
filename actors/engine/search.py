"""How a partition is searched: the probing strategies a shard runs a search request with, over
the partition's inverted lists (actors.engine.ivf.PartitionIndex.search: the given lists of each
query).

A request says how to probe (actors.types.Probing); :func:`strategy_for` picks the strategy:

- **fixed**: the lists the gateway planned, as given (an explicit ``n_probes``, the calibrated
  table, or an untrained index's one list: an exact search);
- **adaptive**: automatic probing, each query scanning as many lists as what it finds asks for
  (actors.engine.adaptive), or a fixed count of lists for a kind of query the gateway found
  that cheaper for, or under a filter matching few items, an exact scan of those
  (:func:`exact_matching`);
- **measure**: every list, exactly, with what each result needed (actors.engine.adaptive
  .probe_needs), for the gateway's recall estimate and its choice of rule;
- **greedy**: lists in centroid order until no unprobed list can hold a closer item
  (:func:`greedy`).

A new scorer (a text index's, say) is one more strategy and one more mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import faiss
import numpy as np
from faiss import swig_ptr

from actors.engine.adaptive import adaptive, list_ranks, probe_needs
from actors.engine.ivf import PartitionIndex
from actors.engine.selection import Selection
from actors.engine.topk import merge_topk
from actors.types import (
    EXACT_SCAN,
    REACH_SCALES,
    SearchRequest,
    auto_nprobe,
    fixed_lists,
    probe_slack,
)


def greedy(
    part: PartitionIndex, x: np.ndarray, k: int, start_nprobe: int, selector_bits: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probe lists in centroid order until no unprobed list can hold a closer point.

    A point p in list j satisfies |q - p| >= |q - c_j| - r_j (r_j: the list's radius), so a
    query is done once the smallest such bound over its unprobed lists reaches its k-th
    distance. Unfinished queries double their probe count each round. Returns (distances,
    labels, lists probed per query).
    """
    nlist = part.nlist
    dis_c, lists = part.assign(x, nlist)
    lower = np.sqrt(np.maximum(dis_c, 0)) - part.radii[lists]
    # suffix_min[:, j] = best bound among lists j.. (inf past the end)
    suffix_min = np.minimum.accumulate(lower[:, ::-1], axis=1)[:, ::-1]
    suffix_min = np.concatenate([suffix_min, np.full((len(x), 1), np.inf, np.float32)], axis=1)
    p = max(1, min(start_nprobe, nlist))
    distances, labels = part.search(x, k, lists[:, :p], dis_c[:, :p], selector_bits)
    probed = np.full(len(x), p, dtype=np.int64)
    while True:
        kth = np.sqrt(np.maximum(distances[:, k - 1], 0))
        todo = np.flatnonzero((probed < nlist) & (suffix_min[np.arange(len(x)), probed] < kth))
        if len(todo) == 0:
            return distances, labels, probed
        start = int(probed[todo].min())
        stop = min(nlist, 2 * int(probed[todo].max()))
        # Queries in one round share a window [start, stop); lists a query already probed
        # are masked out by giving them list number -1, which faiss skips.
        window = lists[todo, start:stop].copy()
        cols = np.arange(start, stop)
        window[cols[None, :] < probed[todo, None]] = -1
        d2, l2 = part.search(x[todo], k, window, dis_c[todo, start:stop], selector_bits)
        distances[todo], labels[todo] = merge_topk([distances[todo], d2], [labels[todo], l2], k)
        probed[todo] = stop


# -- the strategies ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scope:
    """What the shard adds to a request: its training version, its calibrated n_probes table,
    and the request's filter evaluated on it (actors.engine.selection)."""

    version: int
    nprobe_table: tuple[tuple[int, int], ...]
    selection: Selection
    items: int  # live items on the shard

    @property
    def selectivity(self) -> float:
        return self.selection.matched / max(1, self.items)


@dataclass
class Found:
    distances: np.ndarray  # (nq, k) squared L2 in index space
    labels: np.ndarray  # (nq, k) int64, -1 where empty
    scanned: int  # inverted lists scanned, summed over the queries
    needed: np.ndarray | None = None  # measure: the probing scale each result needs
    bucket: int = 0  # adaptive, measure: the selectivity bucket whose scale applied (EXACT_SCAN)
    lists_needed: np.ndarray | None = None  # measure: list_ranks of the results
    reach: np.ndarray | None = None  # measure: lists the adaptive rule scans at REACH_SCALES


Strategy = Callable[[PartitionIndex, SearchRequest, "np.ndarray | None", Scope], Found]


def fixed(part: PartitionIndex, req: SearchRequest, bits: np.ndarray | None, scope: Scope) -> Found:
    """The planned lists as given; planned with another training version than this
    partition's (a swap under way, or the gateway's view stale), the lists are assigned here
    with this version's probes."""
    list_nos, coarse = req.list_nos, req.coarse_dis
    nq, nprobe = len(req.queries), list_nos.shape[1]
    scanned = nq * nprobe
    if req.version != scope.version:
        nprobe = req.probing.n_probes or auto_nprobe(scope.nprobe_table, part.nlist, req.k)
        coarse, list_nos = part.assign(req.queries, nprobe)
        scanned = nq * min(nprobe, part.nlist)
    dist, labels = part.search(req.queries, req.k, list_nos, coarse, bits)
    return Found(dist, labels, scanned)


def adaptive_strategy(
    part: PartitionIndex, req: SearchRequest, bits: np.ndarray | None, scope: Scope
) -> Found:
    p = req.probing
    slack, _, bucket = probe_slack(p.slacks, p.scales, scope.selectivity)
    if scope.selection.scan_exactly(part, len(req.queries), _probe_items(part, scope, req.k)):
        return exact_matching(part, req, scope)
    first = p.first
    if p.fixed[bucket] > 0:  # a fixed count of lists, which the gateway found cheaper
        first, slack = fixed_lists(p.fixed[bucket], p.first), 0.0
    counts = scope.selection.counts(part)
    dist, labels, per_query = adaptive(
        part, req.queries, req.k, req.list_nos, req.coarse_dis, bits, first, slack, counts
    )
    return Found(dist, labels, int(per_query.sum()), None, bucket)


def _probe_items(part: PartitionIndex, scope: Scope, k: int) -> float:
    """The unfiltered calibrated probe's distance computations: an exact scan of at most as
    many matching items costs no more."""
    return auto_nprobe(scope.nprobe_table, part.nlist, k) * part.ntotal / max(1, part.nlist)


def exact_matching(part: PartitionIndex, req: SearchRequest, scope: Scope) -> Found:
    """A selective filter's exact answer: every matching item's distance (Selection.gathered).
    Its lists scanned are counted as the lists that many items fill on average."""
    labels, vectors = scope.selection.gathered(part)
    nq, k = len(req.queries), req.k
    distances = np.full((nq, k), np.inf, dtype=np.float32)
    found = np.full((nq, k), -1, dtype=np.int64)
    kk = min(k, len(labels))
    if kk:
        x = np.ascontiguousarray(req.queries, dtype=np.float32)
        _, rows = faiss.knn(x, vectors, kk)
        # The winners' distances again as the lists' scan computes them (fvec_L2sqr), not in
        # the expanded form faiss.knn uses for batches: the same item gets the same distance
        # either way, across shards and strategies.
        d = np.empty(rows.shape, dtype=np.float32)
        qi = np.repeat(np.arange(nq, dtype=np.int64), kk)
        vi = np.ascontiguousarray(rows.reshape(-1), dtype=np.int64)
        faiss.pairwise_indexed_L2sqr(
            x.shape[1],
            len(qi),
            swig_ptr(x),
            swig_ptr(qi),
            swig_ptr(vectors),
            swig_ptr(vi),
            swig_ptr(d),
        )
        order = np.argsort(d, axis=1, kind="stable")
        distances[:, :kk] = np.take_along_axis(d, order, axis=1)
        found[:, :kk] = labels[np.take_along_axis(rows, order, axis=1)]
    per_query = math.ceil(len(labels) * part.nlist / max(1, part.ntotal))
    return Found(distances, found, nq * per_query, None, EXACT_SCAN)


def measure(
    part: PartitionIndex, req: SearchRequest, bits: np.ndarray | None, scope: Scope
) -> Found:
    """Exact (every list), with what each result needs: the scale of the slack and the lists in
    centroid order; and per query the lists the adaptive rule scans at each REACH_SCALES (the
    gateway's recall estimate and its choice of rule: serve_app.gateway.probing)."""
    p = req.probing
    _, base, bucket = probe_slack(p.slacks, p.scales, scope.selectivity)
    coarse, list_nos = part.assign(req.queries, part.nlist)
    dist, labels = part.search(req.queries, req.k, list_nos, coarse, bits)
    nq = len(req.queries)
    if scope.selection.exact_eligible(part, _probe_items(part, scope, req.k)):
        # its queries are scanned exactly: no lesson for probing, none worked out
        needed = lists = np.full(labels.shape, np.nan)
        exact = math.ceil(scope.selection.matched * part.nlist / max(1, part.ntotal))
        reach = np.full((nq, len(REACH_SCALES)), exact, dtype=np.int32)
        bucket = EXACT_SCAN
    else:
        counts = scope.selection.counts(part)
        slacks = tuple(base * s for s in REACH_SCALES)
        needed, reach = probe_needs(
            part, req.queries, req.k, list_nos, coarse, bits, p.first, labels, counts, slacks
        )
        lists = list_ranks(part, list_nos, labels)
    scale = needed / max(base, 1e-12)
    return Found(dist, labels, nq * part.nlist, scale, bucket, lists, reach)


def greedy_strategy(
    part: PartitionIndex, req: SearchRequest, bits: np.ndarray | None, scope: Scope
) -> Found:
    dist, labels, per_query = greedy(part, req.queries, req.k, req.list_nos.shape[1], bits)
    return Found(dist, labels, int(per_query.sum()))


STRATEGIES: dict[str, Strategy] = {
    "fixed": fixed,
    "adaptive": adaptive_strategy,
    "measure": measure,
    "greedy": greedy_strategy,
}


def strategy_for(req: SearchRequest, version: int) -> Strategy:
    """The strategy of the request's probing mode; automatic probing planned with another
    training version than the partition's searches as :func:`fixed` does (its slack was
    calibrated for the other lists)."""
    mode = req.probing.mode
    if mode in ("adaptive", "measure") and req.version != version:
        return fixed
    return STRATEGIES[mode]
