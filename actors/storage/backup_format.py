"""The backup file's framing (serve_app.service.backups writes it, ``vaultvec restore`` reads
it): a magic line, then frames of ``kind (1 byte) | length (8 bytes, big endian) | payload``."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Protocol

MAGIC = b"VAULTVEC-BACKUP\n"
FORMAT, VERSION = "vaultvec-backup", 1
HEADER, CONFIG, TEMPLATE, CHUNK, END, ERROR = b"H", b"C", b"T", b"S", b"E", b"X"
CHUNK_HEAD = struct.Struct(">III")  # shard, chunk number, chunks of the shard's part
_LENGTH = struct.Struct(">Q")
MAX_FRAME = 1 << 30  # no frame is this large: a larger length means a damaged file


class Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


class BadBackup(ValueError):
    """Not a backup, or one cut short or damaged."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + _LENGTH.pack(len(payload)) + payload


def read_frames(f: Readable) -> Iterator[tuple[bytes, bytes]]:
    """(kind, payload) of each frame of the backup ``f`` reads, up to and with its end frame
    (END or ERROR); BadBackup if it is not one or ends early."""
    if f.read(len(MAGIC)) != MAGIC:
        raise BadBackup("not a vaultvec backup (no magic line)")
    while True:
        head = f.read(1 + _LENGTH.size)
        if len(head) < 1 + _LENGTH.size:
            raise BadBackup("the backup ends before its end frame: it was cut short")
        kind, (length,) = head[:1], _LENGTH.unpack(head[1:])
        if kind not in (HEADER, CONFIG, TEMPLATE, CHUNK, END, ERROR) or length > MAX_FRAME:
            raise BadBackup(f"damaged backup: unknown frame {kind!r} of {length} bytes")
        payload = f.read(length)
        if len(payload) < length:
            raise BadBackup("the backup ends inside a frame: it was cut short")
        yield kind, payload
        if kind in (END, ERROR):
            return
