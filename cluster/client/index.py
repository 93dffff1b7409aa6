"""Index handles of the Python client: ``Index`` (sync) and ``AsyncIndex`` (asyncio).

Both build the same request plans (cluster.client.calls); ``Index`` runs them on a ``Runner``
(``Client`` is one), ``AsyncIndex`` awaits them on an ``AsyncRunner`` (``AsyncClient``). The
protocols (cluster.client.runner) are all a handle knows of its client, so this module does not
import the clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import cluster.client.calls as calls
from cluster.client.errors import AuthenticationError
from cluster.client.plans import IndexPlans
from cluster.client.results import QueryResult
from cluster.client.runner import AsyncRunner, Runner


class Index(IndexPlans[Runner]):
    def upsert(
        self,
        ids: Sequence[Any],
        vectors: Any = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        contents: Sequence[str | None] | None = None,
        *,
        binary: bool | None = None,
    ) -> int:
        """Store (or replace) ``ids`` with the rows of ``vectors`` (n, d); returns the count.
        Without ``vectors``, every item is embedded on the server from its ``contents`` (an
        index created with an ``embedding_model``). ``binary`` forces (True/False) the compact
        array route for vectors."""
        return self.client.run(self._upsert(ids, vectors, metadata, contents, binary))

    def query(
        self,
        vectors: Any = None,
        top_k: int | None = None,
        *,
        contents: str | None = None,
        n_probes: int | None = None,
        filters: dict[str, Any] | None = None,
        greedy: bool | None = None,
        include: Sequence[str] | None = None,
        binary: bool | None = None,
        rerank_mult: int | None = None,
        text: str | None = None,
        text_fields: Sequence[str] | None = None,
        text_field_weights: Sequence[float] | None = None,
        require_all_terms: bool | None = None,
        alpha: float | None = None,
        rrf_k: float | None = None,
        window_mult: int | None = None,
    ) -> QueryResult:
        """Nearest neighbours of one vector (1-D), a batch (2-D) or, with ``contents``, of one
        text embedded on the server (flat results, as for a 1-D vector): exactly one of
        ``vectors`` and ``contents``. ``include`` picks among distance, metadata (the default
        pair), vector and contents; asking for vector or contents sends the query to the JSON
        route, the only one that returns them. With ``text`` the query is hybrid: a BM25 leg
        over the index's full_text fields fused with the vector leg (``alpha`` 0 = BM25 only,
        1 = vectors only; ``rrf_k``, ``window_mult``), ranked by ``scores`` (JSON route).
        ``rerank_mult``: on ivf/ivfpq indexes, candidates per result reranked by the full
        vectors (server default 10). See ``QueryResult``."""
        return self.client.run(
            self._query(
                vectors,
                contents,
                top_k,
                binary,
                n_probes=n_probes,
                rerank_mult=rerank_mult,
                filters=filters,
                greedy=greedy,
                include=None if include is None else list(include),
                **calls.hybrid(
                    text,
                    text_fields,
                    text_field_weights,
                    require_all_terms,
                    alpha=alpha,
                    rrf_k=rrf_k,
                    window_mult=window_mult,
                ),
            )
        )

    def query_metadata(
        self,
        filters: dict[str, Any] | None = None,
        *,
        top_k: int | None = None,
        include: Sequence[str] | None = None,
        order_by: str | dict[str, int] | None = None,
        ascending: bool | None = None,
        text: str | None = None,
        text_fields: Sequence[str] | None = None,
        text_field_weights: Sequence[float] | None = None,
        require_all_terms: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Items by metadata alone: ``{"id", ...include}`` rows of the items ``filters``
        matches, in ``order_by``'s order if given, at most ``top_k``; with ``text``, the items
        matching it by descending BM25 ``score`` (each row carries it)."""
        call = self._query_metadata(
            filters,
            top_k,
            include,
            order_by,
            ascending,
            calls.hybrid(text, text_fields, text_field_weights, require_all_terms),
        )
        return list(self.client.call(call)["results"])

    def scan(
        self,
        filters: dict[str, Any] | None = None,
        *,
        include: Sequence[str] | None = None,
        page_size: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """Every item ``filters`` matches (every item without one) as ``{"id", ...include}``
        rows, in id order, fetched a page at a time through a cursor: each item present for
        the whole scan comes exactly once, whatever is written meanwhile."""
        cursor = None
        while True:
            page = self.client.call(self._page(filters, include, page_size, cursor))
            yield from page["results"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    def get(self, ids: Sequence[str], include: Sequence[str] | None = None) -> list[dict]:
        """Items by id (unknown ids omitted); ``vector`` comes back as a float32 array."""
        return self.client.run(calls.get(self._ref, ids, include))

    def delete(
        self,
        ids: Sequence[str] | None = None,
        *,
        filters: dict[str, Any] | None = None,
        all: bool | None = None,
    ) -> int:
        """Delete ``ids``, or the items ``filters`` matches (among ``ids`` if given), or with
        ``all=True`` every item; returns how many were deleted."""
        return int(self.client.call(self._delete(ids, filters, all))["deleted_count"])

    def update(
        self,
        ids: Sequence[str] | None = None,
        *,
        filters: dict[str, Any] | None = None,
        all: bool | None = None,
        set: dict[str, Any] | None = None,
        unset: Sequence[str] | None = None,
        contents: str | None = None,
    ) -> int:
        """Change items in place, vectors untouched: ``set`` metadata fields (dot paths) to
        values, ``unset`` others, replace ``contents``; of ``ids``, of the items ``filters``
        matches (among ``ids`` if given), or with ``all=True`` of every item. Returns how many
        were updated."""
        call = self._update(ids, filters, all, set, unset, contents)
        return int(self.client.call(call)["updated_count"])

    def count(self, filters: dict[str, Any] | None = None) -> int:
        """How many items ``filters`` matches (every item without one), exact."""
        return int(self.client.call(self._call("vectors/count", filters=filters))["count"])

    def train(
        self,
        *,
        n_lists: int | None = None,
        batch_size: int | None = None,
        max_iters: int | None = None,
        tolerance: float | None = None,
        max_memory: int | None = None,
    ) -> str:
        """Train (or re-train) now; None (or 0) = the server's default (n_lists automatic).
        Returns "success" or "in_progress"."""
        call = self._train(n_lists, batch_size, max_iters, tolerance, max_memory)
        return str(self.client.call(call)["status"])

    def describe(self) -> dict[str, Any]:
        return dict(self.client.call(self._call("indexes/describe")))

    def list_ids(self) -> list[str]:
        return list(self.client.call(self._call("vectors/list_ids"))["ids"])

    def num_vectors(self) -> int:
        return int(self.client.call(self._call("vectors/num_vectors"))["result"])

    def drop(self) -> None:
        """Delete the index and every stored byte of it."""
        self.client.call(self._call("indexes/delete"))

    def rotate_key(self, new_key: str) -> None:
        """Re-seal every stored byte of the index under ``new_key`` (64 hex characters) while
        it serves; once this returns only ``new_key`` opens the index, and this handle uses
        it. Safe to call again after a lost answer: a refused old key is taken as done when
        the new one opens the index. Raises ConflictError while the index trains."""
        try:
            self.client.call(self._rotate(new_key))
        except AuthenticationError:
            if not self._opens(new_key):
                raise
        self._use_key(new_key)

    def _opens(self, key: str) -> bool:
        try:
            self.client.call(self._probe(key))
        except AuthenticationError:
            return False
        return True


class AsyncIndex(IndexPlans[AsyncRunner]):
    async def upsert(
        self,
        ids: Sequence[Any],
        vectors: Any = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        contents: Sequence[str | None] | None = None,
        *,
        binary: bool | None = None,
    ) -> int:
        return await self.client.run(self._upsert(ids, vectors, metadata, contents, binary))

    async def query(
        self,
        vectors: Any = None,
        top_k: int | None = None,
        *,
        contents: str | None = None,
        n_probes: int | None = None,
        filters: dict[str, Any] | None = None,
        greedy: bool | None = None,
        include: Sequence[str] | None = None,
        binary: bool | None = None,
        rerank_mult: int | None = None,
        text: str | None = None,
        text_fields: Sequence[str] | None = None,
        text_field_weights: Sequence[float] | None = None,
        require_all_terms: bool | None = None,
        alpha: float | None = None,
        rrf_k: float | None = None,
        window_mult: int | None = None,
    ) -> QueryResult:
        return await self.client.run(
            self._query(
                vectors,
                contents,
                top_k,
                binary,
                n_probes=n_probes,
                rerank_mult=rerank_mult,
                filters=filters,
                greedy=greedy,
                include=None if include is None else list(include),
                **calls.hybrid(
                    text,
                    text_fields,
                    text_field_weights,
                    require_all_terms,
                    alpha=alpha,
                    rrf_k=rrf_k,
                    window_mult=window_mult,
                ),
            )
        )

    async def query_metadata(
        self,
        filters: dict[str, Any] | None = None,
        *,
        top_k: int | None = None,
        include: Sequence[str] | None = None,
        order_by: str | dict[str, int] | None = None,
        ascending: bool | None = None,
        text: str | None = None,
        text_fields: Sequence[str] | None = None,
        text_field_weights: Sequence[float] | None = None,
        require_all_terms: bool | None = None,
    ) -> list[dict[str, Any]]:
        call = self._query_metadata(
            filters,
            top_k,
            include,
            order_by,
            ascending,
            calls.hybrid(text, text_fields, text_field_weights, require_all_terms),
        )
        return list((await self.client.call(call))["results"])

    async def scan(
        self,
        filters: dict[str, Any] | None = None,
        *,
        include: Sequence[str] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor = None
        while True:
            page = await self.client.call(self._page(filters, include, page_size, cursor))
            for row in page["results"]:
                yield row
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    async def get(self, ids: Sequence[str], include: Sequence[str] | None = None) -> list[dict]:
        return await self.client.run(calls.get(self._ref, ids, include))

    async def delete(
        self,
        ids: Sequence[str] | None = None,
        *,
        filters: dict[str, Any] | None = None,
        all: bool | None = None,
    ) -> int:
        body = await self.client.call(self._delete(ids, filters, all))
        return int(body["deleted_count"])

    async def update(
        self,
        ids: Sequence[str] | None = None,
        *,
        filters: dict[str, Any] | None = None,
        all: bool | None = None,
        set: dict[str, Any] | None = None,
        unset: Sequence[str] | None = None,
        contents: str | None = None,
    ) -> int:
        call = self._update(ids, filters, all, set, unset, contents)
        return int((await self.client.call(call))["updated_count"])

    async def count(self, filters: dict[str, Any] | None = None) -> int:
        body = await self.client.call(self._call("vectors/count", filters=filters))
        return int(body["count"])

    async def train(
        self,
        *,
        n_lists: int | None = None,
        batch_size: int | None = None,
        max_iters: int | None = None,
        tolerance: float | None = None,
        max_memory: int | None = None,
    ) -> str:
        call = self._train(n_lists, batch_size, max_iters, tolerance, max_memory)
        return str((await self.client.call(call))["status"])

    async def describe(self) -> dict[str, Any]:
        return dict(await self.client.call(self._call("indexes/describe")))

    async def list_ids(self) -> list[str]:
        return list((await self.client.call(self._call("vectors/list_ids")))["ids"])

    async def num_vectors(self) -> int:
        return int((await self.client.call(self._call("vectors/num_vectors")))["result"])

    async def drop(self) -> None:
        await self.client.call(self._call("indexes/delete"))

    async def rotate_key(self, new_key: str) -> None:
        """As ``Index.rotate_key``."""
        try:
            await self.client.call(self._rotate(new_key))
        except AuthenticationError:
            if not await self._opens(new_key):
                raise
        self._use_key(new_key)

    async def _opens(self, key: str) -> bool:
        try:
            await self.client.call(self._probe(key))
        except AuthenticationError:
            return False
        return True
