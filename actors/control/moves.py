"""Where partitions should move: off draining nodes and surplus actors, then from the busiest pool
actors to the idlest, until every actor holds within one partition of every other or the rules
below allow no further move.

Pure planning over catalog placements (index name -> the pool actor of each shard number) and
the pool's membership (actor -> node); actors.control.rebalance carries the moves out. The
rules :func:`actors.pool.placement.place` follows at creation hold after every move: an index's
partitions stay on distinct actors, and no balancing move crowds more of one index's partitions
onto a node than the node it leaves held (a partition leaving a draining node goes to the node
holding fewest of its index's partitions, which may already hold some).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from actors.pool.placement import rendezvous


@dataclass(frozen=True)
class Move:
    index: str
    shard_no: int
    source: str  # pool actor names
    target: str


@dataclass
class Plan:
    moves: list[Move] = field(default_factory=list)
    # (index, shard number) of partitions on a draining node with nowhere to go: every
    # other actor already holds a partition of that index.
    stranded: list[tuple[str, int]] = field(default_factory=list)


def plan(
    placements: Mapping[str, tuple[str, ...]],
    nodes: Mapping[str, str],
    drain: Collection[str] = (),
    surplus: Collection[str] = (),
) -> Plan:
    """The moves that empty the actors of the ``drain`` nodes and the ``surplus`` actors, then
    balance the partitions per actor over the other actors of ``nodes`` (actor -> node).
    Actors missing from ``nodes`` (restarting elsewhere) are left as they are."""
    where = {name: list(p) for name, p in placements.items()}
    targets = sorted(a for a, n in nodes.items() if n not in drain and a not in surplus)
    load: Counter[str] = Counter(a for p in where.values() for a in p)
    hosts: dict[str, set[str]] = {a: set() for a in nodes}  # actor -> names of its indexes
    spread: dict[str, Counter[str]] = {}  # index name -> its partitions per node
    for name, p in where.items():
        spread[name] = Counter(nodes[a] for a in p if a in nodes)
        for a in p:
            hosts.setdefault(a, set()).add(name)
    out = Plan()

    def move(name: str, s: int, target: str) -> None:
        source = where[name][s]
        out.moves.append(Move(name, s, source, target))
        where[name][s] = target
        load[source] -= 1
        load[target] += 1
        hosts[source].discard(name)
        hosts[target].add(name)
        spread[name][nodes[source]] -= 1
        spread[name][nodes[target]] += 1

    for name in sorted(where):
        for s, actor in enumerate(where[name]):
            if nodes.get(actor) not in drain and (actor not in surplus or actor not in nodes):
                continue
            free = [t for t in targets if name not in hosts[t]]
            if not free:
                out.stranded.append((name, s))
                continue
            key = spread[name]
            move(name, s, min(free, key=lambda t: (key[nodes[t]], load[t], rendezvous(name, t))))

    # From the busiest actor to the idlest that can take some of its partitions, as many as
    # bring neither past the mean (at least one); of the partitions that
    # may go, those of indexes most crowded on the busy actor's node first (then by name). Each
    # pass moves some or sets an actor aside until something moves again.
    total = sum(load[a] for a in targets)
    lo, hi = total // max(len(targets), 1), -(-total // max(len(targets), 1))
    stuck: set[str] = set()
    for _ in range((sum(load.values()) + 1) * (len(targets) + 1)):
        sources = [a for a in targets if a not in stuck]
        if not sources:
            break
        heavy = max(sources, key=lambda a: (load[a], a))
        moved = False
        for light in sorted(targets, key=lambda a: (load[a], a)):
            if load[heavy] - load[light] < 2:
                break
            k = max(1, min(load[heavy] - hi, lo - load[light]))
            nh, nl = nodes[heavy], nodes[light]
            options = []
            for name in hosts[heavy] - hosts[light]:
                here = spread[name][nh]
                there = 0 if nh == nl else spread[name][nl] + 1
                if there <= here:  # never crowds the index onto a node more than before
                    options.append((there - here, name))
            if options:
                for _, name in heapq.nsmallest(k, options):
                    move(name, where[name].index(heavy), light)
                moved = True
                break
        if moved:
            stuck.clear()  # what it moved may free another actor's partitions to go
        else:
            stuck.add(heavy)
    return out
