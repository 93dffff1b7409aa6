"""Binary framing for everything the engine persists (before encryption).

A frame is ``u32 header length | orjson header | raw array bytes``. The header carries a small
JSON ``meta`` dict plus the name, dtype and shape of each array. Strings travel as one UTF-8
blob plus int64 lengths (-1 = None), so no pickle is ever involved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

Buffer = bytes | bytearray | memoryview


class Stream:
    """A piece of a frame whose bytes are made only as the frame is read (``pieces()``, which
    must give exactly ``nbytes``): a section too large to hold in memory, such as a partition's
    full vectors read back from their file (actors.engine.fullvectors)."""

    def __init__(self, nbytes: int, pieces: Callable[[], Iterable[Buffer]]) -> None:
        self.nbytes = nbytes
        self.pieces = pieces

    def __len__(self) -> int:
        return self.nbytes

    def views(self) -> Iterator[memoryview]:
        made = 0
        for piece in self.pieces():
            view = memoryview(piece).cast("B")
            made += len(view)
            yield view
        if made != self.nbytes:
            raise ValueError(f"a streamed piece gave {made} bytes, not {self.nbytes}")


class Frame:
    """A frame as the pieces it is made of, never joined into one buffer: a snapshot of a
    shard holding gigabytes is sealed and written chunk by chunk from it (the pieces reference
    the arrays they were packed from, which must not change while the frame is in use; a
    :class:`Stream` is read when the frame is)."""

    def __init__(self, pieces: Sequence[Buffer | Stream]) -> None:
        self.pieces = [p if isinstance(p, Stream) else memoryview(p).cast("B") for p in pieces]
        self.nbytes = sum(len(p) for p in self.pieces)

    def _views(self) -> Iterator[memoryview]:
        for piece in self.pieces:
            if isinstance(piece, Stream):
                yield from piece.views()
            else:
                yield piece

    def chunk_pieces(self, size: int) -> Iterator[list[memoryview]]:
        """The frame in consecutive chunks of ``size`` bytes (the last: the rest; at least
        one chunk), each as the views of the pieces it spans: nothing is copied."""
        if size <= 0:
            raise ValueError("chunk size must be positive")
        chunk: list[memoryview] = []
        room = size
        for view in self._views():
            while len(view):
                take = view[:room]
                chunk.append(take)
                view, room = view[len(take) :], room - len(take)
                if not room:
                    yield chunk
                    chunk, room = [], size
        if chunk or not self.nbytes:
            yield chunk

    def chunks(self, size: int) -> Iterator[Buffer]:
        """The frame in consecutive contiguous chunks of ``size`` bytes: a view where a chunk
        lies in one piece, else the pieces it spans joined."""
        for parts in self.chunk_pieces(size):
            yield parts[0] if len(parts) == 1 else b"".join(parts)

    def tobytes(self) -> bytes:
        return b"".join(self._views())


class Reader:
    """Reads a frame in order from consecutive chunks of it, pulled one at a time (a chunk is
    released once read past, unless an array read from it still refers to it)."""

    def __init__(self, chunks: Iterable[Buffer]) -> None:
        self._chunks = iter(chunks)
        self._view = memoryview(b"")

    def read(self, n: int) -> Buffer:
        """The next ``n`` bytes (fewer at the end): a view when they lie in one chunk."""
        if len(self._view) >= n:
            out, self._view = self._view[:n], self._view[n:]
            return out
        parts, have = [self._view], len(self._view)
        while have < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            view = memoryview(chunk).cast("B")
            parts.append(view[: n - have])
            have += len(parts[-1])
            self._view = view[len(parts[-1]) :]
        if have < n:  # the end: what was left is read
            self._view = memoryview(b"")
        if len(parts) == 2 and not len(parts[0]):
            return parts[1]  # (began at a chunk's start: no copy)
        return b"".join(parts)

    def at_end(self) -> bool:
        while not len(self._view):
            chunk = next(self._chunks, None)
            if chunk is None:
                return True
            self._view = memoryview(chunk).cast("B")
        return False


def pack_frame(meta: dict[str, Any], arrays: Mapping[str, np.ndarray | Frame]) -> Frame:
    """``meta`` and ``arrays`` as a :class:`Frame` (a Frame value: raw bytes, as uint8)."""
    specs: list[list[Any]] = []
    bodies: list[Buffer | Stream] = []
    for name, arr in arrays.items():
        if isinstance(arr, Frame):
            specs.append([name, "|u1", [arr.nbytes]])
            bodies.extend(arr.pieces)
            continue
        a = np.ascontiguousarray(arr)
        if a.dtype == object:
            raise TypeError(f"array {name!r} has dtype object; encode strings with pack_strings")
        specs.append([name, a.dtype.str, list(a.shape)])
        bodies.append(a.reshape(-1).view(np.uint8).data)
    header = orjson.dumps({"meta": meta, "arrays": specs})
    return Frame([len(header).to_bytes(4, "little"), header, *bodies])


def pack(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    return pack_frame(meta, arrays).tobytes()


def unpack(buf: bytes | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    return unpack_stream(Reader([buf]))


def unpack_stream(
    reader: Reader,
    read_as: Mapping[str, Callable[[Reader, int], Any]] | None = None,
    copy: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A frame read from ``reader``: its meta and arrays. ``read_as[name](reader, nbytes)``
    reads that array itself (instead of it being gathered into one buffer) and gives its
    value; it must read exactly ``nbytes``. ``copy``: the arrays are copies, not views of the
    chunks (which are then released as they are read past)."""
    read_as = read_as or {}
    head = bytes(reader.read(4))  # (bytes: no view left holding the first chunk)
    if len(head) < 4:
        raise ValueError("frame length does not match its header")
    header = orjson.loads(reader.read(int.from_bytes(head, "little")))
    arrays: dict[str, Any] = {}
    for name, dtype_str, shape in header["arrays"]:
        dtype = np.dtype(dtype_str)
        count = int(np.prod(shape)) if shape else 1
        nbytes = count * dtype.itemsize
        if name in read_as:
            arrays[name] = read_as[name](reader, nbytes)
            continue
        body = reader.read(nbytes)
        if len(body) != nbytes:
            raise ValueError("frame length does not match its header")
        arrays[name] = np.frombuffer(body, dtype=dtype).reshape(shape)
        if copy and isinstance(body, memoryview):
            arrays[name] = arrays[name].copy()
        del body  # (no view of a chunk kept while the next array is read)
    if not reader.at_end():
        raise ValueError("frame length does not match its header")
    return header["meta"], arrays


def pack_strings(items: Sequence[str | bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Encode strings/bytes/None as (uint8 blob, int64 lengths with -1 for None)."""
    if isinstance(items, (list, tuple)) and items.count(None) == len(items):
        # items stored without any (metadata, contents): no per-item work
        return np.empty(0, dtype=np.uint8), np.full(len(items), -1, dtype=np.int64)
    encoded = [s.encode() if isinstance(s, str) else s for s in items]
    lengths = np.array([-1 if b is None else len(b) for b in encoded], dtype=np.int64)
    blob = b"".join(filter(None, encoded))  # None and empty entries add no bytes
    return np.frombuffer(blob, dtype=np.uint8), lengths


def unpack_strings(blob: np.ndarray, lengths: np.ndarray, *, as_bytes: bool = False) -> list[Any]:
    if not len(blob) and (lengths < 0).all():  # stored without any: no per-item work
        return [None] * len(lengths)
    raw = blob.tobytes()
    sizes = np.maximum(lengths, 0)
    ends = np.cumsum(sizes)
    spans = zip(lengths.tolist(), (ends - sizes).tolist(), ends.tolist())
    if as_bytes:
        return [None if n < 0 else raw[a:b] for n, a, b in spans]
    if raw.isascii():  # byte offsets are character offsets: decoded once
        text = raw.decode("ascii")
        return [None if n < 0 else text[a:b] for n, a, b in spans]
    return [None if n < 0 else raw[a:b].decode() for n, a, b in spans]
