"""Backup and restore of one shard (serve_app.service.backups): its whole state as a snapshot
frame, sealed in chunks for a backup file, and installed from such chunks into a new index.

Each chunk is sealed with the backed-up index's data key, its associated data binding index
name, shard number, backup id, chunk number and chunk count: chunks open only in their own
backup, at their own place, and a backup cut short or reordered does not open. The frame is
taken under the shard's read lock (writes wait only while it is copied), so a shard's part of
a backup is the state at one instant; sealing and sending it happen after, while writes go on.
A restore keeps the chunks it receives as they came, sealed, on local disk until the last one
is in, then reads the state from them a chunk at a time: a part is never held whole in memory.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

import numpy as np

from actors import constants
from actors.engine import shard_state
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex
from actors.engine.rwlock import RWLock
from actors.engine.shard_log import ShardLog
from actors.errors import DecryptError, InvalidRequest
from actors.process import heap
from actors.storage import codec
from actors.storage.crypto import aad, open_sealed, seal
from actors.types import BackupSource


def chunk_aad(name: str, shard: int, backup_id: str, n: int, total: int) -> bytes:
    return aad(name, "backup", shard, part=f"{backup_id}/{n}/{total}")


@dataclass
class _Incoming:
    """The chunks of one backup received so far (a restore in progress): each opened once as
    it arrives, to check it, and kept as it came, sealed, in a file without a name in the
    shard's vector directory, so a part larger than memory (a compressed index's full
    vectors) is never held whole."""

    backup_id: str
    spool: IO[bytes]
    places: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) each
    at: float = field(default_factory=time.monotonic)  # when the last chunk arrived

    def add(self, sealed: bytes) -> None:
        offset = self.places[-1][0] + self.places[-1][1] if self.places else 0
        self.spool.seek(offset)
        self.spool.write(sealed)
        self.spool.flush()
        self.places.append((offset, len(sealed)))

    def opened(self, key: bytes, name: str, shard: int) -> Iterator[bytes]:
        """Every chunk again, opened in order as it is read (one at a time in memory)."""
        total = len(self.places)
        for n, (offset, length) in enumerate(self.places):
            sealed = os.pread(self.spool.fileno(), length, offset)
            yield open_sealed(key, sealed, chunk_aad(name, shard, self.backup_id, n, total))

    def close(self) -> None:
        self.spool.close()


class ShardBackup:
    name: str
    shard_no: int
    items: ItemTable
    version: int
    log: ShardLog
    _lock: RWLock
    _snapshot_lock: threading.Lock
    partition: PartitionIndex | None
    vector_dir: str
    _incoming: _Incoming | None = None
    restored: tuple[str, int] | None = None  # (backup id, items) once a backup's part is in
    _loaded: bool

    def _reset(self) -> None:
        raise NotImplementedError

    def _reading(self, key: bytes) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _ensure_loaded(self, key: bytes) -> None:
        raise NotImplementedError

    def _capture(self) -> codec.Frame:
        raise NotImplementedError

    def _install(self, state: shard_state.State) -> None:
        raise NotImplementedError

    def backup(self, key: bytes, backup_id: str) -> Iterator[tuple[int, int, bytes]]:
        """This shard's state now, as sealed chunks of at most BACKUP_CHUNK_BYTES: (chunks in
        all, the state's training version, sealed chunk) each."""
        with self._reading(key):
            frame = self._capture()
            # -1: empty and never trained here (it takes the index's lists with its first item)
            version = self.version if len(self.items) or self.partition is not None else -1
        size = constants.BACKUP_CHUNK_BYTES
        total = max(1, -(-frame.nbytes // size))
        for n, part in enumerate(frame.chunks(size)):
            associated = chunk_aad(self.name, self.shard_no, backup_id, n, total)
            yield total, version, seal(key, part, associated)

    def restore_chunk(
        self, key: bytes, source: BackupSource, n: int, total: int, chunk: bytes
    ) -> int | None:
        """Chunk ``n`` of ``total`` of this shard's part of a backup, in order; after the
        last, the state they hold replaces this shard's (which must be empty) and is stored
        as its snapshot, sealed under ``key``. Returns the items installed after the last
        chunk, None before it."""
        if self.restored is not None and self.restored[0] == source.backup_id and n + 1 == total:
            return self.restored[1]  # the last chunk again (its answer was lost): done already
        associated = chunk_aad(source.index_name, self.shard_no, source.backup_id, n, total)
        try:
            part = open_sealed(source.data_key, chunk, associated)
        except DecryptError:
            raise InvalidRequest(
                f"backup chunk {n} of shard {self.shard_no} does not open: not from this backup "
                "or this place in it, or altered"
            ) from None
        del part  # checked; what is kept is the sealed chunk
        with self._snapshot_lock:
            incoming = self._incoming
            if n == 0:
                self._incoming = None
                if incoming is not None:
                    incoming.close()
                spool = tempfile.TemporaryFile(dir=self.vector_dir or None)  # noqa: SIM115
                incoming = self._incoming = _Incoming(source.backup_id, spool)
            if incoming is None or incoming.backup_id != source.backup_id:
                raise InvalidRequest(f"backup chunk {n} of shard {self.shard_no} before chunk 0")
            if n != len(incoming.places):
                raise InvalidRequest(
                    f"backup chunk {n} of shard {self.shard_no} arrived after "
                    f"{len(incoming.places)} chunks: send them in order, from chunk 0"
                )
            incoming.add(chunk)
            incoming.at = time.monotonic()
            if n + 1 < total:
                return None
            self._incoming = None
            try:
                chunks = incoming.opened(source.data_key, source.index_name, self.shard_no)
                check = partial(check_frame, shard_no=self.shard_no)
                try:
                    state = shard_state.restore(chunks, self.vector_dir, check)
                except (ValueError, KeyError) as exc:
                    raise InvalidRequest(
                        f"shard {self.shard_no}'s part of the backup is not a shard's state"
                    ) from exc
            finally:
                incoming.close()
            with self._lock.write():
                self._ensure_loaded(key)
                if len(self.items):
                    raise InvalidRequest(
                        f"shard {self.shard_no} holds items: restore only into a new index"
                    )
                self._install(state)
                gen = self.log.roll()
                count = len(self.items)
                try:
                    self.log.write_snapshot(key, self._capture(), gen)
                except BaseException:  # not stored: not installed either (send it again)
                    self._loaded = False
                    self._reset()
                    raise
            self.restored = (source.backup_id, count)
        del state
        heap.trim()
        return count

    def drop_abandoned(self, idle_s: float) -> None:
        """Forget a restore's chunks received so far if none came for ``idle_s`` seconds (the
        pool's housekeeping; skipped while a chunk is being taken in)."""
        incoming = self._incoming
        if incoming is None or time.monotonic() - incoming.at < idle_s:
            return
        if self._snapshot_lock.acquire(blocking=False):
            try:
                if self._incoming is incoming:
                    self._incoming = None
                    incoming.close()
            finally:
                self._snapshot_lock.release()


def check_frame(meta: dict[str, Any], arrays: dict[str, np.ndarray], shard_no: int) -> None:
    """Bounds of a restored state, checked before anything is allocated from it: the per-item
    arrays agree, labels lie below ``next_label``, and ``next_label`` is not far past the items
    (what the arrays a shard allocates per label are sized by)."""
    labels = arrays.get("labels")
    n = 0 if labels is None else len(labels)
    per_item = ("ids_len", "meta_len", "contents_len", "norms")
    next_label = meta.get("next_label")
    ok = (
        labels is not None
        and isinstance(next_label, int)
        and 0 <= next_label <= 4 * n + constants.RESTORE_SPARE_LABELS
        and all(k in arrays and len(arrays[k]) == n for k in per_item)
        and (n == 0 or (int(labels.min()) >= 0 and int(labels.max()) < next_label))
        and (n == 0 or "index" in arrays)
    )
    if not ok:
        raise InvalidRequest(f"shard {shard_no}'s part of the backup is not a shard's state")
