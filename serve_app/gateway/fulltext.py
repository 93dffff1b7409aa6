"""BM25 across shards, and the rank fusion of a hybrid query's two legs.

A sharded index is scored with index-wide statistics: every shard first reports its own
(actors.types.TextStats per field), the gateway sums them and every shard scores with the sum,
so a document's score does not depend on which shard holds it. An unsharded index skips that
round. Merged hits go by descending score, ties by id, as each shard orders its own.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import reduce
from operator import add

from actors.types import TextHits, TextQuery
from serve_app.gateway.engine import CachedView, Engine


async def text_search(engine: Engine, cv: CachedView, q: TextQuery) -> TextHits:
    """The index's best ``q.k`` BM25 matches (every match when None)."""
    if not q.terms:
        return TextHits([], [], [] if q.with_metadata else None)
    if len(cv.shards) > 1 and q.stats is None:
        parts = await engine.all_shards(cv, lambda c: c.text_stats(cv.key, q.fields, q.terms))
        stats = tuple(reduce(add, per_field) for per_field in zip(*parts, strict=True))
        q = replace(q, stats=stats)
    hits = await engine.all_shards(cv, lambda c: c.text_search(cv.key, q))
    return merge(hits, q.k, q.with_metadata)


def merge(parts: Sequence[TextHits], k: int | None, with_metadata: bool) -> TextHits:
    """The best ``k`` of the shards' hits (each in descending score, ties by id)."""
    if len(parts) == 1:
        return parts[0]

    def rows(h: TextHits) -> Iterator[tuple[float, str, bytes | None]]:
        meta = h.metadata if h.metadata is not None else itertools.repeat(None)
        return zip([-s for s in h.scores], h.ids, meta, strict=False)

    best = list(itertools.islice(heapq.merge(*map(rows, parts)), k))
    return TextHits(
        [i for _, i, _ in best],
        [-s for s, _, _ in best],
        [m for _, _, m in best] if with_metadata else None,
    )


def fuse(
    vector_ids: Sequence[str],
    text_ids: Sequence[str],
    alpha: float,
    rrf_k: float,
    top_k: int,
) -> list[tuple[str, float]]:
    """Weighted reciprocal rank fusion: each id scores ``alpha / (rrf_k + rank)`` from the
    vector leg and ``(1 - alpha) / (rrf_k + rank)`` from the text leg (ranks from 1; a leg that
    did not return it adds nothing). The best ``top_k`` as (id, score), ties by id."""
    scores: dict[str, float] = {}
    for weight, ids in ((alpha, vector_ids), (1.0 - alpha, text_ids)):
        if weight == 0:
            continue
        for rank, item_id in enumerate(ids, start=1):
            scores[item_id] = scores.get(item_id, 0.0) + weight / (rrf_k + rank)
    return heapq.nsmallest(top_k, scores.items(), key=lambda p: (-p[1], p[0]))
