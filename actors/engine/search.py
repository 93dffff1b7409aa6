"""How a partition is searched: the probing strategies a shard runs a search request with, over
the partition's inverted lists (actors.engine.ivf.PartitionIndex.search: the given lists of each
query), and the merge of partial top-k blocks.

A request says how to probe (actors.types.Probing); :func:`strategy_for` picks the strategy:

- **fixed**: the lists the gateway planned, as given (an explicit ``n_probes``, the calibrated
  table, or an untrained index's one list: an exact search);
- **adaptive**: automatic probing, each query scanning as many lists as what it finds asks for
  (:func:`adaptive`), or under a filter matching few items, an exact scan of those
  (:func:`exact_matching`);
- **measure**: every list, exactly, with the slack each result needed (:func:`slack_needed`),
  for the gateway's recall estimate;
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

from actors.engine.ivf import PartitionIndex
from actors.engine.selection import Selection
from actors.types import EXACT_SCAN, SearchRequest, auto_nprobe, probe_slack


def adaptive(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    slack: float,
    counts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Automatic probing: how many lists each query scans is chosen from what it finds.

    1. Each query scans its ``first`` nearest lists, more if those hold fewer than ``k``
       items that the filter matches (the per-list match counts come from the filter's
       bitmap), so that the first pass has a k-th distance to go by.
    2. With ``D1`` the squared distance to its nearest centroid and ``Dk`` its k-th squared
       distance after the first pass, every further list whose centroid lies within
       ``D1 + slack * Dk`` is scanned too, except lists holding no matching item.

    A query far from every centroid, or one whose filter leaves few candidates nearby,
    has a large ``Dk`` and scans more lists; one deep inside a dense list scans few. Queries
    whose plan (the gateway's ``list_nos``) is too short for the rule have their lists
    assigned here, wider. ``counts``: the matching items per list when known (else counted
    here). Returns (distances, labels, lists scanned per query).
    """
    if counts is None:
        counts = part.list_counts(selector_bits)
    return _adaptive(part, x, k, list_nos, coarse_dis, selector_bits, first, slack, counts)


def _first_pass(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step 1 of :func:`adaptive`: (distances, labels, lists it scanned per query,
    plan columns it covered per query, per-column match counts)."""
    plan = list_nos.shape[1]
    c = counts[np.maximum(list_nos, 0)] * (list_nos >= 0)
    enough = np.cumsum(c, axis=1) >= k
    reach = np.where(enough.any(axis=1), enough.argmax(axis=1) + 1, plan)
    p1 = np.minimum(np.maximum(reach, first), plan)
    w1 = int(p1.max())
    take1 = (np.arange(w1)[None, :] < p1[:, None]) & (c[:, :w1] > 0)
    distances, labels = part.search(
        x, k, np.where(take1, list_nos[:, :w1], -1), coarse_dis[:, :w1], selector_bits
    )
    return distances, labels, take1.sum(axis=1), p1, c


def _adaptive(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    slack: float,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nq, plan = list_nos.shape
    if nq == 0 or plan == 0:
        empty = np.full((nq, k), np.inf, dtype=np.float32)
        return empty, np.full((nq, k), -1, dtype=np.int64), np.zeros(nq, dtype=np.int64)
    if nq == 1:
        return _adaptive_one(part, x, k, list_nos, coarse_dis, selector_bits, first, slack, counts)
    distances, labels, scanned, p1, c = _first_pass(
        part, x, k, list_nos, coarse_dis, selector_bits, first, counts
    )
    # 2. further lists within D1 + slack * Dk (Dk is inf when the first pass found < k).
    with np.errstate(over="ignore"):
        bound = coarse_dis[:, :1] + slack * distances[:, k - 1 : k]
    take2 = (np.arange(plan)[None, :] >= p1[:, None]) & (c > 0) & (coarse_dis < bound)
    # A plan that ends inside the bound (or before k matches) may be too short.
    cut = (coarse_dis[:, -1] < bound[:, 0]) | (np.cumsum(c, axis=1)[:, -1] < k)
    wider = np.flatnonzero(cut) if plan < part.nlist else np.zeros(0, dtype=np.int64)
    take2[wider] = False
    rows = np.flatnonzero(take2.any(axis=1))
    if len(rows):
        lo = int(p1[rows].min())
        d2, l2 = part.search(
            x[rows],
            k,
            np.where(take2[rows, lo:], list_nos[rows, lo:], -1),
            coarse_dis[rows, lo:],
            selector_bits,
        )
        distances[rows], labels[rows] = merge_topk([distances[rows], d2], [labels[rows], l2], k)
        scanned += take2.sum(axis=1)
    if len(wider):
        # These queries start over on a plan four times as long (the work already done is
        # counted); the first pass and its k-th distance come out the same.
        dw, lw, sw = _wider(part, x[wider], k, plan, selector_bits, first, slack, counts)
        distances[wider], labels[wider] = dw, lw
        scanned[wider] += sw
    return distances, labels, scanned


def _adaptive_one(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    slack: float,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_adaptive` of one query, the same steps on its row as plain Python lists:
    numpy's calls on arrays of one row cost more than the scan (figures:
    docs/performance.md). Same lists, same faiss calls, same merge: the same
    answer bit for bit (tests/unit/test_partition.py)."""
    plan = list_nos.shape[1]
    lists = list_nos[0].tolist()
    c = [int(n) if n > 0 else 0 for n in counts[np.maximum(list_nos[0], 0)].tolist()]
    c = [n if lst >= 0 else 0 for n, lst in zip(c, lists)]
    # 1. the first `first` lists, more until they hold k matching items
    reach, total = plan, 0
    for j, n in enumerate(c):
        total += n
        if total >= k:
            reach = j + 1
            break
    p1 = min(max(reach, first), plan)
    row1 = [lst if n > 0 else -1 for lst, n in zip(lists[:p1], c[:p1])]
    distances, labels = part.search(
        x, k, np.array([row1], dtype=np.int64), coarse_dis[:, :p1], selector_bits
    )
    scanned = sum(n > 0 for n in c[:p1])
    # 2. further lists within D1 + slack * Dk, in float32 as the batch rule computes it
    coarse = coarse_dis[0]
    with np.errstate(over="ignore"):
        bound = float(coarse[0] + np.float32(slack) * distances[0, k - 1])
    if plan < part.nlist and (float(coarse[-1]) < bound or sum(c) < k):
        # the plan may be too short: start over on one four times as long
        dw, lw, sw = _wider(part, x, k, plan, selector_bits, first, slack, counts)
        return dw, lw, sw + scanned
    dis = coarse.tolist()
    row2 = [lst if n > 0 and d < bound else -1 for lst, n, d in zip(lists[p1:], c[p1:], dis[p1:])]
    more = sum(lst >= 0 for lst in row2)
    if more:
        d2, l2 = part.search(
            x, k, np.array([row2], dtype=np.int64), coarse_dis[:, p1:], selector_bits
        )
        distances, labels = merge_topk([distances, d2], [labels, l2], k)
    return distances, labels, np.array([scanned + more], dtype=np.int64)


def _wider(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    plan: int,
    selector_bits: np.ndarray | None,
    first: int,
    slack: float,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_adaptive` of ``x`` on a plan four times ``plan`` long, assigned here."""
    xw = np.ascontiguousarray(x)
    dis_w, lists_w = part.assign(xw, min(part.nlist, 4 * plan))
    return _adaptive(part, xw, k, lists_w, dis_w, selector_bits, first, slack, counts)


def slack_needed(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    labels: np.ndarray,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """For results ``labels`` (nq, k; -1 = none) of queries ``x``: the smallest slack with
    which :func:`adaptive` scans each one's list (0 when the first pass does; nan
    for -1). The first pass does not depend on the slack, so one exact search tells how
    recall grows with it."""
    if counts is None:
        counts = part.list_counts(selector_bits)
    found, _, _, p1, _ = _first_pass(part, x, k, list_nos, coarse_dis, selector_bits, first, counts)
    kth = found[:, -1]
    out = np.full(labels.shape, np.nan, dtype=np.float64)
    valid = labels >= 0
    if not valid.any():
        return out
    lists = np.full(labels.shape, -1, dtype=np.int64)
    lists[valid] = part.list_of[labels[valid]]
    w1 = int(p1.max())
    firsts = np.where(np.arange(w1)[None, :] < p1[:, None], list_nos[:, :w1], -2)
    in_first = (firsts[:, None, :] == lists[:, :, None]).any(axis=2)
    centroids = part.index.quantizer.reconstruct_n(0, part.nlist)
    rows, cols = np.nonzero(valid)
    diff = x[rows] - centroids[lists[rows, cols]]
    d_list = np.einsum("ij,ij->i", diff, diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        need = (d_list - coarse_dis[rows, 0]) / kth[rows].astype(np.float64)
    need = np.where(np.isfinite(need), np.maximum(need, 0.0), 0.0)
    out[rows, cols] = np.where(in_first[rows, cols], 0.0, need)
    return out


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
    counts = scope.selection.counts(part)
    dist, labels, per_query = adaptive(
        part, req.queries, req.k, req.list_nos, req.coarse_dis, bits, p.first, slack, counts
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
    """Exact (every list), with the scale of the slack each result needs (the gateway's
    recall estimate: serve_app.gateway.probing)."""
    p = req.probing
    _, base, bucket = probe_slack(p.slacks, p.scales, scope.selectivity)
    coarse, list_nos = part.assign(req.queries, part.nlist)
    dist, labels = part.search(req.queries, req.k, list_nos, coarse, bits)
    if scope.selection.exact_eligible(part, _probe_items(part, scope, req.k)):
        # its queries are scanned exactly: no lesson for probing's scale, none worked out
        needed = np.full(labels.shape, np.nan)
        bucket = EXACT_SCAN
    else:
        counts = scope.selection.counts(part)
        needed = slack_needed(
            part, req.queries, req.k, list_nos, coarse, bits, p.first, labels, counts
        )
    return Found(dist, labels, len(req.queries) * part.nlist, needed / max(base, 1e-12), bucket)


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


def merge_topk(
    distances: list[np.ndarray], labels: list[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-part (nq, k_i) result blocks into the (nq, k) best, ascending. Any label dtype."""
    if len(distances[0]) == 1:  # one query: the same steps on its row, without the 2-D calls
        d1 = np.concatenate([part[0] for part in distances])
        lab1 = np.concatenate([part[0] for part in labels])
        if len(d1) > k:
            top = np.argpartition(d1, k - 1)[:k]
            d1, lab1 = d1[top], lab1[top]
        order1 = np.argsort(d1, kind="stable")
        return d1[order1][None], lab1[order1][None]
    d = np.concatenate(distances, axis=1)
    lab = np.concatenate(labels, axis=1)
    if d.shape[1] > k:
        part = np.argpartition(d, k - 1, axis=1)[:, :k]
        d = np.take_along_axis(d, part, axis=1)
        lab = np.take_along_axis(lab, part, axis=1)
    order = np.argsort(d, axis=1, kind="stable")
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(lab, order, axis=1)
