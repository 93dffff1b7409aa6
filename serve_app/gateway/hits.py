"""What a search answers at the gateway: the merged top-k of a batch of queries (:class:`Hits`),
the options it ran with (:class:`Query`), and how the shards' parts become one answer
(:data:`Merge`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from actors.engine.filters import FilterNode
from actors.engine.strings import StringBlock, concat_columns, replace_rows, take_along_columns
from actors.types import EXACT_SCAN, Fetched, SearchResult


@dataclass(frozen=True)
class Hits:
    """Merged top-k for a batch of queries: index-space squared distances, ids, metadata."""

    distances: np.ndarray
    ids: StringBlock
    metadata: np.ndarray | None
    counts: np.ndarray  # results per query
    # Inverted lists scanned, summed over the queries (each query's count averaged over the
    # shards, which may choose differently under automatic probing).
    lists_scanned: float = 0.0
    needed: np.ndarray | None = None  # measure requests: SearchResult.needed, merged
    bucket: int = 0
    lists_needed: np.ndarray | None = None  # measure requests: SearchResult.lists_needed, merged
    reach: np.ndarray | None = None  # measure requests: SearchResult.reach, averaged over shards

    def rows(self) -> list[Hits]:
        """One Hits per query (lists scanned shared out evenly)."""
        n = len(self.counts)
        return [
            Hits(
                self.distances[q : q + 1],
                self.ids.take_rows(np.array([q])),
                None if self.metadata is None else self.metadata[q : q + 1],
                self.counts[q : q + 1],
                self.lists_scanned / max(n, 1),
                None if self.needed is None else self.needed[q : q + 1],
                self.bucket,
                None if self.lists_needed is None else self.lists_needed[q : q + 1],
                None if self.reach is None else self.reach[q : q + 1],
            )
            for q in range(n)
        ]


@dataclass(frozen=True)
class Query:
    """A query's options as the engine takes them: validated, defaults applied
    (serve_app.service.params.QueryParams builds it once per request, whatever the transport)."""

    top_k: int
    n_probes: int = 0  # 0 = automatic
    filter: FilterNode | None = None
    greedy: bool = False
    with_metadata: bool = True
    rerank_mult: int = 0  # 0 = the partitions' default


def merge(parts: list[SearchResult], k: int, with_metadata: bool) -> Hits:
    """Per-shard top-k blocks -> global top-k (ascending distance)."""
    needed = lists_needed = None
    if len(parts) == 1:
        p = parts[0]
        d, ids, meta, needed, lists_needed = (
            p.distances,
            p.ids,
            p.metadata,
            p.needed,
            p.lists_needed,
        )
    else:
        d = np.concatenate([p.distances for p in parts], axis=1)
        col = np.argsort(d, axis=1, kind="stable")[:, :k]
        d = np.take_along_axis(d, col, axis=1)
        ids = take_along_columns(concat_columns([p.ids for p in parts]), col)
        meta = None
        if with_metadata:
            blocks = [p.metadata for p in parts if p.metadata is not None]
            meta = np.take_along_axis(np.concatenate(blocks, axis=1), col, axis=1)
        needed = _columns([p.needed for p in parts], col)
        lists_needed = _columns([p.lists_needed for p in parts], col)
    counts = np.isfinite(d).sum(axis=1)
    scanned = sum(p.lists_scanned for p in parts) / len(parts)
    # a shard that probed tells the kind (its scale applied); EXACT_SCAN if every shard scanned
    probed = [p.bucket for p in parts if p.bucket != EXACT_SCAN]
    bucket = max(probed) if probed else EXACT_SCAN
    reach = None
    reaches = [p.reach for p in parts if p.reach is not None]
    if len(reaches) == len(parts):
        reach = np.mean(reaches, axis=0)  # lists per query, as lists_scanned
    return Hits(d, ids, meta, counts, scanned, needed, bucket, lists_needed, reach)


def _columns(blocks: list[np.ndarray | None], col: np.ndarray) -> np.ndarray | None:
    """Per-shard (nq, k) blocks' columns ``col`` of their concatenation (None if one is)."""
    told = [b for b in blocks if b is not None]
    if len(told) < len(blocks):
        return None
    return np.take_along_axis(np.concatenate(told, axis=1), col, axis=1)


# How the per-shard parts of a search become one answer: the distances' top-k today (a rank
# fusion of two scorers' answers would be another).
Merge = Callable[[list[SearchResult], int, bool], Hits]
top_k: Merge = merge


def patch(hits: Hits, rows: np.ndarray, sub: Hits) -> Hits:
    d = hits.distances.copy()
    d[rows] = sub.distances
    ids = replace_rows(hits.ids, rows, sub.ids)
    meta = None
    if hits.metadata is not None and sub.metadata is not None:
        meta = hits.metadata.copy()
        meta[rows] = sub.metadata
    counts = hits.counts.copy()
    counts[rows] = sub.counts
    return Hits(d, ids, meta, counts, hits.lists_scanned + sub.lists_scanned)


def entries(parts: Sequence[Fetched]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for part in parts:
        for j, item_id in enumerate(part.ids):
            entry: dict[str, Any] = {"id": item_id}
            if part.vectors is not None:
                entry["vector"] = part.vectors[j]
            if part.contents is not None:
                entry["contents"] = part.contents[j]
            if part.metadata is not None:
                m = part.metadata[j]
                entry["metadata"] = orjson.Fragment(m if m is not None else b"{}")
            found[item_id] = entry
    return found
