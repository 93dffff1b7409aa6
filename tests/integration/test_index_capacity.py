"""A user can keep several indexes in use at once on a small machine."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.support import create_index

INDEXES = 8


def test_eight_indexes_in_use_at_once(service, http):
    made = []
    try:
        for i in range(INDEXES):
            idx = create_index(http, dimension=2)
            made.append(idx)
            try:
                r = http.post(
                    "/v1/vectors/upsert",
                    json=idx.body(items=[{"id": "a", "vector": [float(i), 1.0]}]),
                    timeout=15,
                )
            except httpx.TimeoutException:
                pytest.fail(f"upsert into index #{i + 1} hung for 15 s")
            assert r.status_code == 200, r.text
        for i, idx in enumerate(made):
            assert idx.query(query_vectors=[float(i), 1.0], top_k=1)[0]["id"] == "a"
    finally:
        for idx in made:
            idx.drop()


def test_shards_that_cannot_be_placed_are_a_clear_503(service, tmp_path):
    """An index whose shards find no room fails fast with 503 and leaves nothing behind."""
    from actors.control import ControlPlane, EngineOptions, new_index_id
    from actors.crypto import derive_keys, new_salt
    from actors.errors import Unavailable
    from actors.types import IndexConfig, IndexMeta

    control = ControlPlane(
        EngineOptions(store_url=f"file://{tmp_path}", shard_num_cpus=64, shard_start_timeout_s=3)
    )
    salt = new_salt()
    keys = derive_keys(bytes(32), "too-big", salt)
    meta = IndexMeta("too-big", new_index_id(), salt, keys.verifier)
    cfg = IndexConfig("too-big", meta.index_id, "ivfflat", "euclidean", n_shards=2)
    with pytest.raises(Unavailable, match="could not start the 2 shards"):
        control.create_index(meta, keys.data_key, cfg)
    assert control.list_indexes() == []
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_index_count_is_capped_by_a_named_limit(service, tmp_path):
    """Past VAULTVEC_MAX_INDEXES a create is a 422 naming the limit, and nothing is stored."""
    from actors.control import ControlPlane, EngineOptions, new_index_id
    from actors.crypto import derive_keys, new_salt
    from actors.errors import InvalidRequest
    from actors.types import IndexConfig, IndexMeta

    control = ControlPlane(EngineOptions(store_url=f"file://{tmp_path}", max_indexes=1))

    def create(name: str) -> None:
        salt = new_salt()
        keys = derive_keys(bytes(32), name, salt)
        meta = IndexMeta(name, new_index_id(), salt, keys.verifier)
        control.create_index(
            meta, keys.data_key, IndexConfig(name, meta.index_id, "ivfflat", "euclidean", 1)
        )

    create("first")
    stored = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(InvalidRequest, match="VAULTVEC_MAX_INDEXES=1"):
        create("second")
    assert control.list_indexes() == ["first"]
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == stored
    control.delete_index(
        "first", derive_keys(bytes(32), "first", control.lookup("first").salt).data_key
    )
