"""The shard contract: what a pool actor answers for the partitions it hosts. Each call is listed
once, in its typed form; how a call crosses (framed, packed, in pieces) is actors.pool.wire's,
and callers hold a typed client (actors.pool.client.ShardClient). A new shard call is written
once each here, in the pool actor (actors.pool.actor.ShardPool), in the partition
(actors.engine.shard.Shard) and in the client.

Every call names its partition (as :meth:`Partition.encode` gives it: a str, which Ray passes for
less than the dataclass) and carries the index's data key; requests and answers are the frozen
dataclasses of actors.types.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from actors.engine.filters import FilterNode
from actors.engine.updates import Update
from actors.metrics import Family
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


class ShardCalls(Protocol):
    """The calls a pool actor answers (actors.pool.actor.ShardPool implements them)."""

    def search(self, p: Partition | str, key: bytes, req: SearchRequest) -> SearchResult: ...

    def local_channel(self) -> tuple[str, str] | None: ...

    def framed(self, call: bytes, payload: bytes | None = None) -> bytes:
        """The transport's entry: a framed call of :data:`actors.pool.wire.FRAMED_CALLS`
        answered as bytes (actors.pool.wire.answer), over Ray or the same-node socket."""
        ...

    def upsert(self, p: Partition | str, key: bytes, batch: UpsertBatch) -> ShardStats: ...

    def delete(self, p: Partition | str, key: bytes, ids: list[str]) -> int: ...

    def delete_matching(
        self, p: Partition | str, key: bytes, node: FilterNode | None, ids: list[str] | None
    ) -> int: ...

    def count_matching(self, p: Partition | str, key: bytes, node: FilterNode | None) -> int: ...

    def update(
        self,
        p: Partition | str,
        key: bytes,
        node: FilterNode | None,
        ids: list[str] | None,
        update: Update,
    ) -> int: ...

    def get(
        self,
        p: Partition | str,
        key: bytes,
        ids: list[str],
        vectors: bool,
        metadata: bool,
        contents: bool,
    ) -> Fetched: ...

    def backup(
        self, p: Partition | str, key: bytes, backup_id: str
    ) -> Iterator[tuple[int, int, bytes]]: ...

    def restore_chunk(
        self, p: Partition | str, key: bytes, source: BackupSource, n: int, total: int, chunk: bytes
    ) -> int | None: ...

    def restored(self, p: Partition | str) -> tuple[str, int] | None: ...

    def match_ids(
        self,
        p: Partition | str,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None,
        ascending: bool,
        after: str | None = None,
    ) -> list[Any]: ...

    def text_stats(
        self, p: Partition | str, key: bytes, fields: tuple[str, ...], terms: tuple[str, ...]
    ) -> tuple[TextStats, ...]: ...

    def text_search(self, p: Partition | str, key: bytes, q: TextQuery) -> TextHits: ...

    def stats(self, p: Partition | str, key: bytes, footprint: bool) -> ShardStats: ...

    def sample(self, p: Partition | str, key: bytes, n: int, seed: int) -> Iterator[np.ndarray]: ...

    def rebuild(
        self,
        p: Partition | str,
        key: bytes,
        version: int,
        template: np.ndarray,
        nprobe_table: tuple[tuple[int, int], ...],
        batch_size: int,
    ) -> ShardStats: ...

    def begin_rotation(
        self, p: Partition | str, key: bytes, new_key: bytes, epoch: int
    ) -> None: ...

    def commit_rotation(self, p: Partition | str, epoch: int) -> None: ...

    def abort_rotation(self, p: Partition | str, epoch: int) -> None: ...

    def retire(self, index_id: str) -> None: ...

    def pool_stats(self) -> PoolStats: ...

    def metrics(self) -> list[Family]: ...

    def ping(self) -> str: ...
