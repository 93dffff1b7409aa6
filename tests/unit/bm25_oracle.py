"""The reference BM25 the engine's full-text scores are compared with: rank-bm25 (a widely used
implementation) with Lucene's idf, on the engine's analyser, one model per field."""

from __future__ import annotations

import math
from typing import Any

from rank_bm25 import BM25Okapi

from actors.engine.fulltext import analyse, field_text, query_terms

K1, B = 1.2, 0.75


class LuceneBM25(BM25Okapi):
    """rank-bm25's BM25 with Lucene's idf, ln(1 + (N - df + 0.5) / (df + 0.5)): never
    negative, as the engine's (rank-bm25's Okapi idf floors common terms at an epsilon)."""

    def _calc_idf(self, nd: dict[str, int]) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


def oracle(
    docs: dict[str, dict[str, Any]],
    fields: list[str],
    weights: list[float],
    text: str,
    require_all: bool = False,
    allowed: set[str] | None = None,
    k1: float = K1,
    b: float = B,
) -> dict[str, float]:
    """id -> score of every matching item, one rank-bm25 model per field over the items with
    some text in it."""
    terms = query_terms(text)
    total: dict[str, float] = {}
    held: dict[str, set[str]] = {}
    for field, weight in zip(fields, weights, strict=True):
        corpus = {}
        for item_id, meta in docs.items():
            tokens = analyse(field_text(meta, field) or "")
            if tokens:
                corpus[item_id] = tokens
        if not corpus:
            continue
        model = LuceneBM25(list(corpus.values()), k1=k1, b=b)
        scores = model.get_scores(list(terms))
        for (item_id, tokens), s in zip(corpus.items(), scores, strict=True):
            present = set(terms) & set(tokens)
            if present:
                total[item_id] = total.get(item_id, 0.0) + weight * float(s)
                held.setdefault(item_id, set()).update(present)
    out = {
        i: s
        for i, s in total.items()
        if (not require_all or held[i] == set(terms)) and (allowed is None or i in allowed)
    }
    return out
