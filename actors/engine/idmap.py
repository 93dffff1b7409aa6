"""A shard's item ids -> labels, at 16 bytes per item instead of a dict entry per id.

A ``dict[str, int]`` costs a shard several times that per item (the key string, the label as
an int object, the table slot), a sizeable share of a vector's own bytes. Here each id is held
once, in the item table's packed :class:`~actors.engine.strings.StringColumn`; the map keeps a
sorted array of 64-bit hashes and the labels beside it, answers a batch of lookups with one
``searchsorted``, and confirms every hit against the stored id bytes, so a hash collision can
never return another item. The rare id whose hash another live id already holds goes to a small
``overflow`` dict. Writes gather in ``recent`` (hash -> label) and are merged into the arrays
when it grows past a fraction of them, so a write costs amortised O(log n); only a write large
beside the arrays (a snapshot's ids, a first bulk load) goes into them at once.

Hashes are Python's ``hash(str)``: cached on the string, salted per process, never persisted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import numpy as np

from actors import constants
from actors.engine.strings import StringBlock


class IdMap:
    hash_fn: Callable[[str], int] = staticmethod(hash)

    def __init__(self, stored: Callable[[np.ndarray], StringBlock]) -> None:
        """``stored(labels)``: the ids stored under ``labels`` (the item table's id column)."""
        self._stored = stored
        self.keys = np.empty(0, dtype=np.int64)  # sorted hashes
        self.vals = np.empty(0, dtype=np.int64)  # labels; -1 = removed (a free slot)
        self.recent: dict[int, int] = {}
        self.overflow: dict[str, int] = {}
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def nbytes(self) -> int:
        # recent: its table, and a hash and a label int object per entry
        recent = sys.getsizeof(self.recent) + 60 * len(self.recent) if self.recent else 0
        return self.keys.nbytes + self.vals.nbytes + recent

    def _hashes(self, ids: Sequence[str]) -> np.ndarray:
        return np.fromiter(map(self.hash_fn, ids), dtype=np.int64, count=len(ids))

    def _main_pos(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per hash: its position in the arrays (clipped) and whether it is there."""
        if len(self.keys) == 0:
            return np.zeros(len(hashes), dtype=np.int64), np.zeros(len(hashes), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, hashes), len(self.keys) - 1)
        return pos, self.keys[pos] == hashes

    def _find(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(hashes, labels with -1 for absent, where each was found: 0 absent, 1 arrays,
        2 recent, 3 overflow, and its position in the arrays)."""
        hashes = self._hashes(ids)
        pos, hit = self._main_pos(hashes)
        labels = np.where(hit, self.vals[pos] if len(self.vals) else -1, -1)
        where = np.where(labels >= 0, 1, 0)
        if self.recent:
            get = self.recent.get
            for row in np.flatnonzero(labels < 0).tolist():
                lab = get(int(hashes[row]))
                if lab is not None:
                    labels[row], where[row] = lab, 2
        rows = np.flatnonzero(labels >= 0)
        if len(rows):  # a hash hit is a match only if the stored id is this id
            wanted = StringBlock.from_list([ids[r] for r in rows.tolist()])
            have = self._stored(labels[rows])
            same = np.array_equal(have.lens, wanted.lens) and np.array_equal(have.blob, wanted.blob)
            if not same:
                stored = have.flat()
                for j, r in enumerate(rows.tolist()):
                    if stored[j] != ids[r]:
                        labels[r], where[r] = -1, 0
        if self.overflow:
            for row, item_id in enumerate(ids):
                lab = self.overflow.get(item_id)
                if lab is not None:
                    labels[row], where[row] = lab, 3
        return hashes, labels, where, pos

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """Labels of ``ids`` (int64), -1 where an id is not in the map."""
        return self._find(ids)[1]

    def remove(self, ids: Sequence[str]) -> np.ndarray:
        """Drop the ids that are present (each once, however often it is named); returns
        their labels."""
        ids = list(dict.fromkeys(ids))
        hashes, labels, where, pos = self._find(ids)
        self.vals[pos[where == 1]] = -1
        for row in np.flatnonzero(where == 2).tolist():
            del self.recent[int(hashes[row])]
        for row in np.flatnonzero(where == 3).tolist():
            del self.overflow[ids[row]]
        found = labels[where > 0]
        self.count -= len(found)
        return found

    def add(self, ids: Sequence[str], labels: np.ndarray) -> None:
        """Map ``ids`` (distinct, none of them present: the caller checks) to ``labels``."""
        labels = np.asarray(labels, dtype=np.int64)
        hashes = self._hashes(ids)
        pos, hit = self._main_pos(hashes)
        vals = self.vals[pos] if len(self.vals) else np.full(len(ids), -1, dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        dup = np.zeros(len(ids), dtype=bool)  # the hash of an id earlier in this batch
        dup[order[1:]] = hashes[order[1:]] == hashes[order[:-1]]
        reuse = hit & (vals < 0) & ~dup  # a removed id left its hash's slot free
        self.vals[pos[reuse]] = labels[reuse]
        # Taken: the hash belongs to another live id, in the arrays, in recent, or earlier in
        # this batch. Those ids go to overflow, found by the string itself.
        taken = (hit & ~reuse) | dup
        if self.recent:
            taken |= np.fromiter(
                (h in self.recent for h in hashes.tolist()), dtype=bool, count=len(ids)
            )
        for row in np.flatnonzero(taken).tolist():
            self.overflow[ids[row]] = int(labels[row])
        new = ~(reuse | taken)
        # Straight into the arrays only when the write is large beside them: a merge re-sorts
        # every entry, so merging per write would make a stream of writes quadratic.
        if int(new.sum()) > max(
            constants.IDMAP_BULK, len(self.keys) // constants.IDMAP_RECENT_SHARE
        ):
            self._merge(hashes[new], labels[new])
        else:
            self.recent.update(zip(hashes[new].tolist(), labels[new].tolist()))
            limit = len(self.keys) // constants.IDMAP_RECENT_SHARE
            if len(self.recent) > max(constants.IDMAP_MERGE_MIN, limit):
                self._merge(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        self.count += len(ids)

    def relabelled(self, new_of: np.ndarray, stored: Callable[[np.ndarray], StringBlock]) -> IdMap:
        """A copy mapping every id to ``new_of[its label]`` (every label held must map to one
        >= 0), reading ids through ``stored``; the slots of removed ids are dropped."""
        out = IdMap(stored)
        out.hash_fn = self.hash_fn  # the function that hashed the keys
        keep = self.vals >= 0
        out.keys, out.vals = self.keys[keep], new_of[self.vals[keep]]
        recent = np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))
        out.recent = dict(zip(self.recent, new_of[recent].tolist()))
        out.overflow = {i: int(new_of[label]) for i, label in self.overflow.items()}
        small = [*out.recent.values(), *out.overflow.values()]
        if (out.vals < 0).any() or min(small, default=0) < 0:
            raise ValueError("IdMap.relabelled: an id's label has no new label")
        out.count = self.count
        return out

    def _merge(self, hashes: np.ndarray, labels: np.ndarray) -> None:
        """Fold ``recent`` and the given (hash, label) pairs into the sorted arrays, dropping
        the slots of removed ids."""
        rk = np.fromiter(self.recent.keys(), dtype=np.int64, count=len(self.recent))
        rv = np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))
        live = self.vals >= 0
        keys = np.concatenate([self.keys[live], rk, hashes])
        vals = np.concatenate([self.vals[live], rv, labels])
        order = np.argsort(keys, kind="stable")
        self.keys, self.vals = keys[order], vals[order]
        self.recent = {}
