"""Each process runs with its own allocator settings (actors.process.heap): a gateway keeps its heap top
for the next request, a shard returns it, as its resident memory is its memory budget.

Ray actors inherit the environment of the actor that creates them, and shards are created by
the control plane, which a gateway creates: without their own setting, shards ran with the
gateway's 64 MiB trim threshold and held 902 resident bytes per vector after an ingest instead
of 744 (benchmarks/bench_service.py, 100k x 128).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.process import heap
from tests.integration.support import Index


def processes(title: str) -> dict[int, dict[str, str]]:
    """pid -> environment of this machine's processes whose command line starts with title."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if cmd.startswith(title.encode()):
            pairs = (kv.split("=", 1) for kv in env.decode("utf-8", "replace").split("\0"))
            found[int(entry.name)] = dict(kv for kv in pairs if len(kv) == 2)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_shards_return_their_heap_top_and_gateways_keep_theirs(
    make_index: Callable[..., Index],
) -> None:
    idx = make_index(dimension=4)
    idx.upsert([{"id": "a", "vector": [0.0, 1.0, 2.0, 3.0]}])  # the shards are up
    shards = processes("ray::Shard")
    gateways = {
        pid: env
        for pid, env in processes("ray::ServeReplica:").items()
        if "MALLOC_ARENA_MAX" in env  # the gateway, not the embedder
    }
    assert shards and gateways
    for env in shards.values():
        assert {k: env.get(k) for k in heap.SHARD_ENV} == heap.SHARD_ENV
    for env in gateways.values():
        assert {k: env.get(k) for k in heap.GATEWAY_ENV} == heap.GATEWAY_ENV
    assert heap.GATEWAY_ENV["MALLOC_TRIM_THRESHOLD_"] != heap.ENV["MALLOC_TRIM_THRESHOLD_"]
