"""What crosses between a gateway (or the control plane) and a pool actor: the codec and the
framing both transports share (a Ray call, or the same-node Unix socket: actors.pool.channel),
and the cutting of bulk data into pieces each call carries.

- **Frames.** A small call goes as one bytes argument, :func:`frame` of (method, partition, key,
  *arguments): Ray passes one argument for less than several, and the socket carries bytes
  only. The pool actor answers a frame with :func:`answer` (:data:`FRAMED_CALLS` says how each
  framed method's request and answer are encoded), over either transport. A large search
  request goes beside its frame (``payload``), possibly as one stored copy shared by every shard
  (:func:`shared`).
- **Packing.** A search request and its result, and the answer to a get of a few ids, travel
  pickled to bytes (:func:`pack`): Ray's serializer costs more for small numpy-carrying
  dataclasses than the pickling does (docs/performance.md, Measurements behind design choices),
  and a fan-out then sends the same bytes to every shard.
- **Pieces.** Bulk data (an upsert's items, a training sample) crosses in pieces of at most
  :data:`actors.constants.CALL_BYTES` (under the in-call limit vaultvec runs Ray with,
  cluster.constants.RAY_DIRECT_CALL_BYTES, with room for the call's framing), each inside its
  call, never through Ray's object store, whose freed pages stay allocated
  (docs/performance.md, Footprint).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import ray
from ray import ObjectRef

from actors import constants
from actors.engine.strings import StringBlock
from actors.types import Fetched, Probing, SearchRequest, SearchResult, UpsertBatch

B = TypeVar("B", bytes, np.ndarray)

# The pool actors' concurrency group for upserts of more than LARGE_UPSERT_BYTES
# (actors.constants.UPSERT_THREADS); smaller ones run on the actor's other call threads.
UPSERT_GROUP = "upserts"


def pack(obj: SearchRequest | SearchResult | Fetched) -> bytes:
    """``obj`` pickled. A search request or result goes as its fields, each array as its
    dtype, shape and bytes: pickling the dataclasses' numpy arrays costs several times more
    (figures: docs/performance.md)."""
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
            elif kind is Probing:  # its fields, not the dataclass (a class path to pickle)
                kinds.append(_PROBING)
                values.append(dataclasses.astuple(value))
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
_PLAIN, _ARRAY, _OBJECTS, _STRINGS, _PROBING = range(5)
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
        elif kind == _STRINGS:
            args.append(StringBlock(_unarray(value[0]), _unarray(value[1])))
        else:
            args.append(Probing(*value))
    return cls(*args)


def unpack_fetched(blob: bytes) -> Fetched:
    fetched = pickle.loads(blob)
    assert isinstance(fetched, Fetched)
    return fetched


def frame(*args: Any) -> bytes:
    """A small call's arguments as one bytes argument: Ray passes one argument for less time
    and CPU on both sides than several (figures: docs/performance.md)."""
    return pickle.dumps(args, protocol=5)


def unframe(call: bytes) -> tuple[Any, ...]:
    args = pickle.loads(call)
    assert isinstance(args, tuple)
    return args


def shared(blob: B, n_calls: int) -> B | ObjectRef[B]:
    """What ``n_calls`` calls will carry: ``blob`` itself, or a reference to one stored copy
    when it is large (actors.constants.SHARED_ARG_BYTES) and sent more than once (Ray resolves
    it before the method runs): past that size, a copy per call costs more than one stored copy
    (figures: docs/performance.md)."""
    size = len(blob) if isinstance(blob, bytes) else blob.nbytes
    if n_calls > 1 and size >= constants.SHARED_ARG_BYTES:
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


def pieces(batch: UpsertBatch, limit: int = constants.CALL_BYTES) -> tuple[list[UpsertBatch], int]:
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


def chunks(x: np.ndarray, limit: int = constants.CALL_BYTES) -> Iterator[np.ndarray]:
    """The rows of ``x`` in consecutive runs of at most ``limit`` bytes (at least one row each;
    an empty ``x`` once)."""
    step = max(1, limit // max(1, x[:1].nbytes))
    for start in range(0, max(len(x), 1), step):
        yield x[start : start + step]


# -- framed calls ------------------------------------------------------------------------------
def search_frame(partition: str, key: bytes, req: bytes | None) -> bytes:
    """A search's frame; ``req`` (packed) inside it, or None when it goes as the payload."""
    return frame("search", partition, key, req)


def get_frame(
    partition: str, key: bytes, ids: list[str], vectors: bool, metadata: bool, contents: bool
) -> bytes:
    return frame("get", partition, key, ids, vectors, metadata, contents)


# framed method -> (its arguments from the frame's rest and the payload, its answer as bytes)
FRAMED_CALLS: dict[
    str, tuple[Callable[[list[Any], Any], tuple[Any, ...]], Callable[[Any], bytes]]
] = {
    "search": (
        lambda rest, payload: (unpack_request(rest[0] if payload is None else payload),),
        pack,
    ),
    "get": (lambda rest, payload: tuple(rest), pack),
}


def answer(target: Any, call: bytes, payload: bytes | None = None) -> bytes:
    """``target``'s answer to a framed call (the pool actor's, over Ray or its socket): the
    method the frame names, called with the partition, the key and the decoded arguments."""
    method, partition, key, *rest = unframe(call)
    decode, encode = FRAMED_CALLS[method]
    return encode(getattr(target, method)(partition, key, *decode(rest, payload)))
