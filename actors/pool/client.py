"""The shard contract: what a pool actor answers for the partitions it hosts (:class:`ShardCalls`)
and the typed client through which the gateway and the control plane call one partition
(:class:`ShardClient`).

Every call names its partition (as :meth:`Partition.encode` gives it: a str, which Ray passes for
less than the dataclass) and carries the index's data key; requests and answers are the frozen
dataclasses of actors.types. The exceptions to passing them as objects: a search request and
its result, and the answer to a get of a few ids, travel pickled to bytes (:func:`pack`),
because Ray's serializer costs more for small numpy-carrying dataclasses than the pickling does
(benchmarks/shard_hop.py: about 1.2x the round trip of a single query, 1.1x a get of one id),
and a fan-out then sends the same bytes to every shard.

Bulk data (an upsert's items, a training sample) crosses in pieces of at most
:data:`CALL_BYTES`, each inside its call. Through Ray's object store, an ingest's batches and a
training's sample left the store's shared memory holding as many pages as they had used: the
store does not give freed pages back, and a 100k x 128 ingest and training left 66 MB of them
(docs/performance.md, Footprint).
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

import numpy as np
import ray
from ray import ObjectRef

from actors.engine.filters import FilterNode
from actors.engine.strings import StringBlock
from actors.metrics import Family
from actors.pool import channel
from actors.types import (
    Fetched,
    Partition,
    PoolStats,
    SearchRequest,
    SearchResult,
    ShardStats,
    UpsertBatch,
)


class ShardCalls(Protocol):
    """The calls a pool actor answers (actors.pool.actor.ShardPool implements them)."""

    def search(self, p: Partition | str, key: bytes, req: SearchRequest) -> SearchResult: ...

    def search_packed(self, p: Partition | str, key: bytes, req: bytes) -> bytes: ...

    def search_framed(self, call: bytes) -> bytes: ...

    def local_channel(self) -> tuple[str, str] | None: ...

    def upsert(self, p: Partition | str, key: bytes, batch: UpsertBatch) -> ShardStats: ...

    def delete(self, p: Partition | str, key: bytes, ids: list[str]) -> int: ...

    def get(
        self,
        p: Partition | str,
        key: bytes,
        ids: list[str],
        vectors: bool,
        metadata: bool,
        contents: bool,
    ) -> Fetched: ...

    def get_packed(self, call: bytes) -> bytes: ...

    def list_ids(self, p: Partition | str, key: bytes) -> list[str]: ...

    def match_ids(
        self,
        p: Partition | str,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None,
        ascending: bool,
    ) -> list[Any]: ...

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


B = TypeVar("B", bytes, np.ndarray)

# A large request sent to several shards is put in Ray's object store once and every shard gets
# the reference; passed by value, each call carries (or stores) its own copy. With the inline
# limit vaultvec serve sets (1 MiB, cluster/fastpath.py), to 2 no-op actors: 300 KB by value
# 1.6 ms against 2.2 ms put once, 640 KB by value 2.6-2.9 ms against 2.2-2.4 ms.
SHARED_ARG_BYTES = 512 << 10


# The most bulk data one call carries (an upsert's piece, a piece of a training sample): under
# the 1 MiB that vaultvec runs Ray with (cluster/fastpath.py) with room for the call's own
# framing, so that Ray passes it inside the call, never through its object store.
CALL_BYTES = 768 << 10
UPSERT_PIECES_IN_FLIGHT = 2
# The pool actors' concurrency group for upserts of more than LARGE_UPSERT_BYTES
# (actors.pool.actor.UPSERT_THREADS); smaller ones run on the actor's other call threads.
UPSERT_GROUP = "upserts"
LARGE_UPSERT_BYTES = 64 << 10


# A get of up to this many ids goes in one frame and comes back pickled to bytes
# (ShardPool.get_packed): Ray passes
# bytes for about 57 us less per call than the Fetched dataclass. Larger gets come back as the
# dataclass, whose vectors Ray passes without the copies pickling them by hand would make.
PACKED_GET_IDS = 256


def pack(obj: SearchRequest | SearchResult | Fetched) -> bytes:
    """``obj`` pickled. A search request or result goes as its fields, each array as its
    dtype, shape and bytes: pickling the dataclasses' numpy arrays costs several times more (a
    single query's result: 26 us to pickle and 12 to load as the dataclass, a few as fields)."""
    cls = type(obj)
    if cls is SearchRequest or cls is SearchResult:
        kinds = bytearray()
        values: list[Any] = []
        for name in _FIELDS[cls]:
            value = getattr(obj, name)
            kind = type(value)
            if kind is np.ndarray:
                if value.dtype.hasobject:
                    kinds.append(_OBJECTS)
                    values.append((value.shape, value.ravel().tolist()))
                else:
                    kinds.append(_ARRAY)
                    values.append(_array(value))
            elif kind is StringBlock:
                kinds.append(_STRINGS)
                values.append((_array(value.blob), _array(value.lens)))
            else:
                kinds.append(_PLAIN)
                values.append(value)
        return pickle.dumps((cls.__name__, bytes(kinds), values), protocol=5)
    return pickle.dumps(obj, protocol=5)


def unpack_request(blob: bytes) -> SearchRequest:
    return _unpack(blob, SearchRequest)


def unpack_result(blob: bytes) -> SearchResult:
    return _unpack(blob, SearchResult)


_FIELDS = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in (SearchRequest, SearchResult)
}
_PLAIN, _ARRAY, _OBJECTS, _STRINGS = range(4)
P = TypeVar("P", SearchRequest, SearchResult)


def _array(a: np.ndarray) -> tuple[str, tuple[int, ...], pickle.PickleBuffer]:
    # pickled in-band as one copy of the array's bytes; a writable array's loads as a bytearray
    return (a.dtype.str, a.shape, pickle.PickleBuffer(np.ascontiguousarray(a).data))


def _unarray(packed: tuple[str, tuple[int, ...], bytes | bytearray]) -> np.ndarray:
    dtype, shape, data = packed
    if isinstance(data, bytes):  # a read-only array's: copied, as every array here is writable
        data = bytearray(data)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _unpack(blob: bytes, cls: type[P]) -> P:
    name, kinds, values = pickle.loads(blob)
    if name != cls.__name__:
        raise TypeError(f"expected a packed {cls.__name__}, got {name}")
    args = []
    for kind, value in zip(kinds, values):
        if kind == _PLAIN:
            args.append(value)
        elif kind == _ARRAY:
            args.append(_unarray(value))
        elif kind == _OBJECTS:
            shape, items = value
            args.append(np.fromiter(items, dtype=object, count=len(items)).reshape(shape))
        else:
            args.append(StringBlock(_unarray(value[0]), _unarray(value[1])))
    return cls(*args)


def unpack_fetched(blob: bytes) -> Fetched:
    fetched = pickle.loads(blob)
    assert isinstance(fetched, Fetched)
    return fetched


def frame(*args: Any) -> bytes:
    """A small call's arguments as one bytes argument: Ray passes one argument for less than
    several (a single query's search, with its partition, key and request: 0.82-0.91 ms p50
    against 0.93-0.98 for the three, and less CPU on both sides)."""
    return pickle.dumps(args, protocol=5)


FRAMED_BYTES = 64 << 10  # the largest search request sent in a frame


def unframe(call: bytes) -> tuple[Any, ...]:
    args = pickle.loads(call)
    assert isinstance(args, tuple)
    return args


def packed_for(req: SearchRequest, n_calls: int) -> bytes | ObjectRef[bytes]:
    """``req`` packed once for ``n_calls`` shards (:func:`shared`)."""
    return shared(pack(req), n_calls)


def shared(blob: B, n_calls: int) -> B | ObjectRef[B]:
    """What ``n_calls`` calls will carry: ``blob`` itself, or a reference to one stored copy
    when it is large and sent more than once (Ray resolves it before the method runs)."""
    size = len(blob) if isinstance(blob, bytes) else blob.nbytes
    if n_calls > 1 and size >= SHARED_ARG_BYTES:
        return ray.put(blob)
    return blob


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def row_bytes(batch: UpsertBatch) -> np.ndarray:
    """Each item's share of the batch's serialised size: its vector (and norm), id, metadata
    and contents (in UTF-8), plus what pickling adds per value."""
    n = len(batch.ids)
    per = batch.vectors.shape[1] * batch.vectors.itemsize + (4 if batch.norms is not None else 0)
    size = np.full(n, per + 24, dtype=np.int64)
    size += np.fromiter(map(utf8_len, batch.ids), dtype=np.int64, count=n)
    size += np.fromiter((len(m) if m else 0 for m in batch.metadata), dtype=np.int64, count=n)
    if any(batch.contents):
        size += np.fromiter(
            (utf8_len(c) if c else 0 for c in batch.contents), dtype=np.int64, count=n
        )
    return size


def pieces(batch: UpsertBatch, limit: int = CALL_BYTES) -> tuple[list[UpsertBatch], int]:
    """``batch`` cut into consecutive runs of items of at most ``limit`` bytes together (an
    item larger than that goes alone; the batch itself when it fits), and its size."""
    n = len(batch.ids)
    ends = np.cumsum(row_bytes(batch))
    total = int(ends[-1]) if n else 0
    if n <= 1 or total <= limit:
        return [batch], total
    out, start = [], 0
    while start < n:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + limit, side="right")))
        out.append(batch.rows(start, stop))
        start = stop
    return out, total


def chunks(x: np.ndarray, limit: int = CALL_BYTES) -> Iterator[np.ndarray]:
    """The rows of ``x`` in consecutive runs of at most ``limit`` bytes (at least one row each;
    an empty ``x`` once)."""
    step = max(1, limit // max(1, x[:1].nbytes))
    for start in range(0, max(len(x), 1), step):
        yield x[start : start + step]


class ShardClient:
    """Typed calls to one partition on the pool actor hosting it. Each method returns the
    call's ObjectRef (await it in the gateway, ``ray.get`` it in the control plane) except
    :meth:`search`, :meth:`get` and :meth:`upsert`, which await (and unpack), and
    :meth:`sample`, which streams."""

    def __init__(self, handle: Any, partition: Partition) -> None:
        self.handle = handle
        self.partition = partition
        self._p = partition.encode()  # what each call carries (Partition.encode)

    async def search(self, key: bytes, req: bytes | ObjectRef[bytes]) -> SearchResult:
        """``req`` from :func:`packed_for`: a small one goes in one :func:`frame` with the
        partition and the key, over the actor's same-node socket when it has one
        (actors.pool.channel), else by a Ray call; a large one (framing would copy it twice more) or
        a stored copy (Ray resolves only the call's own arguments) as an argument of its own."""
        if isinstance(req, bytes) and len(req) <= FRAMED_BYTES:
            blob = await self._small(channel.SEARCH, "search_framed", frame(self._p, key, req))
        else:
            blob = await self.handle.search_packed.remote(self._p, key, req)
        return unpack_result(blob)

    async def _small(self, call_no: int, method: str, call: bytes) -> bytes:
        """``method``'s answer to the framed ``call``: over the actor's same-node socket
        (actors.pool.channel) when it takes it, else by a Ray call."""
        blob = await channel.call(self.handle, call_no, call)
        if blob is None:
            blob = await getattr(self.handle, method).remote(call)
        return blob

    async def upsert(self, key: bytes, batch: UpsertBatch) -> ShardStats:
        """The batch in :func:`pieces`, one call each, two under way at a time (the next
        crosses while the shard writes one; more would only hold more of the pool actor's
        threads waiting for the partition's write lock); a batch of more than
        :data:`LARGE_UPSERT_BYTES` on the pool actor's upsert threads (:data:`UPSERT_GROUP`).
        Awaited: the partition's state after the last piece applied. When a piece fails, no
        further piece is sent, the ones under way are waited for, and the failure is raised:
        nothing is written after the caller learns of it. The pieces before may be written; an
        upsert is safe to repeat (the items of one request have distinct ids, so their order
        is free)."""
        parts, size = pieces(batch)
        upsert = self.handle.upsert
        if size > LARGE_UPSERT_BYTES:
            upsert = upsert.options(concurrency_group=UPSERT_GROUP)
        if len(parts) == 1:
            stats: ShardStats = await upsert.remote(self._p, key, batch)
            return stats

        async def send(piece: UpsertBatch) -> ShardStats:
            answer: ShardStats = await upsert.remote(self._p, key, piece)
            return answer

        done: list[ShardStats] = []
        under_way: set[asyncio.Task[ShardStats]] = set()
        try:
            for piece in parts:
                while len(under_way) >= UPSERT_PIECES_IN_FLIGHT:
                    finished, under_way = await asyncio.wait(
                        under_way, return_when=asyncio.FIRST_COMPLETED
                    )
                    done += await asyncio.gather(*finished)  # a failure stops the sending
                under_way.add(asyncio.ensure_future(send(piece)))
            done += await asyncio.gather(*under_way)
        except Exception:
            # sent: let them land before the caller hears of the failure (their own failures,
            # if any, are retrieved here and dropped: the first one is raised)
            await asyncio.gather(*under_way, return_exceptions=True)
            raise
        except BaseException:  # cancelled (the caller's deadline, or it went away)
            for task in under_way:
                task.cancel()
            raise
        return max(done, key=lambda st: (st.version, st.count))

    def delete(self, key: bytes, ids: list[str]) -> ObjectRef[int]:
        return self.handle.delete.remote(self._p, key, ids)

    async def get(
        self, key: bytes, ids: list[str], vectors: bool, metadata: bool, contents: bool
    ) -> Fetched:
        """The stored fields of those of ``ids`` the partition holds (awaited); a few ids
        framed and over the actor's same-node socket when it has one (actors.pool.channel)."""
        if len(ids) <= PACKED_GET_IDS:
            call = frame(self._p, key, ids, vectors, metadata, contents)
            return unpack_fetched(await self._small(channel.GET, "get_packed", call))
        fetched: Fetched = await self.handle.get.remote(
            self._p, key, ids, vectors, metadata, contents
        )
        return fetched

    def list_ids(self, key: bytes) -> ObjectRef[list[str]]:
        return self.handle.list_ids.remote(self._p, key)

    def match_ids(
        self,
        key: bytes,
        node: FilterNode | None,
        limit: int | None,
        order_by: str | None,
        ascending: bool,
    ) -> ObjectRef[list[Any]]:
        return self.handle.match_ids.remote(self._p, key, node, limit, order_by, ascending)

    def stats(self, key: bytes, footprint: bool = False) -> ObjectRef[ShardStats]:
        return self.handle.stats.remote(self._p, key, footprint)

    def sample(self, key: bytes, n: int, seed: int) -> Any:
        """Up to ``n`` live vectors for training, as Ray's generator of references to their
        :func:`chunks` (``ray.get`` each and concatenate)."""
        return self.handle.sample.options(num_returns="streaming").remote(self._p, key, n, seed)

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

    def begin_rotation(self, key: bytes, new_key: bytes, epoch: int) -> ObjectRef[None]:
        """Key rotation (actors.control.rotation): the partition's state sealed under ``new_key`` into
        key epoch ``epoch``, and every later write under both keys."""
        return self.handle.begin_rotation.remote(self._p, key, new_key, epoch)

    def commit_rotation(self, epoch: int) -> ObjectRef[None]:
        return self.handle.commit_rotation.remote(self._p, epoch)

    def abort_rotation(self, epoch: int) -> ObjectRef[None]:
        return self.handle.abort_rotation.remote(self._p, epoch)
