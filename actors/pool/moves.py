"""A pool actor's side of moving partitions between pool actors (actors.control.rebalance):
refusing a partition on its way in or out, loading one while its former host still serves it,
admitting it, and settling against the catalog. actors.pool.actor.ShardPool inherits it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import ray

from actors.engine.shard import Shard
from actors.process import heap
from actors.storage import Store, persistence
from actors.types import Partition

log = logging.getLogger("vaultvec.pool")


class PoolMoves:
    _lock: threading.Lock
    _hosted: dict[tuple[str, int], Shard]
    _moved: set[tuple[str, int]]  # partitions released to another actor
    _incoming: set[tuple[str, int]]  # partitions moving here, not yet admitted
    store: Store
    _call: Callable[..., AbstractContextManager[None]]
    _shard: Callable[..., Shard]
    retire: Callable[[str], None]

    def prepare(self, p: Partition) -> None:
        """A move of ``p`` here begins: calls for it are refused until :meth:`admit`."""
        slot = (p.index_id, p.shard_no)
        with self._lock:
            self._moved.discard(slot)
            self._incoming.add(slot)

    def hand_over(self, p: Partition, target: Any) -> bool:
        """Have pool actor ``target`` load ``p`` while this actor still serves it, with the
        data key p is loaded under here (which never leaves the pool's actors); False if p is
        not loaded here (``target`` loads it when it first needs it)."""
        shard = self._hosted.get((p.index_id, p.shard_no))
        key = None if shard is None or not shard.loaded else shard.keys.key
        if key is None:
            return False
        ray.get(target.warm.remote(p, key))
        return True

    def warm(self, p: Partition, key: bytes) -> None:
        """Load a partition moving here (:meth:`hand_over`)."""
        with self._call("warm", p.shard_no):
            self._shard(p, placed=False).warm(key)

    def release(self, p: Partition) -> None:
        """Give ``p`` up: every later call for it is refused, the calls running on it end
        first, then its data is dropped."""
        with self._call("release", p.shard_no):
            self._release((p.index_id, p.shard_no))

    def _release(self, slot: tuple[str, int]) -> None:
        with self._lock:
            self._moved.add(slot)
            self._incoming.discard(slot)
            shard = self._hosted.get(slot)
        if shard is not None:
            shard.retire()  # takes its locks: waits for the calls and snapshot under way
            with self._lock:
                if self._hosted.get(slot) is shard:
                    del self._hosted[slot]
            heap.trim()

    def admit(self, p: Partition) -> None:
        """Serve ``p`` from now on (the catalog names this actor; its former host released
        it): a copy loaded during the move first applies what was logged since."""
        with self._call("admit", p.shard_no):
            self._admit((p.index_id, p.shard_no))

    def _admit(self, slot: tuple[str, int]) -> None:
        with self._lock:  # a copy loaded during a move catches up; one served all along is current
            shard = self._hosted.get(slot) if slot in self._incoming else None
        try:
            if shard is not None:
                shard.catch_up()
        except Exception:  # its state is unknown: let it go; the next call loads it whole
            log.exception("catching up shard %d of index %s failed; it loads afresh", *slot[::-1])
            shard.retire()  # type: ignore[union-attr]
            with self._lock:
                if self._hosted.get(slot) is shard:
                    del self._hosted[slot]
        finally:
            with self._lock:
                self._incoming.discard(slot)
                self._moved.discard(slot)

    def settle(self, placed: list[Partition], known: list[str], admit: bool) -> None:
        """Match the catalog after a move was cut short (the control plane restarted), for the
        indexes ``known``: first (every actor) let go of what is not ``placed`` here, then
        (``admit``, every actor) serve what is."""
        here = {(p.index_id, p.shard_no) for p in placed}
        if admit:  # (only what a move left refused: the rest is served already)
            with self._lock:
                waiting = here & (self._incoming | self._moved)
            for slot in sorted(waiting):
                self._admit(slot)
            return
        ids = set(known)
        with self._lock:
            mine = set(self._hosted) | self._incoming
        for index_id in {s[0] for s in mine} - ids:  # deleted since, unless created since
            if self.store.get(persistence.meta_key(index_id)) is None:
                self.retire(index_id)
        for slot in sorted(s for s in mine - here if s[0] in ids):
            self._release(slot)
