"""Many indexes on a small machine: their partitions share the shard pool, so creating one
starts no process; the pool that cannot start is a clear 503; the index count has a named cap."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from tests.integration.support import create_index

INDEXES = 120


def pool_actors() -> list[str]:
    """Names of the live shard pool actors (of every service's store)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in named if a["name"].startswith("vaultvec-pool-"))


def test_many_indexes_in_use_at_once_start_no_process(service, http):
    made = []
    try:
        first = create_index(http, dimension=2)
        made.append(first)
        before = pool_actors()
        for _ in range(1, INDEXES):
            made.append(create_index(http, dimension=2))
        for i, idx in enumerate(made):
            r = http.post(
                "/v1/vectors/upsert",
                json=idx.body(items=[{"id": "a", "vector": [float(i), 1.0]}]),
            )
            assert r.status_code == 200, r.text
        for i, idx in enumerate(made):
            assert idx.query(query_vectors=[float(i), 1.0], top_k=1)[0]["id"] == "a"
        assert pool_actors() == before  # the partitions went to the running pool
    finally:
        for idx in made:
            idx.drop()


def engine_options(tmp_path, **kw):
    from actors.control.options import EngineOptions

    return EngineOptions(store_url=f"file://{tmp_path}", **kw)


def new_index(control, name: str) -> None:
    from actors.control.options import new_index_id
    from actors.storage.crypto import derive_keys, new_salt
    from actors.types import IndexConfig, IndexMeta

    salt = new_salt()
    keys = derive_keys(bytes(32), name, salt)
    meta = IndexMeta(name, new_index_id(), salt, keys.verifier)
    control.create_index(
        meta, keys.data_key, IndexConfig(name, meta.index_id, "ivfflat", "euclidean", 2)
    )


def test_a_pool_that_cannot_start_is_a_clear_503(service, tmp_path):
    """A pool actor Ray cannot place fails the create fast with 503, leaves no actor waiting
    for room and stores nothing."""
    from actors.control.plane import ControlPlane
    from actors.errors import Unavailable

    control = ControlPlane(engine_options(tmp_path, shard_num_cpus=64, shard_start_timeout_s=3))
    with pytest.raises(Unavailable, match="could not start the shard pool's actors"):
        new_index(control, "too-big")
    assert control.list_indexes() == []
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
    assert not [a for a in pool_actors() if a.startswith(control.pool.prefix)]


def test_index_count_is_capped_by_a_named_limit(service, tmp_path):
    """Past VAULTVEC_MAX_INDEXES a create is a 422 naming the limit, and nothing is stored."""
    from actors.control.plane import ControlPlane
    from actors.errors import InvalidRequest
    from actors.storage.crypto import derive_keys

    control = ControlPlane(engine_options(tmp_path, max_indexes=1))
    try:
        new_index(control, "first")
        stored = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        with pytest.raises(InvalidRequest, match="VAULTVEC_MAX_INDEXES=1"):
            new_index(control, "second")
        assert control.list_indexes() == ["first"]
        assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == stored
        salt = control.lookup("first").salt
        control.delete_index("first", derive_keys(bytes(32), "first", salt).data_key)
        assert control.list_indexes() == []
    finally:
        control.stop_pool()


def test_describe_shows_where_the_partitions_live_and_what_they_hold(service, http):
    idx = create_index(http, dimension=8, n_shards=2)
    try:
        items = [
            {"id": f"v{i}", "vector": [float(i)] * 8, "metadata": {"i": i}} for i in range(200)
        ]
        assert http.post("/v1/vectors/upsert", json=idx.body(items=items)).status_code == 200
        memory = idx.describe()["memory"]
        parts = memory["partitions"]
        assert [p["shard"] for p in parts] == [0, 1]
        assert len({p["pool_actor"] for p in parts}) == 2  # distinct pool actors
        assert all(p["pool_actor"] in pool_actors() for p in parts)
        raw = 200 * 8 * 4
        assert raw <= memory["resident_bytes"] == sum(p["resident_bytes"] for p in parts)
        assert memory["idle_ttl_s"] == 0.0
    finally:
        idx.drop()


def test_describe_tells_a_key_holder_nothing_of_other_indexes(service, http):
    """describe reports the index's own partitions only: another index loading data on the same
    pool actors changes nothing in it (the actors' own figures moved with every index they
    host, so one key holder could watch the others' activity)."""
    mine = create_index(http, dimension=8, n_shards=2)
    other = create_index(http, dimension=64, n_shards=2)
    try:
        items = [{"id": f"v{i}", "vector": [float(i)] * 8} for i in range(50)]
        assert http.post("/v1/vectors/upsert", json=mine.body(items=items)).status_code == 200
        before = mine.describe()
        rng = np.random.default_rng(0)
        for start in range(0, 20_000, 5_000):  # ~5 MB in the other index, same actors
            batch = [
                {"id": f"o{start + i}", "vector": row.tolist()}
                for i, row in enumerate(rng.normal(size=(5_000, 64)).astype(np.float32))
            ]
            assert http.post("/v1/vectors/upsert", json=other.body(items=batch)).status_code == 200
        after = mine.describe()
        assert after["memory"] == before["memory"]
        assert {k for p in after["memory"]["partitions"] for k in p} == {
            "shard",
            "pool_actor",
            "resident_bytes",
        }
    finally:
        mine.drop()
        other.drop()
