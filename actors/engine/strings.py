"""Blocks of strings as one UTF-8 byte buffer plus a lengths array: what search results carry.

A query batch's top-k ids are tens of thousands of short strings. As Python objects each costs
a pickle record on the shard, an object on the gateway, a reference count in every gather;
as a :class:`StringBlock` the whole block pickles as two arrays and every step (gather, merge,
row patch, the JSON array of the binary route) is a numpy gather over the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from actors import constants
from actors.storage.codec import pack_strings, unpack_strings

EMPTY_BLOB = np.empty(0, dtype=np.uint8)


def gather_bytes(blob: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The byte runs ``blob[starts[i] : starts[i] + lens[i]]`` (lens < 0 = none), concatenated
    in row-major order of ``lens``: one vectorised gather, no per-string work."""
    n = np.maximum(lens.ravel(), 0).astype(np.int64)
    ends = np.cumsum(n)
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        return EMPTY_BLOB
    idx = np.repeat(starts.ravel().astype(np.int64) - (ends - n), n)
    idx += np.arange(total, dtype=np.int64)
    return blob[idx]


def owned(gathered: np.ndarray) -> np.ndarray:
    """A result of :func:`gather_bytes` that a column may keep and grow: a gather is a fresh
    array already, only the empty one is the shared :data:`EMPTY_BLOB`."""
    return gathered if len(gathered) else np.empty(0, dtype=np.uint8)


def _starts(lens: np.ndarray) -> np.ndarray:
    """Offsets of each string of a compact block (row-major), shaped like ``lens``."""
    n = np.maximum(lens, 0).astype(np.int64)
    return (np.cumsum(n.ravel()) - n.ravel()).reshape(lens.shape)


# Bytes that a JSON string cannot hold unescaped: control characters, '"' and '\'.
_NEEDS_ESCAPE = np.zeros(256, dtype=bool)
_NEEDS_ESCAPE[:0x20] = True
_NEEDS_ESCAPE[[ord('"'), ord("\\")]] = True


@dataclass(frozen=True, eq=False)
class StringBlock:
    """An array (any shape) of ``str | None``: UTF-8 bytes back to back in row-major order and
    each entry's byte length, -1 for None."""

    blob: np.ndarray  # uint8
    lens: np.ndarray  # int32, the block's shape

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> StringBlock:
        return cls(EMPTY_BLOB, np.full(shape, -1, dtype=np.int32))

    @classmethod
    def from_list(
        cls, values: Sequence[str | None], shape: tuple[int, ...] | None = None
    ) -> StringBlock:
        blob, lens = pack_strings(values)
        shape = shape if shape is not None else (len(values),)
        return cls(blob, lens.astype(np.int32).reshape(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.lens.shape)

    def starts(self) -> np.ndarray:
        return _starts(self.lens)

    def take_rows(self, rows: np.ndarray) -> StringBlock:
        """Rows ``rows`` of a 2-D block."""
        lens = self.lens[rows]
        return StringBlock(gather_bytes(self.blob, self.starts()[rows], lens), lens)

    def select(self, mask: np.ndarray) -> StringBlock:
        """The entries where ``mask`` (the block's shape) is true, flattened in row-major order."""
        lens = self.lens[mask]
        return StringBlock(gather_bytes(self.blob, self.starts()[mask], lens), lens)

    def flat(self) -> list[str | None]:
        """The entries in row-major order as ``str | None``."""
        return unpack_strings(self.blob, self.lens.ravel())

    def tolist(self) -> Any:
        """Nested lists of ``str | None`` shaped like the block, as ``ndarray.tolist``."""
        arr = np.empty(self.lens.size, dtype=object)
        arr[:] = self.flat()
        return arr.reshape(self.shape).tolist()

    def json_safe(self) -> bool:
        """No entry is None and none holds a character that a JSON string escapes: each
        entry's JSON is its bytes between quotes."""
        return not (self.lens < 0).any() and not _NEEDS_ESCAPE[self.blob].any()

    def json_array(self) -> bytes:
        """The entries (flattened; none may be None) as the bytes of a JSON array of strings.

        Without characters that JSON escapes, the array is laid out by a numpy scatter of the
        blob between quotes and commas; otherwise orjson encodes the decoded strings."""
        lens = self.lens.ravel().astype(np.int64)
        if (lens < 0).any():
            raise ValueError("json_array: the block holds None entries")
        if len(lens) == 0:
            return b"[]"
        if _NEEDS_ESCAPE[self.blob].any():
            return orjson.dumps(self.flat())
        # '[' then for each string: '"' bytes '"' and ',' (the last ',' becomes ']').
        out = np.full(int(lens.sum()) + 3 * len(lens) + 1, ord(","), dtype=np.uint8)
        out[0] = ord("[")
        out[-1] = ord("]")
        quote = 1 + np.cumsum(lens + 3) - (lens + 3)  # opening quote of each string
        out[quote] = ord('"')
        out[quote + 1 + lens] = ord('"')
        ends = np.cumsum(lens)
        idx = np.repeat(quote + 1 - (ends - lens), lens) + np.arange(int(ends[-1]))
        out[idx] = self.blob
        return out.tobytes()


def concat_columns(blocks: Sequence[StringBlock]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """2-D blocks with the same rows side by side: (blob, starts, lens) over one shared blob,
    for :func:`take_along_columns`."""
    base = 0
    starts = []
    for b in blocks:
        starts.append(b.starts() + base)
        base += len(b.blob)
    blob = np.concatenate([b.blob for b in blocks]) if len(blocks) > 1 else blocks[0].blob
    return blob, np.concatenate(starts, axis=1), np.concatenate([b.lens for b in blocks], axis=1)


def take_along_columns(
    columns: tuple[np.ndarray, np.ndarray, np.ndarray], col: np.ndarray
) -> StringBlock:
    """``np.take_along_axis(block, col, axis=1)`` for the output of :func:`concat_columns`."""
    blob, starts, lens = columns
    lens = np.take_along_axis(lens, col, axis=1)
    starts = np.take_along_axis(starts, col, axis=1)
    return StringBlock(gather_bytes(blob, starts, lens), lens)


def replace_rows(block: StringBlock, rows: np.ndarray, other: StringBlock) -> StringBlock:
    """``block`` with its rows ``rows`` replaced by the rows of ``other``, in that order."""
    starts, lens = block.starts(), block.lens.copy()
    starts[rows] = other.starts() + len(block.blob)
    lens[rows] = other.lens
    return StringBlock(gather_bytes(np.concatenate([block.blob, other.blob]), starts, lens), lens)


class StringColumn:
    """An append-only column of strings by integer label: the shard's item ids.

    Entries live back to back in one growing byte buffer; a label's bytes are never moved
    until :meth:`compact`, which keeps only the labels still in use.
    """

    COMPACT_SLACK = constants.STRINGS_COMPACT_SLACK  # dead bytes tolerated beyond the live ones

    def __init__(self) -> None:
        self.blob = np.empty(0, dtype=np.uint8)
        self.used = 0  # bytes of blob in use
        self.live = 0  # bytes of labels not cleared
        self.start = np.empty(0, dtype=np.int64)
        self.lens = np.empty(0, dtype=np.int32)

    def nbytes(self) -> int:
        return self.blob.nbytes + self.start.nbytes + self.lens.nbytes

    def set(
        self,
        labels: np.ndarray,
        values: Iterable[str],
        packed: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Store ``values`` under ``labels`` (new labels, or labels being overwritten);
        ``packed``: the same values already packed (codec.pack_strings), as a snapshot holds them."""
        data, lens = packed if packed is not None else pack_strings(list(values))
        size = int(labels.max()) + 1 if len(labels) else 0
        if size > len(self.start):
            grow = max(size, 2 * len(self.start), 1024)
            self.start = np.concatenate([self.start, np.zeros(grow - len(self.start), np.int64)])
            self.lens = np.concatenate([self.lens, np.full(grow - len(self.lens), -1, np.int32)])
        self.live -= int(np.maximum(self.lens[labels], 0).sum())  # labels written anew
        end = self.used + len(data)
        if end > len(self.blob):
            new = np.empty(max(end, 2 * len(self.blob), 1 << 16), dtype=np.uint8)
            new[: self.used] = self.blob[: self.used]
            self.blob = new
        self.blob[self.used : end] = data
        sizes = np.maximum(lens, 0)  # (None: -1, no bytes)
        self.start[labels] = self.used + np.cumsum(sizes) - sizes
        self.lens[labels] = lens
        self.used = end
        self.live += len(data)

    def clear(self, labels: np.ndarray) -> None:
        labels = np.unique(labels)
        self.live -= int(np.maximum(self.lens[labels], 0).sum())
        self.lens[labels] = -1

    def get(self, labels: np.ndarray) -> StringBlock:
        """The strings of ``labels`` (any shape); label -1 or a cleared label gives None."""
        if len(self.lens) == 0:
            return StringBlock.empty(labels.shape)
        if labels.size <= constants.STRINGS_SMALL_GET:
            return self._get_few(labels)
        ok = labels >= 0
        safe = np.where(ok, labels, 0)
        lens = np.where(ok, self.lens[safe], -1).astype(np.int32, copy=False)
        return StringBlock(gather_bytes(self.blob, self.start[safe], lens), lens)

    def _get_few(self, labels: np.ndarray) -> StringBlock:
        """:meth:`get` of a few labels (a single query's results), in plain Python: a handful
        of numpy calls on ten labels cost more than slicing each string out."""
        flat = labels.ravel()
        safe = np.maximum(flat, 0)
        data = memoryview(self.blob.data)
        parts: list[memoryview] = []
        out: list[int] = []
        for label, n, at in zip(flat.tolist(), self.lens[safe].tolist(), self.start[safe].tolist()):
            if label < 0:
                n = -1
            out.append(n)
            if n > 0:
                parts.append(data[at : at + n])
        lens = np.array(out, dtype=np.int32).reshape(labels.shape)
        if not parts:
            return StringBlock(EMPTY_BLOB, lens)
        return StringBlock(np.frombuffer(bytearray().join(parts), dtype=np.uint8), lens)

    def relabelled(self, labels: np.ndarray) -> StringColumn:
        """A column holding the strings of ``labels`` under labels 0..len(labels)-1, its
        arrays exactly that long."""
        block = self.get(np.asarray(labels, dtype=np.int64))
        out = StringColumn()
        out.blob = owned(block.blob)
        out.used = out.live = len(out.blob)
        out.start = block.starts()
        out.lens = block.lens
        return out

    def compact(self) -> None:
        """Drop the bytes of cleared and overwritten labels (when they are most of the blob)."""
        if self.used <= 2 * self.live + self.COMPACT_SLACK:
            return
        labels = np.flatnonzero(self.lens >= 0)
        block = self.get(labels)
        self.blob = owned(block.blob)
        self.used = len(self.blob)
        self.start[labels] = block.starts()
