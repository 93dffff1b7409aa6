"""Automatic probing's per-query rule (:func:`adaptive`), and what an exact answer tells of it:
the slack each result needs, the lists in centroid order each needs, and the lists the rule
scans at given slacks (:func:`probe_needs`, :func:`list_ranks`: the measurements behind the
gateway's probing, serve_app.gateway.probing, and the calibration, actors.control.training).
actors.engine.search runs it as the ``adaptive`` strategy."""

from __future__ import annotations

import numpy as np

from actors.engine.ivf import PartitionIndex
from actors.engine.topk import merge_topk


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
    with np.errstate(over="ignore", invalid="ignore"):  # slack 0 times an inf Dk: no bound
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
    with np.errstate(over="ignore", invalid="ignore"):
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
    need, _ = probe_needs(
        part, x, k, list_nos, coarse_dis, selector_bits, first, labels, counts, ()
    )
    return need


def probe_needs(
    part: PartitionIndex,
    x: np.ndarray,
    k: int,
    list_nos: np.ndarray,
    coarse_dis: np.ndarray,
    selector_bits: np.ndarray | None,
    first: int,
    labels: np.ndarray,
    counts: np.ndarray | None,
    slacks: tuple[float, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`slack_needed` of ``labels``, and per query the lists :func:`adaptive` scans
    with each of ``slacks``), on the plan ``list_nos`` of every list in centroid order."""
    if counts is None:
        counts = part.list_counts(selector_bits)
    found, _, first_lists, p1, c = _first_pass(
        part, x, k, list_nos, coarse_dis, selector_bits, first, counts
    )
    kth = found[:, -1].astype(np.float64)
    reach = _reach(coarse_dis, c, p1, first_lists, kth, slacks)
    out = np.full(labels.shape, np.nan, dtype=np.float64)
    valid = labels >= 0
    if not valid.any():
        return out, reach
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
        need = (d_list - coarse_dis[rows, 0]) / kth[rows]
    need = np.where(np.isfinite(need), np.maximum(need, 0.0), 0.0)
    out[rows, cols] = np.where(in_first[rows, cols], 0.0, need)
    return out, reach


def _reach(
    coarse_dis: np.ndarray,
    c: np.ndarray,
    p1: np.ndarray,
    first_lists: np.ndarray,
    kth: np.ndarray,
    slacks: tuple[float, ...],
) -> np.ndarray:
    """(nq, len(slacks)) lists :func:`adaptive` scans with each slack: the first pass's, and
    those past it holding a match whose centroid lies within D1 + slack * Dk."""
    out = np.repeat(first_lists[:, None], len(slacks), axis=1).astype(np.int32)
    if not len(slacks):
        return out
    past = (np.arange(coarse_dis.shape[1])[None, :] >= p1[:, None]) & (c > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (coarse_dis.astype(np.float64) - coarse_dis[:, :1]) / kth[:, None]
    t = np.sort(np.where(past & ~np.isnan(t), t, np.inf), axis=1)
    levels = np.asarray(slacks, dtype=np.float64)
    for i, row in enumerate(t):
        out[i] += np.searchsorted(row, levels, side="left").astype(np.int32)
    return out


def list_ranks(part: PartitionIndex, list_nos: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """For results ``labels`` (nq, k; -1 = none): how many lists in centroid order a query
    scans to find each (its list's rank + 1, on the plan ``list_nos`` of every list; nan for
    -1)."""
    out = np.full(labels.shape, np.nan, dtype=np.float64)
    rows, cols = np.nonzero(labels >= 0)
    if len(rows):
        rank = np.empty(list_nos.shape, dtype=np.int64)
        np.put_along_axis(rank, list_nos, np.arange(list_nos.shape[1])[None, :], axis=1)
        out[rows, cols] = rank[rows, part.list_of[labels[rows, cols]]] + 1
    return out
