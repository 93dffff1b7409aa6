"""Backup and restore of one shard (serve_app.service.backups): its whole state as a snapshot
frame, sealed in chunks for a backup file, and installed from such chunks into a new index.

Each chunk is sealed with the backed-up index's data key, its associated data binding index
name, shard number, backup id, chunk number and chunk count: chunks open only in their own
backup, at their own place, and a backup cut short or reordered does not open. The frame is
taken under the shard's read lock (writes wait only while it is copied), so a shard's part of
a backup is the state at one instant; sealing and sending it happen after, while writes go on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from actors import constants
from actors.engine import shard_state
from actors.engine.items import ItemTable
from actors.engine.rwlock import RWLock
from actors.engine.shard_log import ShardLog
from actors.errors import DecryptError, InvalidRequest
from actors.process import heap
from actors.storage.crypto import aad, open_sealed, seal
from actors.types import BackupSource


def chunk_aad(name: str, shard: int, backup_id: str, n: int, total: int) -> bytes:
    return aad(name, "backup", shard, part=f"{backup_id}/{n}/{total}")


@dataclass
class _Incoming:
    """The chunks of one backup received so far, opened (a restore in progress)."""

    backup_id: str
    parts: list[bytes] = field(default_factory=list)


class ShardBackup:
    name: str
    shard_no: int
    items: ItemTable
    version: int
    log: ShardLog
    _lock: RWLock
    _snapshot_lock: threading.Lock
    _incoming: _Incoming | None = None

    def _reading(self, key: bytes) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _ensure_loaded(self, key: bytes) -> None:
        raise NotImplementedError

    def _capture(self) -> bytes:
        raise NotImplementedError

    def _install(self, state: shard_state.State) -> None:
        raise NotImplementedError

    def backup(self, key: bytes, backup_id: str) -> Iterator[tuple[int, int, bytes]]:
        """This shard's state now, as sealed chunks of at most BACKUP_CHUNK_BYTES: (chunks in
        all, the state's training version, sealed chunk) each."""
        with self._reading(key):
            frame = memoryview(self._capture())
            version = self.version
        size = constants.BACKUP_CHUNK_BYTES
        total = max(1, -(-len(frame) // size))
        for n in range(total):
            part = frame[n * size : (n + 1) * size]
            associated = chunk_aad(self.name, self.shard_no, backup_id, n, total)
            yield total, version, seal(key, part, associated)

    def restore_chunk(
        self, key: bytes, source: BackupSource, n: int, total: int, chunk: bytes
    ) -> int | None:
        """Chunk ``n`` of ``total`` of this shard's part of a backup, in order; after the
        last, the state they hold replaces this shard's (which must be empty) and is stored
        as its snapshot, sealed under ``key``. Returns the items installed after the last
        chunk, None before it."""
        associated = chunk_aad(source.index_name, self.shard_no, source.backup_id, n, total)
        try:
            part = open_sealed(source.data_key, chunk, associated)
        except DecryptError:
            raise InvalidRequest(
                f"backup chunk {n} of shard {self.shard_no} does not open: not from this backup "
                "or this place in it, or altered"
            ) from None
        with self._snapshot_lock:
            incoming = self._incoming
            if n == 0:
                incoming = self._incoming = _Incoming(source.backup_id)
            if incoming is None or incoming.backup_id != source.backup_id:
                raise InvalidRequest(f"backup chunk {n} of shard {self.shard_no} before chunk 0")
            if n != len(incoming.parts):
                raise InvalidRequest(
                    f"backup chunk {n} of shard {self.shard_no} arrived after "
                    f"{len(incoming.parts)} chunks: send them in order, from chunk 0"
                )
            incoming.parts.append(part)
            if n + 1 < total:
                return None
            self._incoming = None
            frame = b"".join(incoming.parts)
            del incoming, part
            state = shard_state.restore(frame)
            with self._lock.write():
                self._ensure_loaded(key)
                if len(self.items):
                    raise InvalidRequest(
                        f"shard {self.shard_no} holds items: restore only into a new index"
                    )
                self._install(state)
                gen = self.log.roll()
                count = len(self.items)
            self.log.write_snapshot(key, frame, gen)
        del frame, state
        heap.trim()
        return count
