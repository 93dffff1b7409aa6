"""Moving partitions between pool actors while the service runs: onto a node that joined, off a
node being drained (``vaultvec rebalance``). actors.control.plane.ControlPlane inherits it.

A partition's whole state is in the store: every acknowledged write is in its write-ahead log
before it is acknowledged. A move of partition P from pool actor A to B therefore copies
nothing; it changes who may load P:

1. B is told to accept P (it may have refused P since P last moved away from it).
2. If A has P loaded, A hands it over: B loads P from the store, with the data key A holds,
   while A goes on serving P (reads and writes).
3. A releases P: from that moment it refuses every call for P (:class:`PartitionMoved`), waits
   for the calls already running on P (a write, a snapshot) and drops P's decrypted data.
4. B catches up: it applies the writes A logged since B loaded P.
5. The catalog entry names B for P, in the store, then in the control plane.

A gateway that calls A for P in between is refused, looks the index up again (this waits for
the move to end) and calls B, which holds P with every write A acknowledged: the refusal lasts
as long as steps 3 to 5, not a load of P (a P that A had not loaded, B loads at its first call,
as A would have). Nothing a client was told succeeded is lost and no answer comes from a
partition missing writes; a call refused during the move is retried by the gateway.

Restarts: a pool actor loading a partition checks that the stored catalog entry names it
(actors.pool.actor), so A restarted after step 5 never takes P back; a control plane restarted
in the middle of a move has every pool actor accept what the catalog places on it
(:meth:`Rebalancing.recover_moves`), so a move cut short before step 5 leaves P with A.
Indexes that are training, rotating their key or being restored are left where they are
(reported as skipped): those operations hold their partitions' handles.

When a node with CPUs joins the cluster, the control plane rebalances by itself
(:func:`watch_joins`, every ``VAULTVEC_REBALANCE_CHECK_S``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.control import moves
from actors.control.catalog import Catalog
from actors.errors import InvalidRequest, VaultvecError
from actors.pool.placement import Pool, node_sizes
from actors.types import IndexMeta, Partition

log = logging.getLogger("vaultvec.rebalance")

RELEASE_TIMEOUT_S = 300.0  # the calls running on a partition being released (a large write)
SETTLE_TIMEOUT_S = 60.0  # a view asked for while its index moves waits this long at most


@dataclass(frozen=True)
class Moved:
    index: str
    shard_no: int
    source: str  # pool actor names
    target: str
    source_node: str
    target_node: str
    seconds: float


@dataclass
class RebalanceReport:
    """What ``rebalance`` did (or, with ``dry_run``, would do)."""

    moved: list[Moved] = field(default_factory=list)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)  # (index, shard, why)
    stranded: list[tuple[str, int]] = field(default_factory=list)  # no actor could take them
    before: dict[str, int] = field(default_factory=dict)  # partitions per node
    after: dict[str, int] = field(default_factory=dict)
    draining: list[str] = field(default_factory=list)


class Rebalancing:
    pool: Pool
    _lock: threading.RLock
    _catalog: Catalog
    _training: dict[str, Any]
    _rotating: set[str]
    _load: Counter[str]
    _moving: set[str]  # names of indexes a partition of which is moving
    _settled: threading.Condition  # on _lock: notified when a move ends
    _draining: frozenset[str]  # node ids new partitions avoid
    _rebalancing: threading.Lock  # one rebalance at a time

    update_meta: Callable[[IndexMeta, Callable[[IndexMeta], IndexMeta]], IndexMeta]

    def placeable(self) -> dict[str, str]:
        """The pool's actors (actor -> node) that new partitions may go to: those of nodes not
        being drained, within their node's share (all of them if that leaves none)."""
        members = self.pool.members()
        surplus = self.pool.surplus(members)
        kept = {a: n for a, n in members.items() if n not in self._draining and a not in surplus}
        return kept or members

    def rebalance(self, drain: Collection[str] = (), dry_run: bool = False) -> RebalanceReport:
        """Move partitions off the ``drain`` nodes (by Ray node id) and off pool actors beyond
        their node's share (restarted there from a lost node), and even out the partitions per
        pool actor over the others; new indexes avoid the drained nodes until the next
        rebalance without them. The pool first grows onto nodes that joined."""
        with self._rebalancing:
            return self._rebalance(drain, dry_run)

    def _rebalance(self, drain: Collection[str], dry_run: bool) -> RebalanceReport:
        members = self.pool.members()
        known = set(members.values())
        unknown = sorted(set(drain) - known)
        if unknown:
            raise InvalidRequest(
                f"no live node with pool actors has the id {unknown[0]!r}; "
                f"nodes: {', '.join(sorted(known))}"
            )
        with self._lock:
            placements = {n: m.placement for n, m in self._catalog.items() if m.placement}
            if not dry_run:
                self._draining = frozenset(drain)
        planned = moves.plan(placements, members, drain, self.pool.surplus(members))
        report = RebalanceReport(
            stranded=planned.stranded, before=per_node(placements, members), draining=sorted(drain)
        )
        for mv in planned.moves:
            if dry_run:
                report.moved.append(moved(mv, members, 0.0))
                continue
            started = time.monotonic()
            why = self._move(mv)
            if why is None:
                report.moved.append(moved(mv, members, time.monotonic() - started))
                log.info("moved %s shard %d to %s", mv.index, mv.shard_no, mv.target)
            else:
                report.skipped.append((mv.index, mv.shard_no, why))
        if dry_run:
            for mv in planned.moves:
                placement = list(placements[mv.index])
                placement[mv.shard_no] = mv.target
                placements[mv.index] = tuple(placement)
        else:
            with self._lock:
                placements = {n: m.placement for n, m in self._catalog.items() if m.placement}
        report.after = per_node(placements, members)
        return report

    def _move(self, mv: moves.Move) -> str | None:
        """Carry out one move; None once done, else why it was not made."""
        with self._lock:
            meta = self._catalog.get(mv.index)
            if meta is None:
                return "deleted"
            if meta.placement[mv.shard_no] != mv.source:
                return "moved meanwhile"
            if mv.index in self._training:
                return "training"
            if mv.index in self._rotating:
                return "rotating its key"
            if meta.restoring:
                return "being restored from a backup"
            self._moving.add(mv.index)
        part = Partition(meta.name, meta.index_id, mv.shard_no)
        source = self.pool.handle(mv.source)
        try:
            target = self.pool.handle(mv.target)
            ray.get(target.accept.remote([part]))
            try:
                ray.get(source.hand_over.remote(part, target), timeout=RELEASE_TIMEOUT_S)
            except (GetTimeoutError, RayActorError) as exc:  # B loads P at its first call
                log.warning("%s shard %d moves cold: %s", mv.index, mv.shard_no, type(exc).__name__)
            try:
                ray.get(source.release.remote(part), timeout=RELEASE_TIMEOUT_S)
            except RayActorError:
                pass  # A died: restarted, it refuses P once the catalog names B
            except GetTimeoutError:
                ray.get(source.accept.remote([part]))  # A keeps P: it loads P afresh
                ray.get(target.release.remote(part))  # and B drops what it loaded
                return f"calls on the partition ran past {RELEASE_TIMEOUT_S:.0f}s"
            ray.get(target.catch_up.remote(part))

            def to_target(current: IndexMeta) -> IndexMeta:
                placement = list(current.placement)
                placement[mv.shard_no] = mv.target
                return replace(current, placement=tuple(placement))

            try:
                self.update_meta(meta, to_target)
            except VaultvecError:
                return "deleted"  # (while it moved: its partitions were retired)
            with self._lock:
                self._load[mv.source] -= 1
                self._load[mv.target] += 1
            return None
        finally:
            with self._lock:
                self._moving.discard(mv.index)
                self._settled.notify_all()

    def rebalance_if_joined(self, seen: set[str] | None) -> set[str]:
        """Rebalance if a node with CPUs joined since the nodes ``seen`` (None: not known yet);
        returns the nodes now. Starts no pool actor while there is no partition to move."""
        now = set(node_sizes(self.pool.size_per_node))
        with self._lock:
            hosting = any(m.placement for m in self._catalog.values())
            drain = self._draining & now
        if seen is not None and now - seen and hosting:
            report = self.rebalance(drain)
            log.info(
                "node(s) %s joined: moved %d partition(s), %d skipped",
                ", ".join(sorted(now - seen)),
                len(report.moved),
                len(report.skipped),
            )
        return now

    def recover_moves(self) -> None:
        """After this actor restarted: every pool actor accepts the partitions the catalog
        places on it, so that a move cut short between its release and the catalog's change
        leaves no partition refused by the actor that still holds it."""
        with self._rebalancing:
            with self._lock:
                placed: dict[str, list[Partition]] = {}
                for meta in self._catalog.values():
                    for s, actor in enumerate(meta.placement):
                        placed.setdefault(actor, []).append(Partition(meta.name, meta.index_id, s))
            refs = [self.pool.handle(a).accept.remote(parts) for a, parts in placed.items()]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RELEASE_TIMEOUT_S)
            for ref in ready:
                with contextlib.suppress(RayActorError):  # restarted meanwhile: refuses nothing
                    ray.get(ref)

    def _await_move(self, name: str) -> None:
        """Return once no partition of index ``name`` is moving (bounded)."""
        with self._settled:
            self._settled.wait_for(lambda: name not in self._moving, SETTLE_TIMEOUT_S)


def moved(mv: moves.Move, members: dict[str, str], seconds: float) -> Moved:
    return Moved(
        mv.index, mv.shard_no, mv.source, mv.target, members[mv.source], members[mv.target], seconds
    )


def per_node(placements: dict[str, tuple[str, ...]], members: dict[str, str]) -> dict[str, int]:
    """Partitions per node (actors not in ``members``: under ``"?"``)."""
    counts: Counter[str] = Counter({n: 0 for n in members.values()})
    for placement in placements.values():
        counts.update(members.get(a, "?") for a in placement)
    return dict(sorted(counts.items()))


def watch_joins(plane: Rebalancing, period_s: float) -> None:
    """Check every ``period_s`` whether a node joined, and rebalance then (a daemon thread that
    ends with ``plane``)."""
    ref = weakref.ref(plane)

    def loop() -> None:
        seen: set[str] | None = None
        while True:
            time.sleep(period_s)
            current = ref()
            if current is None:
                return
            try:
                seen = current.rebalance_if_joined(seen)
            except Exception:  # never let the loop die
                log.exception("rebalancing after a node joined failed; tried again next check")
            del current

    threading.Thread(target=loop, name="vaultvec-rebalance", daemon=True).start()
