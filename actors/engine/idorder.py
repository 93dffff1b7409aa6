"""Paging through a shard's items in id order: what cursors (``limit`` and ``next_cursor`` on
list_ids and query_metadata) read.

Ids never change while an item lives, so a page that starts after the last id of the previous
one returns every item present for the whole scan exactly once, whatever is written meanwhile.
The live labels sorted by id are kept (4 or 8 bytes an item, built on the first page, about a
second for a million items); items written later are sorted on each page as a short tail, and
the order is rebuilt once that tail outgrows a share of it. Compaction makes a new item table,
which builds its own.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable

import numpy as np

from actors import constants


class IdOrder:
    """The labels live at ``built_at`` (labels below it), sorted by their ids."""

    def __init__(self, labels: np.ndarray, ids: list[str], built_at: int) -> None:
        order = sorted(range(len(ids)), key=ids.__getitem__)
        dtype = np.int32 if built_at < 2**31 else np.int64
        self.labels = labels[np.asarray(order, dtype=np.int64)].astype(dtype)
        self.built_at = built_at

    def stale(self, next_label: int) -> bool:
        tail = next_label - self.built_at
        return tail > max(constants.ID_ORDER_TAIL_MIN, len(self.labels) // 8)

    def page(
        self,
        allowed: np.ndarray,
        after: str,
        limit: int,
        id_of: Callable[[int], str],
        ids_of: Callable[[np.ndarray], list[str]],
    ) -> list[str]:
        """The first ``limit`` ids above ``after`` among the labels ``allowed`` (a mask over
        every label handed out) marks, in id order."""
        n = len(allowed)
        base = np.flatnonzero(allowed[self.labels])  # positions of the allowed, in id order
        start = bisect.bisect_right(base, after, key=lambda p: id_of(int(self.labels[p])))
        head = ids_of(self.labels[base[start : start + limit]].astype(np.int64))
        tail_labels = np.flatnonzero(allowed[self.built_at : n]) + self.built_at
        tail = sorted(i for i in ids_of(tail_labels) if i > after)
        return list(itertools.islice(heapq.merge(head, tail), limit))
