"""The shard pool as the control plane sees it: its actors, their nodes, and where each index's
partitions go.

Per live node with CPUs the pool holds ``pool_size`` actors (default: one per CPU), named
``vaultvec-pool-<store tag>-<n>`` (the tag keeps services on different stores apart), detached
and restartable: a crashed actor restarts under the same name and reloads its partitions lazily,
and one on a lost node restarts on another (its node affinity is soft). An index's S partitions
go to S different actors, spread over the nodes, the least loaded first; the choice is recorded
in the index's catalog entry (IndexMeta.placement), so it never changes under a running index.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import constants
from actors.errors import Unavailable
from actors.pool.actor import PoolActor, PoolOptions
from actors.process import heap

log = logging.getLogger("vaultvec.placement")

NAMESPACE = "vaultvec"


def store_tag(store_url: str) -> str:
    return hashlib.blake2b(store_url.encode(), digest_size=4).hexdigest()


def rendezvous(index_id: str, actor: str) -> int:
    digest = hashlib.blake2b(f"{index_id}/{actor}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def place(index_id: str, n: int, nodes: dict[str, str], load: Counter[str]) -> tuple[str, ...]:
    """Pool actors for the ``n`` partitions of an index: distinct actors while there are
    enough, then spread over the nodes, then the least loaded; ties broken by rendezvous
    hashing, so the choice is deterministic."""
    if not nodes:
        raise Unavailable("the shard pool has no actors")
    chosen: list[str] = []
    for _ in range(n):
        on_node = Counter(nodes[a] for a in chosen)
        best = min(
            nodes,
            key=lambda a: (chosen.count(a), on_node[nodes[a]], load[a], rendezvous(index_id, a)),
        )
        chosen.append(best)
    return tuple(chosen)


class Pool:
    """The control plane's handle on the shard pool."""

    def __init__(
        self,
        store_url: str,
        *,
        size_per_node: int = 0,
        budget_bytes: int = 0,
        idle_ttl_s: float = 0.0,
        num_cpus: float = 0.05,
        max_concurrency: int = 16,
        wal_max_records: int = 256,
        snapshot_chunk_bytes: int = constants.SNAPSHOT_CHUNK_BYTES,
        vector_dir: str = "",
        threads: int = 0,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.store_url = store_url
        self.prefix = f"vaultvec-pool-{store_tag(store_url)}-"
        self.size_per_node = size_per_node
        self.budget_bytes = budget_bytes
        self.idle_ttl_s = idle_ttl_s
        self.num_cpus = num_cpus
        self.max_concurrency = max_concurrency
        self.wal_max_records = wal_max_records
        self.snapshot_chunk_bytes = snapshot_chunk_bytes
        self.vector_dir = vector_dir
        self.threads = threads
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._nodes: dict[str, str] = {}  # actor name -> node id
        self._unstartable: set[str] = set()  # nodes whose actors did not start at the last check
        self._checked_at = -constants.MEMBERSHIP_TTL_S

    def name(self, n: int) -> str:
        return f"{self.prefix}{n}"

    def handle(self, name: str) -> Any:
        """The pool actor ``name``: found, or started (a placement may name an actor that a
        smaller cluster has not started yet)."""
        handle = self._handles.get(name)
        if handle is None:
            with self._lock:  # (after a members() under way, which may start it or drop it)
                handle = self._handles.get(name)
                if handle is None:
                    handle = self._start(name, None)
                    self._handles[name] = handle
        return handle

    def members(self) -> dict[str, str]:
        """Pool actor name -> node id, every node with CPUs holding its share of actors (started
        now if missing: a node that joined gets its share on the next call). Unavailable if the
        pool has no actor and none can start (no room for them)."""
        with self._lock:
            sizes = node_sizes(self.size_per_node)
            fresh = time.monotonic() - self._checked_at < constants.MEMBERSHIP_TTL_S
            # A node whose actors could not start is tried again once the membership is stale,
            # not on every call (each try waits up to start_timeout_s under the lock).
            joined = (
                set(sizes) - set(self._nodes.values()) - (self._unstartable if fresh else set())
            )
            if self._nodes and fresh and not joined:
                return dict(self._nodes)
            self._discover()
            self._grow(sizes)
            self._checked_at = time.monotonic()
            return dict(self._nodes)

    def _discover(self) -> None:
        n = 0
        while True:
            name = self.name(n)
            try:
                self._handles.setdefault(name, ray.get_actor(name, NAMESPACE))
            except ValueError:
                break
            n += 1
        self._nodes = self._ping(list(self._handles))

    def _grow(self, sizes: dict[str, int]) -> None:
        """Start the actors each node lacks for its share. Actors that moved off a lost node
        count on the node they run on now, so survivors may hold more than their share."""
        have = Counter(self._nodes.values())
        started: dict[str, str] = {}  # actor name -> the node it was started for
        n = len(self._handles)
        for node, want in sizes.items():
            for _ in range(max(0, want - have[node])):
                name = self.name(n)
                n += 1
                self._handles[name] = self._start(name, node)
                started[name] = node
        self._unstartable = set()
        if not started:
            return
        try:
            self._nodes.update(self._ping(started, strict=True))
        except Unavailable:
            for name in started:
                ray.kill(self._handles.pop(name))
            self._unstartable = set(started.values())
            if not self._nodes:
                raise
            log.warning(
                "could not start %d shard pool actors; the pool goes on without them", len(started)
            )

    def _ping(self, names: Iterable[str], strict: bool = False) -> dict[str, str]:
        names = list(names)
        refs = [self._handles[n].ping.remote() for n in names]
        try:
            return dict(zip(names, ray.get(refs, timeout=self.start_timeout_s)))
        except (GetTimeoutError, RayActorError):
            if strict:
                raise Unavailable(
                    f"could not start the shard pool's actors within {self.start_timeout_s:.0f}s: "
                    f"the cluster has no room for them ({self.num_cpus} CPU each; see "
                    "VAULTVEC_SHARD_NUM_CPUS) or a node is down"
                ) from None
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            return {n: ray.get(r) for n, r in zip(names, refs) if r in ready}

    def _start(self, name: str, node: str | None) -> Any:
        strategy: Any = "SPREAD"
        if node is not None:
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
        options = PoolOptions(
            store_url=self.store_url,
            name=name,
            budget_bytes=self.budget_bytes or auto_budget(node, self.size_per_node),
            idle_ttl_s=self.idle_ttl_s,
            wal_max_records=self.wal_max_records,
            snapshot_chunk_bytes=self.snapshot_chunk_bytes,
            vector_dir=self.vector_dir,
            threads=self.threads,
        )
        return PoolActor.options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=self.num_cpus,
            max_restarts=-1,
            max_task_retries=3,
            max_concurrency=self.max_concurrency,
            scheduling_strategy=strategy,
            runtime_env={"env_vars": heap.SHARD_ENV},  # glibc reads them at process start
        ).remote(options)

    def surplus(self, members: dict[str, str]) -> set[str]:
        """The actors of ``members`` (actor -> node) beyond their node's share: the
        highest-numbered ones of a node (those that restarted there from a lost node, mostly).
        Partitions move off them (actors.control.rebalance) rather than crowd that node."""
        sizes = node_sizes(self.size_per_node)
        by_node: dict[str, list[str]] = {}
        for actor in sorted(members, key=lambda a: int(a[len(self.prefix) :])):
            by_node.setdefault(members[actor], []).append(actor)
        return {a for node, actors in by_node.items() for a in actors[sizes.get(node, 0) :]}

    def stop(self) -> None:
        """Kill every pool actor of this store (tests, tear-down)."""
        with self._lock:
            self._discover()
            for handle in self._handles.values():
                ray.kill(handle)
            self._handles.clear()
            self._nodes.clear()


def node_sizes(size_per_node: int) -> dict[str, int]:
    """Pool actors per live node with CPUs: ``size_per_node``, or one per CPU."""
    return {
        n["NodeID"]: size_per_node or max(1, int(n["Resources"]["CPU"]))
        for n in ray.nodes()
        if n.get("Alive") and n.get("Resources", {}).get("CPU", 0)
    }


def auto_budget(node: str | None, size_per_node: int) -> int:
    """A pool actor's memory budget when none is configured: its share of the memory Ray may
    schedule on its node (about 70% of what was free when the node started)."""
    for n in ray.nodes():
        if n.get("Alive") and (node is None or n["NodeID"] == node):
            res = n.get("Resources", {})
            per_node = size_per_node or max(1, int(res.get("CPU", 1)))
            return int(res.get("memory", 0) / per_node)
    return 0
