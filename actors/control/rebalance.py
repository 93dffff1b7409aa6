"""Moving partitions between pool actors while the service runs: onto a node that joined, off a
node being drained (``vaultvec rebalance``). actors.control.plane.ControlPlane inherits it.

A partition's whole state is in the store: every acknowledged write is in its write-ahead log
before it is acknowledged. A move of partition P from pool actor A to B therefore copies
nothing; it changes who may load P:

1. B is told P is coming: it refuses calls for P until step 5 (a gateway may still hold a view
   naming B from an earlier time B held P).
2. If A has P loaded, A hands it over: B loads P from the store, with the data key A holds,
   while A goes on serving P (reads and writes).
3. The catalog entry names B for P, in the store, then in the control plane.
4. A releases P: from that moment it refuses every call for P (:class:`PartitionMoved`), waits
   for the calls already running on P (a write, a snapshot) and drops P's decrypted data.
5. B is admitted: it applies the writes A logged since B loaded P (or loads again, should A
   have rolled its log into a newer snapshot meanwhile), then serves P.

Only A writes P's log until step 4, only B after it. A gateway refused by A (or by B before
step 5) looks the index up again; the view it asks for waits while steps 3 to 5 run (they take
no load of P: B loaded it before) and names B, and the gateway retries there within its retry
budget. Nothing acknowledged is lost and no answer comes from a state missing a write. A
partition that A had not loaded moves as it is: B loads it at its first call, as A would have.
If step 1 or 2 fails, the move goes on cold; if step 3 fails (and did not land), B lets its
copy go and the partition stays with A. B is admitted only once A answered its release (or
died: Ray restarts it, and it refuses P); a host that stays unreachable leaves P refused until
the pool is settled again (:meth:`Rebalancing.recover_moves`, at the next periodic check or
rebalance).

Restarts: a pool actor loading a partition checks that the stored catalog entry names it
(actors.pool.actor), so A restarted after step 3 never takes P back, and B restarted after it
loads P whole. A control plane restarted in the middle of a move has every pool actor settle
against the catalog (:meth:`Rebalancing.recover_moves`): every actor first lets go of what the
catalog does not place on it (and of deleted indexes), then the actor it names serves P
(caught up). Indexes that are training, rotating their key or being restored are
left where they are (reported as skipped); training and key rotation refuse to start, and a
deletion waits, while an index's partition moves.

When a node with CPUs joins the cluster, the control plane rebalances by itself
(:func:`watch_joins`, every ``VAULTVEC_REBALANCE_CHECK_S``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

from actors.control import moves
from actors.control.catalog import Catalog
from actors.errors import InvalidRequest, VaultvecError
from actors.pool.placement import Pool, node_sizes
from actors.storage import Store, persistence
from actors.types import IndexMeta, Partition

log = logging.getLogger("vaultvec.rebalance")

# A call of a move that loads a partition (or waits for one); the longest a view asked for
# while its index switches hosts waits (a control-plane thread waits with it).
MOVE_CALL_TIMEOUT_S = 300.0
VIEW_WAIT_S = 30.0


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
    _switching: set[str]  # those of them between steps 3 and 5
    _settled: threading.Condition  # on _lock: notified when a move ends
    _draining: frozenset[str]  # node ids new partitions avoid
    _rebalancing: threading.Lock  # one rebalance at a time
    _unsettled: bool  # a move could not confirm a step: the pool is settled again
    store: Store

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
            if self._unsettled and not dry_run:
                self._settle_all()
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
            ids = {n: m.index_id for n, m in self._catalog.items()}
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
            why = self._move(mv, ids[mv.index])
            if why is None:
                report.moved.append(moved(mv, members, time.monotonic() - started))
                log.info("moved %s shard %d to %s", mv.index, mv.shard_no, mv.target)
            else:
                report.skipped.append((mv.index, mv.shard_no, why))
        if dry_run:
            for mv in planned.moves:
                placements[mv.index] = placed(placements[mv.index], mv)
        else:
            with self._lock:
                placements = {n: m.placement for n, m in self._catalog.items() if m.placement}
        report.after = per_node(placements, members)
        return report

    def _move(self, mv: moves.Move, index_id: str) -> str | None:
        """Carry out one move; None once done, else why it was not made."""
        with self._lock:
            meta = self._catalog.get(mv.index)
            if meta is None or meta.index_id != index_id:
                return "deleted or re-created meanwhile"
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
        source, target = self.pool.handle(mv.source), self.pool.handle(mv.target)
        try:
            try:  # steps 1 and 2
                ray.get(target.prepare.remote(part), timeout=MOVE_CALL_TIMEOUT_S)
                ray.get(source.hand_over.remote(part, target), timeout=MOVE_CALL_TIMEOUT_S)
            except Exception as exc:  # B loads what it lacks when it is admitted, or later
                log.warning("%s shard %d moves cold: %r", mv.index, mv.shard_no, exc)
            with self._lock:
                self._switching.add(mv.index)
            try:  # step 3
                self.update_meta(meta, lambda m: replace(m, placement=placed(m, mv)))
            except Exception as exc:
                try:
                    landed = self._landed(meta, mv)
                except Exception:  # not known: settled against the catalog at the next check
                    landed, self._unsettled = False, True
                if not landed:
                    with contextlib.suppress(Exception):  # B drops its copy, refuses P again
                        ray.get(target.release.remote(part), timeout=MOVE_CALL_TIMEOUT_S)
                    return "deleted meanwhile" if isinstance(exc, VaultvecError) else repr(exc)
            with self._lock:
                self._load[mv.source] -= 1
                self._load[mv.target] += 1
            # Step 4 (A, restarted, refuses P: the catalog names B), then step 5 (B, restarted,
            # loads P whole). B serves only once A is known to have let P go; if either cannot
            # be confirmed, P stays refused until the control plane settles the pool again.
            for handle, step in ((source, "release"), (target, "admit")):
                if not confirmed(functools.partial(getattr(handle, step).remote, part)):
                    self._unsettled = True
                    return (
                        f"moved, but its {'former' if step == 'release' else 'new'} host did "
                        "not answer; it is settled at the next check"
                    )
            return None
        finally:
            with self._lock:
                self._moving.discard(mv.index)
                self._switching.discard(mv.index)
                self._settled.notify_all()

    def _landed(self, meta: IndexMeta, mv: moves.Move) -> bool:
        """Whether the catalog write of ``mv`` landed although it raised (a store that lost
        its answer); the control plane's entry then follows the store's."""
        stored = persistence.load_meta(self.store, meta.index_id)
        if stored is None or stored.placement[mv.shard_no : mv.shard_no + 1] != (mv.target,):
            return False
        with self._lock:
            if mv.index in self._catalog:
                self._catalog[mv.index] = stored
        return True

    def rebalance_if_joined(self, seen: set[str] | None) -> set[str]:
        """Rebalance if a node with CPUs joined since the nodes ``seen`` (None: not known yet);
        returns the nodes now. Starts no pool actor while there is no partition to move."""
        if self._unsettled:
            self.recover_moves()
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
        """Settle every pool actor against the catalog: what the catalog places on an actor
        it serves (caught up with the log if it was loaded during a move), anything else it
        lets go, every actor letting go before any serves. Run when this actor restarts (a
        move it cut short), before a rebalance and at the periodic check while a move left a
        partition unconfirmed (:attr:`_unsettled`), until it succeeds."""
        with self._rebalancing:
            self._settle_all()

    def _settle_all(self) -> None:
        self._unsettled = True
        with self._lock:
            known = [m.index_id for m in self._catalog.values()]
            placed: dict[str, list[Partition]] = {a: [] for a in self.pool.members()}
            for meta in self._catalog.values():
                for s, actor in enumerate(meta.placement):
                    placed.setdefault(actor, []).append(Partition(meta.name, meta.index_id, s))
        for admit in (False, True):  # no actor serves P before every other let it go
            calls = [
                functools.partial(self.pool.handle(a).settle.remote, parts, known, admit)
                for a, parts in placed.items()
            ]
            if not all(confirmed(call) for call in calls):
                log.warning("settling the pool against the catalog: an actor did not answer")
                return
        self._unsettled = False

    def _await_move(self, name: str, whole: bool = False) -> None:
        """Return once no partition of index ``name`` is switching hosts (steps 3 to 5), or
        with ``whole``, moving at all (bounded)."""
        busy = self._moving if whole else self._switching
        with self._settled:
            self._settled.wait_for(
                lambda: name not in busy, MOVE_CALL_TIMEOUT_S if whole else VIEW_WAIT_S
            )


def confirmed(call: Callable[[], Any], timeout_s: float = MOVE_CALL_TIMEOUT_S) -> bool:
    """Run ``call()`` (a Ray call) until it answers: True once it did, or once its actor died
    for good (a restarted pool actor holds nothing of a move); False if the actor stays
    unreachable (it may be alive, the call not run) past ``timeout_s``. Ray runs a call again
    on a restarted actor by itself."""
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            ray.get(call(), timeout=max(0.1, deadline - time.monotonic()))
            return True
        except ActorDiedError:
            return True
        except (ActorUnavailableError, GetTimeoutError):
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def placed(placement: IndexMeta | tuple[str, ...], mv: moves.Move) -> tuple[str, ...]:
    """``placement`` (or an entry's) with ``mv``'s partition on its target."""
    out = list(placement.placement if isinstance(placement, IndexMeta) else placement)
    out[mv.shard_no] = mv.target
    return tuple(out)


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
