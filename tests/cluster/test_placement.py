"""Shards and gateway replicas spread over the nodes; shard counts follow the cluster size."""

from __future__ import annotations

import httpx
import pytest
import ray

from actors.errors import IndexRetired
from actors.types import Partition
from tests.cluster.support import (
    RayCluster,
    create,
    gateways,
    index_id_of,
    partition_actors,
)
from tests.integration.support import ok


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0))


def test_default_shard_count_is_one_per_node_and_partitions_land_on_distinct_nodes(
    http: httpx.Client, ray_cluster: RayCluster
) -> None:
    nodes = alive_nodes()
    assert nodes == 3
    idx = create(http, seed_items=60)
    placed = partition_actors(idx.name)
    assert len(placed) == nodes
    assert len({a.name for a in placed.values()}) == nodes  # distinct pool actors
    assert len({a.node_id for a in placed.values()}) == nodes, placed
    assert idx.count() == 60
    idx.drop()


def test_shard_count_is_configurable_per_index(http: httpx.Client) -> None:
    idx = create(http, n_shards=5, seed_items=100)
    index_id = index_id_of(idx.name)
    placed = partition_actors(idx.name)
    assert len(placed) == 5
    assert len({a.node_id for a in placed.values()}) == 3  # spread over every node
    assert idx.count() == 100
    assert sorted(idx.list_ids()) == sorted(f"s{i}" for i in range(100))
    hosts = {s: ray.get_actor(a.name, namespace="vaultvec") for s, a in placed.items()}
    idx.drop()
    for s, host in hosts.items():  # the pool actors stay; the partitions are refused
        with pytest.raises(IndexRetired):
            try:
                ray.get(host.stats.remote(Partition(idx.name, index_id, s), bytes(32), False))
            except ray.exceptions.RayTaskError as exc:
                raise exc.cause from None


def test_invalid_shard_count_is_a_422(http: httpx.Client) -> None:
    for bad in (0, -1, 257):
        r = http.post(
            "/v1/indexes/create",
            json={"index_name": "bad-shards", "index_key": "00" * 32, "n_shards": bad},
        )
        assert r.status_code == 422, r.text
        assert "n_shards" in r.text


def test_gateway_replicas_run_on_different_nodes(ray_cluster: RayCluster) -> None:
    replicas = gateways()
    assert len(replicas) == 2
    assert len({g.node_id for g in replicas}) == 2
    ok(httpx.get(f"{ray_cluster.url}/v1/health"))
