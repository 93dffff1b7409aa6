"""The reads of a shard: vector search, lookups by id, filter matches and counts, BM25, and the
training sample. actors.engine.shard.Shard inherits them; they take its shared lock
(``_reading``) and read the state it holds."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import faiss
import numpy as np

from actors import constants
from actors.engine import fulltext, search
from actors.engine.filters import FilterNode
from actors.engine.fullvectors import FullVectors, rerank
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex
from actors.engine.selection import Selections
from actors.engine.strings import StringBlock
from actors.types import (
    REACH_SCALES,
    Fetched,
    SearchRequest,
    SearchResult,
    TextHits,
    TextQuery,
    TextStats,
)


class ShardReads:
    items: ItemTable
    partition: PartitionIndex | None
    vectors: FullVectors | None
    version: int
    nprobe_table: tuple[tuple[int, int], ...]
    threads: int
    selections: Selections

    def _reading(self, key: bytes) -> AbstractContextManager[None]:
        raise NotImplementedError

    def search(self, key: bytes, req: SearchRequest) -> SearchResult:
        """Local top-k for a batch of queries, and how many live items match the filter."""
        # OpenMP's thread count is per calling thread, and Ray runs calls on a pool of threads.
        # Small batches search on this thread alone: starting OpenMP's team costs more than
        # their scan, and concurrent single queries already use the cores.
        nq, k = len(req.queries), req.k
        faiss.omp_set_num_threads(self.threads if nq >= constants.BATCH_THREADS_MIN else 1)
        with self._reading(key):
            part = self.partition
            if part is None or part.ntotal == 0:
                dist = np.full((nq, k), np.inf, dtype=np.float32)
                meta = np.empty((nq, k), dtype=object) if req.with_metadata else None
                measuring = req.probing.mode == "measure"
                none = np.full((nq, k), np.nan) if measuring else None  # no result to need
                reach = np.zeros((nq, len(REACH_SCALES)), np.int32) if measuring else None
                empty = SearchResult(dist, StringBlock.empty((nq, k)), meta, self.version)
                return replace(empty, needed=none, lists_needed=none, reach=reach)
            sel = self.selections.of(self.items, part, req.filter)
            bits, n_match = sel.bits, sel.matched
            scope = search.Scope(self.version, self.nprobe_table, sel, len(self.items))
            strategy = search.strategy_for(req, self.version)
            mult = self._rerank_mult(req)
            found = strategy(part, replace(req, k=k * mult) if mult > 1 else req, bits, scope)
            dist, labels = found.distances, found.labels
            needed, lists_needed = found.needed, found.lists_needed
            if mult > 1:  # the codes' candidates, ranked again by their full vectors
                assert self.vectors is not None
                dist, labels, col = rerank(self.vectors, req.queries, labels, k)
                if needed is not None:
                    needed = np.take_along_axis(needed, col, axis=1)
                if lists_needed is not None:
                    lists_needed = np.take_along_axis(lists_needed, col, axis=1)
            dist[labels < 0] = np.inf
            ids = self.items.gather_ids(labels)
            meta = self.items.gather(labels, "metadata") if req.with_metadata else None
            return SearchResult(
                dist,
                ids,
                meta,
                self.version,
                found.scanned,
                needed,
                found.bucket,
                n_match,
                lists_needed,
                found.reach,
            )

    def _rerank_mult(self, req: SearchRequest) -> int:
        """How many candidates per result the codes give for reranking (1: none): only a
        partition that keeps full vectors reranks."""
        if self.vectors is None:
            return 1
        mult = req.rerank_mult or constants.RERANK_MULT
        # At most RERANK_MAX_CANDIDATES a query (a large top_k reranks fewer per result).
        return max(1, min(mult, constants.RERANK_MAX_CANDIDATES // max(req.k, 1)))

    def _vectors(self, labels: np.ndarray) -> np.ndarray:
        """The vectors of ``labels`` in index space: the full vectors where a compressed
        partition keeps them, else decoded from the lists."""
        if self.vectors is not None:
            return self.vectors.get(labels)
        assert self.partition is not None
        return self.partition.reconstruct(labels)

    def get(
        self, key: bytes, ids: Sequence[str], vectors: bool, metadata: bool, contents: bool
    ) -> Fetched:
        with self._reading(key):
            found, labels = self.items.find(ids)
            vecs = None
            part = self.partition
            # The originals only: flat lists hold them, a compressed partition's file keeps
            # them (one trained before it kept them has codes alone, and returns none).
            if vectors and part is not None and (part.is_flat or self.vectors is not None):
                vecs = self._vectors(labels)
                if self.items.norms.size and np.any(self.items.norms[labels]):
                    vecs = vecs * self.items.norms[labels][:, None]
            return Fetched(
                ids=found,
                vectors=vecs,
                metadata=self.items.metadata[labels].tolist() if metadata else None,
                contents=self.items.contents[labels].tolist() if contents else None,
            )

    def list_ids(self, key: bytes) -> list[str]:
        with self._reading(key):
            return self.items.all_ids()

    def match_ids(
        self,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None = None,
        ascending: bool = True,
        after: str | None = None,
    ) -> list[Any]:
        """The items that ``node`` matches (all when None), at most ``limit``: their ids, or
        with ``order_by`` their ``(sort key, id)`` pairs in order (ItemTable.order); with
        ``after`` (a cursor's page) the ids above it, in id order (ItemTable.page)."""
        with self._reading(key):
            if after is not None:
                return self.items.page(node, after, limit or len(self.items))
            labels = self.items.matching(node)
            if order_by is None:
                return self.items.ids_of(labels if limit is None else labels[:limit])
            return self.items.order(labels, order_by, ascending)[:limit]

    def text_stats(
        self, key: bytes, fields: Sequence[str], terms: Sequence[str]
    ) -> tuple[TextStats, ...]:
        """Each full-text field's collection statistics for ``terms`` (actors.engine.fulltext)."""
        with self._reading(key):
            return tuple(self.items.text_field(f).stats(terms) for f in fields)

    def text_search(self, key: bytes, q: TextQuery) -> TextHits:
        """The best ``q.k`` BM25 matches among the items ``q.filter`` matches, descending
        score, ties by id; scored with ``q.stats`` (index-wide) when given."""
        with self._reading(key):
            items = self.items
            indexes = [items.text_field(f) for f in q.fields]
            stats = q.stats or tuple(index.stats(q.terms) for index in indexes)
            allowed = None
            if q.filter is not None:
                n = items.next_label
                allowed = items.columns.evaluate(q.filter, n) & items.alive[:n]
            labels, scores = fulltext.score(
                indexes, q.weights, q.terms, stats, q.k1, q.b, q.require_all, allowed
            )
            pos, ids = fulltext.top(scores, q.k, lambda p: items.ids_of(labels[p]))
            meta = items.metadata[labels[pos]].tolist() if q.with_metadata else None
            return TextHits(ids, scores[pos].tolist(), meta)

    def count_matching(self, key: bytes, node: FilterNode | None) -> int:
        """How many live items ``node`` matches (all when None), from the filter columns."""
        with self._reading(key):
            return self.selections.of(self.items, self.partition, node).matched

    def sample(self, key: bytes, n: int, seed: int = 0) -> np.ndarray:
        """Up to ``n`` live vectors in index space, for training."""
        with self._reading(key):
            labels = self.items.live_labels()
            if self.partition is None or len(labels) == 0:
                return np.zeros((0, 0), dtype=np.float32)
            if len(labels) > n:
                labels = np.sort(np.random.default_rng(seed).choice(labels, n, replace=False))
            return self._vectors(labels)
