"""A partition's side of a warm move between pool actors (actors.control.rebalance): the new
host loads it from the store while the old host still serves it, and once the old host has let
it go, takes the writes made meanwhile from the write-ahead log. actors.engine.shard.Shard
inherits it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.engine.rwlock import RWLock
from actors.engine.shard_keys import ShardKeys
from actors.engine.shard_log import ShardLog
from actors.storage import Store, persistence


class ShardMoves:
    store: Store
    index_id: str
    shard_no: int
    keys: ShardKeys
    log: ShardLog
    _lock: RWLock
    _loaded: bool
    _ensure_loaded: Callable[[bytes], None]
    _replayed: Callable[[str, Any], None]

    def warm(self, key: bytes) -> None:
        """Load the partition now (it is still served, and written, elsewhere)."""
        with self._lock.write():
            self._ensure_loaded(key)

    def catch_up(self) -> None:
        """Apply the writes logged since the load (its former host wrote them); nothing if the
        partition is not loaded (it reads everything when it loads). Once another host wrote a
        snapshot newer than any this state holds (even while this state loaded),
        part of the log this state continues may be gone: the partition loads again, from that
        snapshot."""
        with self._lock.write():
            key = self.keys.key
            if not self._loaded or key is None:
                return
            ix, no, epoch = self.index_id, self.shard_no, self.keys.epoch
            snapshots = persistence.generations(self.store, ix, no, "snap", epoch)
            if snapshots and snapshots[-1] > self.log.snapshot_gen:
                self._loaded = False
                self._ensure_loaded(key)
            else:
                self.log.replay(key, self._replayed)
