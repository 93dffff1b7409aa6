"""Query results of the client: ``QueryResult`` and the decoding of both answer forms (the JSON
route's result lists, the compact array route's counts + flat ids + base64 distances)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pybase64

F32 = np.dtype("<f4")
# What only the JSON route returns: a query whose include asks for one of these goes there.
JSON_ONLY_FIELDS = frozenset({"vector", "contents"})


@dataclass(frozen=True)
class QueryResult:
    """Nearest neighbours as arrays, ascending distance.

    A batch (2-D input) gives ``ids`` (nq, k) object and ``distances`` (nq, k) float32 where
    row q holds ``counts[q]`` results then padding (id None, distance +inf); ``metadata``
    (nq, k) object of dicts when asked for. A single query (1-D input) gives 1-D arrays of
    exactly its results.

    When ``include`` asks for them (always None otherwise), ``vectors`` is an object array of
    the same shape holding each result's stored vector as a float32 array (None for padding,
    and on an ivf/ivfpq index trained before the server kept the originals) and ``contents``
    one holding each result's contents (None for padding and items without contents).

    A hybrid query (``text``) ranks by fused relevance instead: ``scores`` (the shape of
    ``ids``, float64, descending, NaN for padding) and no ``distances``.
    """

    ids: np.ndarray
    distances: np.ndarray | None
    counts: np.ndarray
    metadata: np.ndarray | None = None
    vectors: np.ndarray | None = None
    contents: np.ndarray | None = None
    scores: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)


def decode_arrays_query(body: dict[str, Any]) -> QueryResult:
    nq, k = int(body["nq"]), int(body["top_k"])
    counts = np.asarray(body["counts"], dtype=np.int64)
    dist = None
    if body.get("distances") is not None:
        raw = pybase64.b64decode(body["distances"])
        dist = np.frombuffer(raw, dtype=F32).reshape(nq, k)
    meta = body.get("metadata")
    return QueryResult(
        scatter(body["ids"], counts, k),
        dist,
        counts,
        None if meta is None else scatter(meta, counts, k),
    )


def scatter(flat: list[Any], counts: np.ndarray, k: int) -> np.ndarray:
    """Flat per-query results -> (nq, k) object array padded with None."""
    nq = len(counts)
    out = np.empty((nq, k), dtype=object)
    if nq and int(counts.min()) == k:
        out.ravel()[:] = flat
    else:
        out[np.arange(k)[None, :] < counts[:, None]] = flat
    return out


def json_query_decoder(
    nq: int, k: int, single_row: bool, include: Sequence[str] | None = None
) -> Callable[[Any], QueryResult]:
    """The JSON route's answer -> padded arrays; ``vectors`` and ``contents`` are filled when
    ``include`` asks for them."""
    want_vectors = include is not None and "vector" in include
    want_contents = include is not None and "contents" in include

    def decode(body: dict[str, Any]) -> QueryResult:
        rows = [body["results"]] if single_row else body["results"]
        width = max([k, *(len(r) for r in rows)])
        ids = np.empty((nq, width), dtype=object)
        dist = np.full((nq, width), np.inf, dtype=np.float32)
        meta = np.empty((nq, width), dtype=object)
        vecs = np.empty((nq, width), dtype=object) if want_vectors else None
        texts = np.empty((nq, width), dtype=object) if want_contents else None
        scores = np.full((nq, width), np.nan)
        has_dist = has_meta = has_score = False
        counts = np.zeros(nq, dtype=np.int64)
        for q, row in enumerate(rows):
            counts[q] = len(row)
            for j, entry in enumerate(row):
                ids[q, j] = entry["id"]
                if entry.get("distance") is not None:
                    dist[q, j] = entry["distance"]
                    has_dist = True
                if entry.get("score") is not None:
                    scores[q, j] = entry["score"]
                    has_score = True
                if "metadata" in entry:
                    meta[q, j] = entry["metadata"]
                    has_meta = True
                if vecs is not None and entry.get("vector") is not None:
                    vecs[q, j] = np.asarray(entry["vector"], dtype=np.float32)
                if texts is not None:
                    texts[q, j] = entry.get("contents")
        return QueryResult(
            ids,
            dist if has_dist else None,
            counts,
            meta if has_meta else None,
            vecs,
            texts,
            scores if has_score else None,
        )

    return decode


def concat(results: Sequence[QueryResult]) -> QueryResult:
    width = max(r.ids.shape[1] for r in results)

    def pad(a: np.ndarray, fill: Any) -> np.ndarray:
        if a.shape[1] == width:
            return a
        out = np.full((a.shape[0], width), fill, dtype=a.dtype)
        out[:, : a.shape[1]] = a
        return out

    def cat(arrays: list[np.ndarray | None], fill: Any) -> np.ndarray | None:
        if any(a is None for a in arrays):
            return None
        return np.concatenate([pad(a, fill) for a in arrays if a is not None])

    ids = cat([r.ids for r in results], None)
    assert ids is not None
    return QueryResult(
        ids,
        cat([r.distances for r in results], np.inf),
        np.concatenate([r.counts for r in results]),
        cat([r.metadata for r in results], None),
        cat([r.vectors for r in results], None),
        cat([r.contents for r in results], None),
        cat([r.scores for r in results], np.nan),
    )


def trim_single(r: QueryResult) -> QueryResult:
    n = int(r.counts[0])
    return QueryResult(
        r.ids[0, :n],
        None if r.distances is None else r.distances[0, :n],
        r.counts,
        None if r.metadata is None else r.metadata[0, :n],
        None if r.vectors is None else r.vectors[0, :n],
        None if r.contents is None else r.contents[0, :n],
        None if r.scores is None else r.scores[0, :n],
    )
