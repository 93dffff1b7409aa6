"""The merge of partial top-k blocks (per list scanned, per shard, per part of a batch)."""

from __future__ import annotations

import numpy as np


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
