"""Bulk data crosses Ray inside its calls, not through its object store. The store keeps every
page of its shared memory that an object once used, after the object is gone: an ingest and a
training that passed through it left the service that much larger for good (docs/performance.md,
Footprint)."""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import ray
from ray._private.internal_api import node_stats

from actors.constants import CALL_BYTES
from tests.helpers import clustered
from tests.integration.support import Index, ok


def created_bytes() -> int:
    """Bytes of every object ever created in the cluster's object stores."""
    total = 0
    for node in ray.nodes():
        if node["Alive"]:
            reply = node_stats(
                node["NodeManagerAddress"], node["NodeManagerPort"], include_memory_info=False
            )
            total += reply.store_stats.cumulative_created_bytes
    return total


def test_an_ingest_and_its_training_leave_the_object_store_alone(
    make_index: Callable[..., Index],
) -> None:
    n, d, per_request = 8_000, 128, 4_000  # 2 MB of vectors per request, all in one shard
    x = clustered(n, d, seed=31)
    idx = make_index(dimension=d, n_shards=1)
    before = created_bytes()
    for start in range(0, n, per_request):
        part = x[start : start + per_request]
        ok(
            idx.post(
                "vectors/upsert_arrays",
                ids=[f"s{i}" for i in range(start, start + len(part))],
                vectors=base64.b64encode(part.astype("<f4").tobytes()).decode(),
                shape=list(part.shape),
                metadata=[{"n": i} for i in range(start, start + len(part))],
            )
        )
    assert idx.train(n_lists=16)["status"] == "success"  # its sample is every vector: 4 MB
    created = created_bytes() - before
    assert created < CALL_BYTES, f"{created:,} bytes went through Ray's object store"
    # and everything arrived
    assert idx.count() == n
    got = idx.get([f"s{i}" for i in (0, 3_999, 4_000, n - 1)], include=["vector", "metadata"])
    assert [g["metadata"]["n"] for g in got] == [0, 3_999, 4_000, n - 1]
    np.testing.assert_array_equal(
        np.asarray([g["vector"] for g in got], np.float32), x[[0, 3_999, 4_000, n - 1]]
    )
