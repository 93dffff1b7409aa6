"""Where one shard's state lies in the store (actors.storage.persistence): its latest snapshot
generation, the write-ahead log since, sealed under every key the shard writes with
(actors.engine.shard_keys), and when the log is due to roll into a new snapshot."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from actors import constants
from actors.engine.shard_keys import ShardKeys
from actors.storage import Store, persistence
from actors.storage.codec import Frame


class ShardLog:
    def __init__(
        self,
        store: Store,
        name: str,
        index_id: str,
        shard_no: int,
        keys: ShardKeys,
        max_records: int,
        max_bytes: int,
        chunk_bytes: int = constants.SNAPSHOT_CHUNK_BYTES,
    ) -> None:
        self.store, self.name, self.index_id, self.shard_no = store, name, index_id, shard_no
        self.keys = keys
        self.max_records, self.max_bytes = max_records, max_bytes
        self.chunk_bytes = chunk_bytes  # a snapshot larger than this is stored in chunks
        self.gen = 0  # the snapshot generation; WAL records go to the log of this generation
        # The newest snapshot generation the state holds everything of: the one it was loaded
        # from, or one it wrote since (0: none).
        self.snapshot_gen = 0
        self.seq = 0  # the last record's number
        self.records = 0  # records written since the last snapshot
        self.bytes = 0
        self.snapshot_bytes = 0  # the latest snapshot's frame, written or loaded

    def snapshot(self, key: bytes) -> Iterator[bytes] | None:
        """The latest snapshot's frame, chunk by chunk as they are read (None: there is none
        yet); its generation becomes the current one."""
        ix, no, epoch = self.index_id, self.shard_no, self.keys.epoch
        found = persistence.load_snapshot(self.store, key, self.name, ix, no, epoch)
        if found is None:
            return None
        self.gen, frame = found
        self.snapshot_gen = self.gen
        self.snapshot_bytes = 0
        return self._counted(frame)

    def _counted(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.snapshot_bytes += len(chunk)
            yield chunk

    def replay(self, key: bytes, apply: Callable[[str, Any], None]) -> None:
        """``apply(op, payload)`` for every record after :attr:`seq`, in order."""
        ix, no, epoch = self.index_id, self.shard_no, self.keys.epoch
        for gen in persistence.generations(self.store, ix, no, "wal", epoch):
            if gen < self.gen:
                continue
            records = persistence.records(self.store, key, self.name, ix, no, epoch, gen, self.seq)
            for seq, op, payload, size in records:
                if seq <= self.seq:
                    continue
                apply(op, payload)
                self.seq = seq
                self.records += 1
                self.bytes += size
            self.gen = max(self.gen, gen)

    def append(self, key: bytes, frame: bytes) -> None:
        """Seal and durably append one record; while the key rotates, under the next key first,
        then under the current one (actors.control.rotation)."""
        # The number is used up even if the append fails: a failure can be ambiguous (committed
        # but not confirmed), and a later record reusing the number would be skipped on replay.
        self.seq = seq = self.seq + 1
        for sealing, epoch in self.keys.sealing(key):
            record = persistence.seal_record(
                sealing, self.name, self.shard_no, self.gen, seq, frame
            )
            self.store.append(
                persistence.wal_key(self.index_id, self.shard_no, self.gen, epoch), record
            )
        self.records += 1
        self.bytes += len(record)

    def due(self) -> bool:
        """Whether the WAL should roll into a snapshot: past its bounds; for a state whose
        snapshot is larger than the byte bound, once the WAL holds WAL_SNAPSHOT_SHARE of it
        (or WAL_RECORDS_LARGE records), so that a growing state is rewritten a bounded number
        of times (actors.constants)."""
        if self.snapshot_bytes <= self.max_bytes:
            return self.records >= self.max_records or self.bytes >= self.max_bytes
        return self.bytes >= max(
            self.max_bytes, constants.WAL_SNAPSHOT_SHARE * self.snapshot_bytes
        ) or self.records >= max(self.max_records, constants.WAL_RECORDS_LARGE)

    def roll(self) -> int:
        """Start the next generation (records go to its log from now on); returns it."""
        self.gen += 1
        self.records = self.bytes = 0
        return self.gen

    def write_snapshot(self, key: bytes, frame: bytes | Frame, gen: int) -> None:
        """``frame`` as snapshot ``gen``; while the key rotates, under both keys."""
        for sealing, epoch in self.keys.sealing(key):
            self.put_snapshot(sealing, epoch, frame, gen)
        if gen >= self.snapshot_gen:
            self.snapshot_bytes = _size(frame)
        self.snapshot_gen = max(self.snapshot_gen, gen)

    def write_rotation_snapshot(
        self, new_key: bytes, epoch: int, frame: bytes | Frame, gen: int
    ) -> None:
        """A key rotation's first snapshot: the whole state under ``new_key`` alone, in its
        new epoch; the latest snapshot (its size bounds the WAL: :meth:`due`)."""
        self.put_snapshot(new_key, epoch, frame, gen)
        self.snapshot_bytes = _size(frame)

    def put_snapshot(self, key: bytes, epoch: int, frame: bytes | Frame, gen: int) -> None:
        persistence.put_snapshot(
            self.store,
            key,
            self.name,
            self.index_id,
            self.shard_no,
            epoch,
            frame,
            gen,
            self.chunk_bytes,
        )


def _size(frame: bytes | Frame) -> int:
    return frame.nbytes if isinstance(frame, Frame) else len(frame)
