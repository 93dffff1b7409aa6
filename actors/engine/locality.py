"""Locality order for batch scans: queries that probe nearby inverted lists scanned one after
another, so that the lists they share are still in the CPU caches."""

from __future__ import annotations

import faiss
import numpy as np


def principal_rank(centroids: np.ndarray, sample: int = 4096, iterations: int = 20) -> np.ndarray:
    """Rank of each centroid along the centroids' first principal axis; lists with close ranks
    lie close together. The axis comes from power iteration on at most ``sample`` centroids,
    so it stays cheap for any n_lists; the fixed seed gives every shard the same ranks."""
    n = len(centroids)
    rng = np.random.default_rng(0)
    rows = rng.choice(n, sample, replace=False) if n > sample else slice(None)
    c = centroids[rows].astype(np.float64)
    c -= c.mean(axis=0)
    v = rng.normal(size=(c.shape[1],))
    for _ in range(iterations):
        w = c.T @ (c @ v)
        norm = np.linalg.norm(w)
        if norm == 0:  # one list, or all centroids alike: any order will do
            break
        v = w / norm
    rank = np.empty(n, dtype=np.int64)
    axis = v.astype(centroids.dtype)
    rank[np.argsort(centroids @ axis, kind="stable")] = np.arange(n)
    return rank


def rank_lists(index: faiss.IndexIVF) -> np.ndarray:
    """Each list's rank along the centroids' first principal axis (:func:`locality_order`)."""
    return principal_rank(index.quantizer.reconstruct_n(0, index.nlist))


def request_order(order: np.ndarray, *rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-query arrays computed in ``order`` (a permutation), put back in request order."""
    out = []
    for a in rows:
        back = np.empty_like(a)
        back[order] = a
        out.append(back)
    return tuple(out)


def locality_order(list_nos: np.ndarray, list_rank: np.ndarray) -> np.ndarray:
    """A query order in which queries that probe the same or nearby lists come one after another.

    faiss scans a batch query by query, each query reading its nprobe inverted lists. Sorted by
    the principal-axis rank of their nearest list (then of their second nearest), consecutive
    queries read mostly the same lists while those are still in the CPU caches, instead of
    fetching them from memory again; neighbouring groups share lists too, as their nearest
    lists lie close together. ``benchmarks/bench_bulk.py`` measures raw faiss in this order
    beside request order. List number -1 (a list a greedy round skips) sorts first.
    """

    def key(col: np.ndarray) -> np.ndarray:
        return np.where(col >= 0, list_rank[np.maximum(col, 0)], -1)

    if list_nos.shape[1] == 1:
        return np.argsort(key(list_nos[:, 0]), kind="stable")
    return np.lexsort((key(list_nos[:, 1]), key(list_nos[:, 0])))
