"""A shard's data keys: the one its loaded state answers to, the key epoch it was loaded at, and
while the index's key rotates (actors.control.rotation) the next one, under which every write is
sealed first."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from actors.errors import Unauthorized, Unavailable
from actors.storage import Store, persistence


@dataclass(frozen=True, repr=False)
class NextKey:
    """A partition's half of a rotation under way: the next epoch and its data key."""

    key: bytes
    epoch: int

    def __repr__(self) -> str:
        return f"NextKey(epoch={self.epoch}, key=<redacted>)"


class KeyRotated(Unauthorized):
    """The index switched to a new key while this partition waited: its state is outdated."""


class ShardKeys:
    def __init__(self) -> None:
        self.key: bytes | None = None  # the data key the loaded state answers to
        self.epoch = 0
        self.next: NextKey | None = None
        # Writes wait for a rotation this partition lost its place in (it was prepared, then
        # reloaded, so it no longer writes under both keys).
        self.blocked = False

    def check(self, key: bytes) -> None:
        """A loaded partition answers only to the key that loaded it (the gateway verifies keys
        first; this keeps one index's key from ever reading another's partition)."""
        if self.key is not None and hmac.compare_digest(key, self.key):
            return
        if self.next is not None and hmac.compare_digest(key, self.next.key):
            return  # the index switched to the next key; the commit is on its way
        if self.blocked:
            raise Unavailable("a key rotation of this index is under way; retry")
        raise Unauthorized("invalid index_key for this index")

    def open_epoch(self, store: Store, name: str, index_id: str, shard_no: int, key: bytes) -> None:
        """On load: the key epoch the catalog names current, ``key`` checked against its config
        (it must open it), and whether writes wait (the index is rotating and this partition
        had its snapshot under the next key). A partition without a catalog entry (tests) stays
        at epoch 0."""
        self.key = key
        meta = persistence.load_meta(store, index_id)
        if meta is None:
            return
        self.epoch = meta.epoch
        if persistence.opens_config(store, key, name, index_id, meta.epoch) is False:
            raise Unauthorized("invalid index_key for this index")
        prepared = persistence.generations(store, index_id, shard_no, "snap", meta.epoch + 1)
        self.blocked = meta.rotation is not None and bool(prepared)

    def sealing(self, key: bytes) -> list[tuple[bytes, int]]:
        """(data key, key epoch) of every copy a write is sealed into: while the key rotates
        the next one first, then the current one (whichever of the two the caller holds)."""
        current = (self.key or key, self.epoch)
        return [current] if self.next is None else [(self.next.key, self.next.epoch), current]

    def gate_write(self, store: Store, index_id: str) -> None:
        """Refuse a write while a rotation this partition lost its place in is under way. Once
        the catalog entry shows it ended: without a switch, writes go on; with one, this state
        and its key are outdated (:class:`KeyRotated`)."""
        if not self.blocked:
            return
        meta = persistence.load_meta(store, index_id)
        if meta is not None and meta.epoch != self.epoch:
            raise KeyRotated("invalid index_key for this index: the key was rotated")
        if meta is not None and meta.rotation is not None:
            raise Unavailable("a key rotation of this index is under way; retry")
        self.blocked = False

    def begin(self, key: bytes, new_key: bytes, epoch: int) -> None:
        """Write under ``new_key`` (epoch ``epoch``) too, from now on."""
        if not hmac.compare_digest(key, self.key or b""):
            raise Unauthorized("invalid index_key for this index")
        self.next, self.blocked = NextKey(new_key, epoch), False

    def commit(self, epoch: int) -> bool:
        """Write under the next key only; False if this state was loaded under an earlier key
        than ``epoch`` (it reloaded during the rotation) and must be dropped."""
        nxt = self.next
        if nxt is not None and nxt.epoch == epoch:
            self.key, self.epoch, self.next, self.blocked = nxt.key, epoch, None, False
            return True
        return self.epoch >= epoch

    def abort(self, epoch: int) -> None:
        if self.next is not None and self.next.epoch == epoch:
            self.next = None
