"""Training: the shared IVF template (k-means coarse quantizer + SQ/PQ codebooks) and the
calibration of automatic n_probes.

Rules (documented in the README):
- n_lists automatic = clamp(round(4 * sqrt(N)), 1, N // 39): faiss wants >= 39 training points
  per centroid, and 4*sqrt(N) keeps lists near sqrt(N)/4 items.
- The k-means sample holds at most 128 points per list and at most ``max_memory`` bytes of
  vectors when given; k-means runs 10 iterations (faiss's own for IVF training) unless
  ``max_iters`` says otherwise. Every training starts afresh: started from the previous
  training's centroids, k-means found lists that scan 4-31% more items for the same recall
  (docs/performance.md, scale).
- Fixed n_probes table: a held-out sample of the data is queried against an IVF index over the
  rest of the sample; for each calibrated top_k the smallest n_probes whose mean recall@top_k
  against brute force reaches the target plus two standard errors of that estimate is kept.
  With compressed codes (SQ/PQ) the reference is what probing every list finds instead: the
  target is a share of what the codes can find, as the gateway measures it.
- Automatic probing (PartitionIndex.search_adaptive): per top_k, ``first`` = half that fixed
  n_probes, and the smallest slacks whose recall on the same held-out queries, over as many
  simulated shards as the index has, reaches that goal: one without a filter and one under a
  random filter matching 10% of the items. Held-out items are not real queries: the gateway
  corrects the slacks from the recall it measures on real ones (serve_app.gateway.probing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import faiss
import numpy as np

from actors import constants
from actors.engine.adaptive import slack_needed
from actors.engine.ivf import PartitionIndex, new_ivf
from actors.engine.topk import merge_topk
from actors.errors import InvalidRequest


@dataclass(frozen=True)
class TrainParams:
    n_lists: int | None = None
    batch_size: int | None = None
    max_iters: int | None = None
    tolerance: float | None = None
    max_memory: int | None = None  # bytes of training vectors; None/0 = no limit


def auto_n_lists(n: int) -> int:
    return int(max(1, min(round(4 * math.sqrt(n)), n // 39)))


def train_template(
    vectors: np.ndarray,
    index_type: str,
    n_lists: int,
    pq_dim: int | None,
    pq_bits: int | None,
    params: TrainParams,
    seed: int = 1234,
    sq_bits: int | None = None,
) -> faiss.IndexIVF:
    """k-means on ``vectors`` (already sampled) then SQ/PQ training; returns an empty index."""
    n, d = vectors.shape
    if n < n_lists:
        raise InvalidRequest(f"cannot train {n_lists} lists on {n} vectors")
    if index_type == "ivfpq" and n < 2 ** (pq_bits or 8):
        raise InvalidRequest(
            f"ivfpq with pq_bits={pq_bits or 8} needs at least {2 ** (pq_bits or 8)} items to train"
        )
    iters = params.max_iters or constants.KMEANS_ITERS
    centroids = kmeans(vectors, n_lists, iters, params.tolerance, seed)
    index = new_ivf(index_type, d, n_lists, pq_dim, pq_bits, sq_bits)
    index.quantizer.add(centroids)
    if index_type == "ivfflat":
        index.is_trained = True
    else:
        # Trains the scalar quantizer / PQ codebooks on residuals w.r.t. the fixed quantizer.
        index.train(vectors)
    return index


def kmeans(x: np.ndarray, k: int, max_iters: int, tolerance: float | None, seed: int) -> np.ndarray:
    """faiss k-means; with a tolerance, stop once the objective improves by less than it."""
    d = x.shape[1]
    if k == 1:
        return x.mean(axis=0, keepdims=True).astype(np.float32)
    if not tolerance:
        km = faiss.Kmeans(
            d, k, niter=max_iters, seed=seed, max_points_per_centroid=constants.MAX_POINTS_PER_LIST
        )
        km.train(x)
        return np.asarray(km.centroids, dtype=np.float32)
    centroids: np.ndarray | None = None
    previous = math.inf
    for _ in range(max_iters):
        km = faiss.Kmeans(
            d, k, niter=1, seed=seed, max_points_per_centroid=constants.MAX_POINTS_PER_LIST
        )
        km.train(x, init_centroids=centroids)
        centroids = np.asarray(km.centroids, dtype=np.float32)
        objective = float(km.obj[-1])
        if previous - objective <= tolerance * max(abs(previous), 1e-30) and previous < math.inf:
            break
        previous = objective
    assert centroids is not None
    return centroids


def calibrate_nprobe(
    template: faiss.IndexIVF,
    sample: np.ndarray,
    target: float,
    n_queries: int = 500,
    seed: int = 7,
) -> tuple[tuple[int, int], ...]:
    """Return ((top_k, n_probes), ...) reaching ``target`` recall@top_k on held-out queries."""
    n = len(sample)
    nlist = int(template.nlist)
    if n < 20 or nlist == 1:
        return tuple((k, nlist) for k in constants.CALIBRATION_TOPKS)
    rng = np.random.default_rng(seed)
    n_queries = min(n_queries, max(10, n // 10))
    perm = rng.permutation(n)
    queries, base = sample[perm[:n_queries]], sample[perm[n_queries:]]
    # The reference: brute force; compressed codes (SQ/PQ) cap recall below 1 whatever the
    # probes, so theirs is what probing every list finds, as the gateway measures recall
    # (serve_app.gateway.probing): the target is a share of what the codes can find, reached
    # at the latest with every list.
    k_max = min(max(constants.CALIBRATION_TOPKS), len(base))
    if isinstance(template, faiss.IndexIVFFlat):
        exact = faiss.IndexFlatL2(base.shape[1])
        exact.add(base)
        _, reference = exact.search(queries, k_max)
        del exact
    else:
        index = faiss.clone_index(template)
        index.add(base)
        index.nprobe = nlist
        _, reference = index.search(queries, k_max)
        del index
    # A reference result is found with n_probes p exactly when its list is among the query's
    # p nearest centroids (a result of all probed lists' candidates is one of any subset's
    # that holds it): one ranking of the centroids per query gives each result's n_probes,
    # and so recall against every n_probes at once.
    _, lists = template.quantizer.search(base, 1)
    _, order = template.quantizer.search(queries, nlist)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(nlist), order.shape), axis=1)
    # Two standard errors of the held-out estimate as margin, so the target holds on queries
    # the calibration did not see.
    table = []
    for k in constants.CALIBRATION_TOPKS:
        truth = reference[:, : min(k, k_max)]
        need = np.take_along_axis(rank, lists[:, 0][np.maximum(truth, 0)], axis=1) + 1
        need = need[truth >= 0]  # (the codes may find fewer than k: those are not counted)
        if not len(need):
            table.append((k, nlist))
            continue
        goal = min(1.0, target + 2 * math.sqrt(target * (1 - target) / need.size))
        found = math.ceil(goal * need.size - 1e-9)  # results the goal asks for
        table.append((k, int(np.sort(need)[max(found, 1) - 1])))
    # n_probes never decreases with top_k.
    running = 0
    out = []
    for k, p in table:
        running = max(running, p)
        out.append((k, running))
    return tuple(out)


SLACK_MIN, SLACK_MAX = 1 / 64, 64.0


def calibrate_probing(
    template: faiss.IndexIVF,
    sample: np.ndarray,
    target: float,
    nprobe_table: tuple[tuple[int, int], ...],
    n_shards: int = 1,
    n_queries: int = 500,
    seed: int = 7,
) -> tuple[tuple[int, int, float, float], ...]:
    """((top_k, first, slack unfiltered, slack under a 10% filter), ...) for
    PartitionIndex.search_adaptive: on held-out queries over the rest of the sample, split over
    ``n_shards`` simulated shards as the index is, the smallest slacks reaching ``target``
    recall@top_k (plus two standard errors), without a filter and with a random 10% one."""
    n = len(sample)
    nlist = int(template.nlist)
    fixed = dict(nprobe_table)
    if n < 20 or nlist == 1 or not fixed:
        return tuple((k, nlist, 0.0, 0.0) for k in constants.CALIBRATION_TOPKS)
    rng = np.random.default_rng(seed)
    n_queries = min(n_queries, max(10, n // 10))
    perm = rng.permutation(n)
    queries, base = sample[perm[:n_queries]], sample[perm[n_queries:]]
    owner = rng.integers(0, max(1, n_shards), len(base))
    parts = []
    for s in range(max(1, n_shards)):
        rows = np.flatnonzero(owner == s)
        part = PartitionIndex(faiss.clone_index(template))
        part.add(rows.astype(np.int64), base[rows])
        parts.append(part)
    quantizer = parts[0].index.quantizer
    all_dis, all_lists = quantizer.search(queries, nlist)
    subset = rng.random(len(base)) < 0.1
    # The reference top max(k) without and with the filter, sliced per k below: the exact
    # neighbours, or with compressed codes what probing every list finds (calibrate_nprobe).
    truths = []
    for mask in (None, subset):
        rows = np.arange(len(base)) if mask is None else np.flatnonzero(mask)
        k_ref = min(max(constants.CALIBRATION_TOPKS), len(rows))
        if isinstance(template, faiss.IndexIVFFlat):
            exact = faiss.IndexFlatL2(base.shape[1])
            exact.add(base[rows])
            _, found = exact.search(queries, k_ref)
            truths.append(rows[found])
        else:
            bits = None if mask is None else np.packbits(mask, bitorder="little")
            every = [p.search(queries, k_ref, all_lists, all_dis, bits) for p in parts]
            truths.append(merge_topk([f[0] for f in every], [f[1] for f in every], k_ref)[1])
    out = []
    for k in constants.CALIBRATION_TOPKS:
        first = max(1, math.ceil(fixed[k] / 2))
        slacks = []
        for mask, full_truth in zip((None, subset), truths):
            k_eff = min(k, full_truth.shape[1])
            truth = full_truth[:, :k_eff]
            bits = None if mask is None else np.packbits(mask, bitorder="little")
            # For each reference result, the slack that finds it (one search tells all).
            needed = np.concatenate(
                [
                    slack_needed(
                        p,
                        queries,
                        k_eff,
                        all_lists,
                        all_dis,
                        bits,
                        first,
                        np.where(np.isin(truth, np.flatnonzero(owner == s)), truth, -1),
                    )
                    for s, p in enumerate(parts)
                ],
                axis=1,
            )
            goal = min(1.0, target + 2 * math.sqrt(target * (1 - target) / truth.size))
            slacks.append(smallest_scale(needed, goal))
        out.append((k, first, slacks[0], max(slacks)))
    return tuple(out)


def smallest_scale(needed: np.ndarray, goal: float) -> float:
    """The smallest slack (or scale) whose mean per-query recall reaches ``goal``, within
    [SLACK_MIN, SLACK_MAX], when result j of query i is found by slacks above ``needed[i, j]``
    (nan: no result, not counted). Exact: each result weighs 1 / (its query's results x the
    queries), and the answer is where the sorted needs' running weight reaches the goal."""
    valid = ~np.isnan(needed)
    per_query = valid.sum(axis=1)
    rows = np.flatnonzero(per_query)
    if not len(rows):
        return SLACK_MIN
    values = needed[rows][valid[rows]]
    weights = np.repeat(1.0 / (per_query[rows] * len(rows)), per_query[rows])
    order = np.argsort(values, kind="stable")
    reached = np.cumsum(weights[order]) >= goal - 1e-12
    if not reached.any():
        return SLACK_MAX
    # Found means needed < slack (the rule's bound is strict): a hair above the need.
    need = float(values[order][int(reached.argmax())]) * (1 + 1e-4) + 1e-9
    return float(min(max(need, SLACK_MIN), SLACK_MAX))


def sample_size(n_lists: int, n_total: int, dimension: int, max_memory: int | None) -> int:
    size = min(n_total, max(n_lists * constants.MAX_POINTS_PER_LIST, 20_000))
    if max_memory:
        size = min(size, max(n_lists, max_memory // (4 * dimension)))
    return size
