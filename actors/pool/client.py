"""The typed client through which the gateway and the control plane call one partition on the
pool actor hosting it (the calls of actors.pool.calls.ShardCalls); how each call crosses is
actors.pool.wire's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from ray import ObjectRef

from actors import constants
from actors.engine.filters import FilterNode
from actors.engine.updates import Update
from actors.errors import VaultvecError
from actors.pool import channel, wire
from actors.pool.calls import ShardCalls
from actors.types import (
    BackupSource,
    Fetched,
    Partition,
    PoolStats,
    SearchRequest,
    SearchResult,
    ShardStats,
    TextHits,
    TextQuery,
    TextStats,
    UpsertBatch,
)

__all__ = ["ShardCalls", "ShardClient"]


class PiecesWritten(Exception):
    """A multi-piece upsert failed after some of its pieces were written: their ids, and the
    failure (the gateway tells the client which items were not written)."""

    def __init__(self, written: list[str], failure: VaultvecError) -> None:
        super().__init__(failure.detail)
        self.written, self.failure = written, failure


class ShardClient:
    """Typed calls to one partition on the pool actor hosting it (the calls of
    actors.pool.calls.ShardCalls). Each method returns the call's ObjectRef (await it in the
    gateway, ``ray.get`` it in the control plane) except :meth:`search`, :meth:`get` and
    :meth:`upsert`, which await (and decode), and :meth:`sample`, which streams."""

    def __init__(self, handle: Any, partition: Partition) -> None:
        self.handle = handle
        self.partition = partition
        self._p = partition.encode()  # what each call carries (Partition.encode)

    async def search(self, key: bytes, req: SearchRequest) -> SearchResult:
        """The partition's top-k for ``req``."""
        return await self._search(key, wire.pack(req))

    @staticmethod
    def searching(
        key: bytes, req: SearchRequest, n_calls: int
    ) -> Callable[[ShardClient], Awaitable[SearchResult]]:
        """:meth:`search` of ``req`` for ``n_calls`` partitions (a fan-out): packed once, and
        a large one stored once in Ray's object store for all of them (wire.shared)."""
        blob = wire.shared(wire.pack(req), n_calls)
        return lambda client: client._search(key, blob)

    async def _search(self, key: bytes, req: bytes | ObjectRef[bytes]) -> SearchResult:
        """A small request goes inside its frame, over the actor's same-node socket when it has
        one (actors.pool.channel), else by a Ray call; a large one (framing would copy it twice
        more) or a stored copy (Ray resolves only a call's own arguments) beside its frame."""
        if isinstance(req, bytes) and len(req) <= constants.FRAMED_BYTES:
            blob = await self._framed(wire.search_frame(self._p, key, req))
        else:
            blob = await self.handle.framed.remote(wire.search_frame(self._p, key, None), req)
        return wire.unpack_result(blob)

    async def _framed(self, call: bytes) -> bytes:
        """The answer to a framed ``call``: over the actor's same-node socket (actors.pool.
        channel) when it takes it, else by a Ray call."""
        blob = await channel.call(self.handle, channel.FRAMED, call)
        if blob is None:
            blob = await self.handle.framed.remote(call)
        return blob

    async def upsert(self, key: bytes, batch: UpsertBatch) -> ShardStats:
        """The batch in :func:`wire.pieces`, one call each, UPSERT_PIECES_IN_FLIGHT under way at
        a time (the next crosses while the shard writes one; more would only hold more of the
        pool actor's threads waiting for the partition's write lock); a batch of more than
        LARGE_UPSERT_BYTES (actors.constants) on the pool actor's upsert threads
        (:data:`wire.UPSERT_GROUP`).
        Awaited: the partition's state after the last piece applied. When a piece fails, no
        further piece is sent, the ones under way are waited for, and the failure is raised:
        nothing is written after the caller learns of it. The pieces before may be written; an
        upsert is safe to repeat (the items of one request have distinct ids, so their order
        is free)."""
        parts, size = wire.pieces(batch)
        upsert = self.handle.upsert
        if size > constants.LARGE_UPSERT_BYTES:
            upsert = upsert.options(concurrency_group=wire.UPSERT_GROUP)
        if len(parts) == 1:
            stats: ShardStats = await upsert.remote(self._p, key, batch)
            return stats

        async def send(piece: UpsertBatch) -> ShardStats:
            answer: ShardStats = await upsert.remote(self._p, key, piece)
            return answer

        done: list[ShardStats] = []
        under_way: set[asyncio.Task[ShardStats]] = set()
        piece_of: dict[asyncio.Task[ShardStats], UpsertBatch] = {}
        try:
            for piece in parts:
                while len(under_way) >= constants.UPSERT_PIECES_IN_FLIGHT:
                    finished, under_way = await asyncio.wait(
                        under_way, return_when=asyncio.FIRST_COMPLETED
                    )
                    done += await asyncio.gather(*finished)  # a failure stops the sending
                task = asyncio.ensure_future(send(piece))
                under_way.add(task)
                piece_of[task] = piece
            done += await asyncio.gather(*under_way)
        except Exception as exc:
            # sent: let them land before the caller hears of the failure (their own failures,
            # if any, are retrieved here and dropped: the first one is raised)
            await asyncio.gather(*under_way, return_exceptions=True)
            written = [
                i
                for task, piece in piece_of.items()
                if task.done() and not task.cancelled() and task.exception() is None
                for i in piece.ids
            ]
            if written and isinstance(exc, VaultvecError):  # others are retried whole
                raise PiecesWritten(written, exc) from exc
            raise
        except BaseException:  # cancelled (the caller's deadline, or it went away)
            for task in under_way:
                task.cancel()
            raise
        return max(done, key=lambda st: (st.version, st.count))

    def delete(self, key: bytes, ids: list[str]) -> ObjectRef[int]:
        return self.handle.delete.remote(self._p, key, ids)

    def delete_matching(
        self, key: bytes, node: FilterNode | None, ids: list[str] | None = None
    ) -> ObjectRef[int]:
        return self.handle.delete_matching.remote(self._p, key, node, ids)

    def count_matching(self, key: bytes, node: FilterNode | None) -> ObjectRef[int]:
        return self.handle.count_matching.remote(self._p, key, node)

    def update(
        self, key: bytes, node: FilterNode | None, ids: list[str] | None, update: Update
    ) -> ObjectRef[int]:
        return self.handle.update.remote(self._p, key, node, ids, update)

    async def get(
        self, key: bytes, ids: list[str], vectors: bool, metadata: bool, contents: bool
    ) -> Fetched:
        """The stored fields of those of ``ids`` the partition holds (awaited); a few ids
        framed and over the actor's same-node socket when it has one (actors.pool.channel),
        answered as bytes, which Ray passes for less than the Fetched dataclass. More come back
        as the dataclass, whose vectors Ray passes without the copies pickling would make."""
        if len(ids) <= constants.PACKED_GET_IDS:
            call = wire.get_frame(self._p, key, ids, vectors, metadata, contents)
            return wire.unpack_fetched(await self._framed(call))
        fetched: Fetched = await self.handle.get.remote(
            self._p, key, ids, vectors, metadata, contents
        )
        return fetched

    def match_ids(
        self,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None,
        ascending: bool,
        after: str | None = None,
    ) -> ObjectRef[list[Any]]:
        return self.handle.match_ids.remote(self._p, key, node, limit, order_by, ascending, after)

    def text_stats(
        self, key: bytes, fields: tuple[str, ...], terms: tuple[str, ...]
    ) -> ObjectRef[tuple[TextStats, ...]]:
        return self.handle.text_stats.remote(self._p, key, fields, terms)

    def text_search(self, key: bytes, q: TextQuery) -> ObjectRef[TextHits]:
        return self.handle.text_search.remote(self._p, key, q)

    def stats(self, key: bytes, footprint: bool = False) -> ObjectRef[ShardStats]:
        return self.handle.stats.remote(self._p, key, footprint)

    def sample(self, key: bytes, n: int, seed: int) -> Any:
        """Up to ``n`` live vectors for training, as Ray's generator of references to their
        :func:`wire.chunks` (``ray.get`` each and concatenate)."""
        return self.handle.sample.options(num_returns="streaming").remote(self._p, key, n, seed)

    def backup(self, key: bytes, backup_id: str) -> Any:
        """The partition's part of a backup: Ray's generator of references to its sealed chunks
        (the state is taken when the call starts)."""
        # A few chunks ahead of the reader at most: the object store does not fill with the
        # index while a slow client reads it.
        options = {"num_returns": "streaming", "_generator_backpressure_num_objects": 4}
        return self.handle.backup.options(**options).remote(self._p, key, backup_id)

    def restore_chunk(
        self, key: bytes, source: BackupSource, n: int, total: int, chunk: bytes
    ) -> ObjectRef[int | None]:
        return self.handle.restore_chunk.remote(self._p, key, source, n, total, chunk)

    def restored(self) -> ObjectRef[tuple[str, int] | None]:
        return self.handle.restored.remote(self._p)

    def pool_stats(self) -> ObjectRef[PoolStats]:
        """The memory of the pool actor hosting the partition."""
        return self.handle.pool_stats.remote()

    def rebuild(
        self,
        key: bytes,
        version: int,
        template: np.ndarray | ObjectRef[np.ndarray],
        nprobe_table: tuple[tuple[int, int], ...],
        batch_size: int,
    ) -> ObjectRef[ShardStats]:
        return self.handle.rebuild.remote(self._p, key, version, template, nprobe_table, batch_size)

    @staticmethod
    def rebuild_all(
        shards: list[ShardClient],
        key: bytes,
        version: int,
        template: np.ndarray,
        nprobe_table: tuple[tuple[int, int], ...],
        batch_size: int,
    ) -> list[ObjectRef[ShardStats]]:
        """:meth:`rebuild` of every partition of an index from one trained template, stored
        once in Ray's object store when it is large (wire.shared)."""
        ref = wire.shared(template, len(shards))
        return [sh.rebuild(key, version, ref, nprobe_table, batch_size) for sh in shards]

    def begin_rotation(self, key: bytes, new_key: bytes, epoch: int) -> ObjectRef[None]:
        """Key rotation (actors.control.rotation): the partition's state sealed under ``new_key`` into
        key epoch ``epoch``, and every later write under both keys."""
        return self.handle.begin_rotation.remote(self._p, key, new_key, epoch)

    def commit_rotation(self, epoch: int) -> ObjectRef[None]:
        return self.handle.commit_rotation.remote(self._p, epoch)

    def abort_rotation(self, epoch: int) -> ObjectRef[None]:
        return self.handle.abort_rotation.remote(self._p, epoch)
