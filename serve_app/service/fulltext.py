"""BM25 full-text search (CyborgDB 0.18): ``query_metadata(text=...)`` ranked by BM25 alone,
and the hybrid ``query(text=...)`` that fuses a vector leg and a BM25 leg by weighted reciprocal
rank fusion. Both legs apply the query's filter. Scoring and the analyser:
actors.engine.fulltext; across shards and the fusion: serve_app.gateway.fulltext."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from actors.engine.filters import FilterNode
from actors.engine.fulltext import query_terms
from actors.errors import InvalidRequest
from actors.types import IndexConfig, TextHits, TextQuery
from serve_app.access import context
from serve_app.gateway import fulltext as gateway
from serve_app.gateway.engine import CachedView, Engine
from serve_app.models import HybridFields, TextSearchFields
from serve_app.service.params import QueryParams
from serve_app.service.results import NO_METADATA_JSON

ALPHA, RRF_K, WINDOW_MULT = 0.5, 60.0, 3  # CyborgDB's defaults


@dataclass(frozen=True)
class TextSearch:
    """A request's BM25 leg as asked, before the index is known."""

    text: str
    fields: tuple[str, ...] | None
    weights: tuple[float, ...] | None
    require_all: bool

    @classmethod
    def of(cls, body: TextSearchFields) -> TextSearch | None:
        """The body's text search; None without text (an empty text is none)."""
        if not body.text:  # as CyborgDB: the text knobs without text leave the query text-free
            return None
        fields = tuple(body.text_fields) if body.text_fields else None
        weights = tuple(body.text_field_weights) if body.text_field_weights else None
        if weights is not None:
            if any(not np.isfinite(w) or w < 0 for w in weights):
                raise InvalidRequest("text_field_weights must be finite and >= 0")
            if fields is None:
                raise InvalidRequest("text_field_weights needs text_fields (one weight each)")
            if len(weights) != len(fields):
                raise InvalidRequest(
                    f"text_field_weights has {len(weights)} weights for {len(fields)} text_fields"
                )
        return cls(body.text, fields, weights, bool(body.require_all_terms))

    def query(
        self, cfg: IndexConfig, node: FilterNode | None, k: int | None, with_metadata: bool
    ) -> TextQuery:
        """The shards' form of this search on ``cfg``'s index; 422 when the index has no
        full_text field or a field searched is not one."""
        full_text = cfg.full_text_fields
        if not full_text or cfg.bm25 is None:
            raise InvalidRequest(
                f"index {cfg.name!r} has no full_text field: text search needs one "
                "(text_fields or metadata_schema full_text at create)"
            )
        fields = self.fields or full_text
        for f in fields:
            if f not in full_text:
                raise InvalidRequest(f"text_fields: {f!r} is not a full_text field of the index")
        if len(set(fields)) != len(fields):
            raise InvalidRequest("text_fields names a field twice")
        weights = self.weights or (1.0,) * len(fields)
        # Fields in name order: a score's sum does not depend on the order they were named in.
        fields, weights = zip(*sorted(zip(fields, weights, strict=True)), strict=True)
        k1, b = cfg.bm25
        terms = query_terms(self.text)
        return TextQuery(
            fields, weights, terms, k1, b, self.require_all, node, k, None, with_metadata
        )


@dataclass(frozen=True)
class Hybrid:
    """A query's BM25 leg and how it is fused with the vector leg."""

    search: TextSearch
    alpha: float
    rrf_k: float
    window_mult: int

    @classmethod
    def of(cls, body: HybridFields) -> Hybrid | None:
        search = TextSearch.of(body)
        if search is None:
            return None
        alpha = ALPHA if body.alpha is None else float(body.alpha)
        rrf_k = RRF_K if body.rrf_k is None else float(body.rrf_k)
        window = WINDOW_MULT if body.window_mult is None else body.window_mult
        return cls(search, alpha, rrf_k, window)


async def ranked(
    engine: Engine, cv: CachedView, search: TextSearch, node: FilterNode | None, k: int | None
) -> TextHits:
    """query_metadata's text leg: the best ``k`` (all when None) by BM25, ids and scores."""
    hits = await gateway.text_search(engine, cv, search.query(cv.config, node, k, False))
    context.note(items=len(hits.ids))
    return hits


async def fused(
    engine: Engine,
    cv: CachedView,
    hybrid: Hybrid,
    params: QueryParams,
    x: np.ndarray,
    vector_leg: Any,
) -> list[list[dict[str, Any]]]:
    """The hybrid results of each query row of ``x``: ``{"id", "score", "metadata"?}`` by
    descending fused score. ``vector_leg(params)`` runs the vector search (the query service's,
    so both legs see the same checks and probing)."""
    window = hybrid.window_mult * params.top_k
    with_metadata = params.fields.metadata
    q = hybrid.search.query(cv.config, params.filter, window, with_metadata)
    metadata: dict[str, bytes | None] = {}
    rows: list[list[str]] = [[] for _ in range(len(x))]
    if hybrid.alpha > 0:
        hits = await vector_leg(replace(params, top_k=window))
        ids = hits.ids.tolist()
        meta = hits.metadata.tolist() if with_metadata and hits.metadata is not None else None
        for r, n in enumerate(hits.counts.tolist()):
            rows[r] = ids[r][:n]
            if meta is not None:
                metadata.update(zip(rows[r], meta[r][:n], strict=True))
    text_ids: list[str] = []
    if hybrid.alpha < 1:
        text = await gateway.text_search(engine, cv, q)
        text_ids = text.ids
        if text.metadata is not None:
            metadata.update(zip(text.ids, text.metadata, strict=True))
    out = []
    for row in rows:
        best = gateway.fuse(row, text_ids, hybrid.alpha, hybrid.rrf_k, params.top_k)
        entries: list[dict[str, Any]] = [{"id": i, "score": s} for i, s in best]
        if with_metadata:
            for e in entries:
                m = metadata.get(e["id"])
                e["metadata"] = orjson.Fragment(NO_METADATA_JSON if m is None else m)
        out.append(entries)
    return out
