"""The gateway's same-node channel to the shard pool (actors.pool.channel) in the running service:
queries and gets of an index whose partitions sit on the gateway's node go over the pool
actors' sockets, and a pool actor killed mid-load costs no wrong answer: the calls its socket
can no longer take go through Ray, and the restarted actor's new socket is used again."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from tests.cluster.support import partition_actors, wait_until
from tests.helpers import clustered
from tests.integration.support import Index

N = 300


def socket_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"vaultvec-{os.getuid()}"


def connected(pid: int) -> bool:
    """Whether a connection to the pool actor ``pid``'s socket is open (Linux /proc/net/unix:
    the server's end of an accepted connection names the socket's path; state 03, connected)."""
    prefix = str(socket_dir() / f"pool-{pid}-")
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(prefix) and fields[5] == "03":
            return True
    return False


def check(idx: Index, x: np.ndarray, i: int) -> None:
    got = idx.query(query_vectors=x[i], top_k=5, n_probes=4)
    assert got[0]["id"] == f"v{i}", got[:2]
    items = idx.get([f"v{i}"], include=["vector"])
    assert np.allclose(items[0]["vector"], x[i], atol=1e-5)


def test_queries_and_gets_use_the_pool_actors_sockets_and_survive_a_killed_actor(
    make_index: Callable[..., Index], http: httpx.Client
) -> None:
    x = clustered(N, 16, seed=21)
    idx = make_index(dimension=16, n_shards=2)
    idx.upsert_arrays([f"v{i}" for i in range(N)], x)
    for i in range(10):
        check(idx, x, i)
    hosts = partition_actors(idx.name)
    assert len(hosts) == 2
    for actor in hosts.values():  # both partitions' actors: socket up, gateway connected
        assert list(socket_dir().glob(f"pool-{actor.pid}-*.sock")), actor
        assert connected(actor.pid), actor

    victim = hosts[0]
    os.kill(victim.pid, signal.SIGKILL)
    answered = failed = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # sequential load through the restart: right or 503
        i = answered % N
        r = idx.post("vectors/query", query_vectors=x[i].tolist(), top_k=5, n_probes=4)
        if r.status_code == 200:
            assert r.json()["results"][0]["id"] == f"v{i}"
            answered += 1
        else:
            assert r.status_code == 503, r.text
            failed += 1
        restarted = partition_actors(idx.name).get(0)
        if restarted is not None and restarted.pid not in (0, victim.pid) and answered > 20:
            break
    new = partition_actors(idx.name)[0]
    assert new.pid != victim.pid, "the pool actor did not restart"

    def reconnected() -> bool:
        check(idx, x, 7)
        return connected(new.pid)

    wait_until(reconnected, 10, "the gateway on the restarted actor's socket")
    for i in range(10, 20):
        check(idx, x, i)
    # the killed actor's socket was removed by the one that replaced it
    assert not list(socket_dir().glob(f"pool-{victim.pid}-*.sock"))
