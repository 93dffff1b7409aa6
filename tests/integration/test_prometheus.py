"""GET /v1/metrics over real HTTP: the whole service's series after real traffic, the API key
rule (and VAULTVEC_METRICS_PUBLIC), index names only with VAULTVEC_METRICS_INDEX_LABELS, no
secret in any scrape, and the same series in Ray's per-node export."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.client import generate_key
from tests.integration.conftest import API_KEY, Service
from tests.integration.support import Index, Samples, create_index, error, parse, value

MARK = "zq9x7"  # in every secret below: found nowhere in a scrape
NAME = f"secretidx-{MARK}"
WRONG_KEY = f"wrong-api-key-{MARK}"
DIM = 8
N = 300
QUERIES = 12
PUBLIC_PREFIX = "/public"


@pytest.fixture(scope="module")
def traffic(http: httpx.Client, service: Service) -> Iterator[tuple[Index, list[str]]]:
    """An index named and filled with distinctive strings, queried every way, trained once; a
    refused request with a distinctive wrong key and one to a distinctive unknown path."""
    idx = create_index(http, name=NAME, key=generate_key(), dimension=DIM, n_shards=2)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, DIM)).astype(np.float32)
    ids = [f"itemid-{MARK}-{i}" for i in range(N)]
    metadata = [{f"mdkey-{MARK}": f"mdval-{MARK}-{i}", "n": i} for i in range(N)]
    contents = [f"contents-{MARK}-{i}" for i in range(N)]
    idx.upsert_arrays(ids, x, metadata, contents, batch=100)
    for q in range(QUERIES):
        idx.query(query_vectors=x[q].tolist(), top_k=5, include=["metadata", "contents"])
    idx.query(query_vectors=x[:3], top_k=5, filters={f"mdkey-{MARK}": f"mdval-{MARK}-1"})
    idx.get(ids[:3])
    idx.describe()
    idx.train(n_lists=4)
    idx.query(query_vectors=x[0].tolist(), top_k=5)
    secrets = [API_KEY, WRONG_KEY, NAME, idx.key, ids[0], f"mdkey-{MARK}", contents[0], MARK]
    with httpx.Client(base_url=service.url, timeout=60) as anon:
        error(
            anon.post("/v1/vectors/query", json=idx.body(), headers={"X-API-Key": WRONG_KEY}), 401
        )
        assert anon.get(f"/v1/{MARK}-unknown", headers={"X-API-Key": API_KEY}).status_code == 404
    yield idx, secrets
    idx.drop()


def scrape(client: httpx.Client, path: str = "/v1/metrics") -> tuple[str, Samples]:
    r = client.get(path)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"].startswith("text/plain")
    return r.text, parse(r.text)


def test_metrics_need_the_api_key(service: Service) -> None:
    with httpx.Client(base_url=service.url, timeout=60) as anon:
        error(anon.get("/v1/metrics"), 401)
        error(anon.get("/v1/metrics", headers={"X-API-Key": WRONG_KEY}), 401)


def test_scrape_holds_the_whole_service_after_traffic(http: httpx.Client, traffic: Any) -> None:
    _, s = scrape(http)
    q = "/v1/vectors/query"
    assert value(s, "vaultvec_requests_total", route=q, status="200") >= QUERIES + 2
    assert value(s, "vaultvec_requests_total", route="/v1/vectors/upsert", status="200") >= 3
    assert value(s, "vaultvec_requests_total", route=q, status="401") >= 1
    assert value(s, "vaultvec_requests_total", route="other", status="404") >= 1
    assert value(s, "vaultvec_request_duration_seconds_count", route=q) >= QUERIES + 2
    assert value(s, "vaultvec_request_duration_seconds_sum", route=q) > 0
    for stage in ("parse", "unlock", "plan", "search", "merge", "encode", "fetch"):
        n = value(s, "vaultvec_request_stage_seconds_count", route=q, stage=stage)
        assert n >= (QUERIES if stage == "fetch" else QUERIES + 2), stage
    assert (
        value(s, "vaultvec_request_stage_seconds_count", route=q, stage="search")
        <= value(s, "vaultvec_request_duration_seconds_count", route=q) * 2
    )  # once per search pass (a re-planned one adds up in the same observation)
    for stage in ("parse", "unlock", "write"):
        assert (
            value(
                s, "vaultvec_request_stage_seconds_count", route="/v1/vectors/upsert", stage=stage
            )
            >= 3
        )
    # Shards: each of the index's 2 partitions searched every query.
    assert value(s, "vaultvec_shard_search_seconds_count") >= 2 * (QUERIES + 2)
    assert {lab["shard"] for lab, _ in s["vaultvec_shard_search_seconds_count"]} >= {"0", "1"}
    assert value(s, "vaultvec_pool_calls_total", call="search") >= 2 * (QUERIES + 2)
    assert value(s, "vaultvec_pool_calls_total", call="upsert") >= 3
    assert value(s, "vaultvec_pool_actors") >= 1
    assert value(s, "vaultvec_pool_rss_bytes") > 50 << 20
    assert value(s, "vaultvec_pool_loaded_bytes") > 0
    assert value(s, "vaultvec_pool_budget_bytes") >= 0
    assert value(s, "vaultvec_pool_partitions", state="loaded") >= 2
    assert value(s, "vaultvec_pool_evictions_total") >= 0
    assert value(s, "vaultvec_pool_restarts_total") >= 0
    assert value(s, "vaultvec_pool_unreachable") == 0
    assert value(s, "vaultvec_gateway_replicas") >= 1
    # Per index, summed over the indexes (no index labels by default).
    assert value(s, "vaultvec_index_items") >= N
    assert value(s, "vaultvec_index_shards") >= 2
    assert value(s, "vaultvec_index_partitions_loaded") >= 2
    assert value(s, "vaultvec_index_wal_records") >= 0
    assert value(s, "vaultvec_indexes", state="unlocked") >= 1
    assert value(s, "vaultvec_index_trainings_total", outcome="success") >= 1
    assert value(s, "vaultvec_index_training_seconds_count") >= 1
    assert value(s, "vaultvec_index_training_seconds_sum") > 0
    assert not [lab for samples in s.values() for lab, _ in samples if "index" in lab]
    for _, v in s.get("vaultvec_index_recall_estimate", []):
        assert 0 <= v <= 1


def test_no_secret_in_a_scrape(http: httpx.Client, traffic: Any) -> None:
    text, _ = scrape(http)
    _, secrets = traffic
    for secret in secrets:
        assert secret not in text and secret.lower() not in text.lower(), secret[:24]


@pytest.fixture(scope="module")
def public(service: Service) -> Iterator[httpx.Client]:
    """A second Gateway on the same Ray (same control plane and pool) with the metrics public
    and index names as labels, under /public."""
    from ray import serve

    from serve_app.app import build_app
    from serve_app.settings import Settings

    settings = Settings(
        storage=f"file://{service.storage}",
        api_key=[API_KEY],
        metrics_public=True,
        metrics_index_labels=True,
    )
    serve.run(
        build_app(settings.model_dump(mode="json")),
        name="vaultvec-public-metrics",
        route_prefix=PUBLIC_PREFIX,
        blocking=False,
    )
    with httpx.Client(base_url=service.url + PUBLIC_PREFIX, timeout=60) as anon:
        deadline = time.monotonic() + 120
        while anon.get("/v1/health").status_code != 200:
            assert time.monotonic() < deadline, "the second app did not start"
            time.sleep(0.5)
        yield anon
    serve.delete("vaultvec-public-metrics")


def test_public_setting_serves_the_whole_service_by_index_name(
    public: httpx.Client, traffic: Any
) -> None:
    idx, _ = traffic
    # No key needed here; other routes still need it.
    error(public.post("/v1/vectors/query", json=idx.body(query_vectors=[0.0] * DIM)), 401)
    deadline = time.monotonic() + 60
    while True:  # the other gateway's report arrives within its push period
        _, s = scrape(public)
        queries = [
            v
            for lab, v in s.get("vaultvec_requests_total", [])
            if lab["route"] == "/v1/vectors/query"
        ]
        if sum(queries) >= QUERIES + 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sum(queries) >= QUERIES + 2, "the other gateway's requests are missing"
    assert value(s, "vaultvec_gateway_replicas") >= 2
    assert value(s, "vaultvec_index_items", index=NAME) == N
    assert value(s, "vaultvec_index_shards", index=NAME) == 2
    assert value(s, "vaultvec_index_unlocked", index=NAME) == 1
    assert value(s, "vaultvec_index_partitions_loaded", index=NAME) == 2
    assert value(s, "vaultvec_index_trainings_total", index=NAME, outcome="success") == 1
    assert value(s, "vaultvec_index_training_seconds_count", index=NAME) == 1
    text = public.get("/v1/metrics").text
    _, secrets = traffic
    for secret in secrets:
        if secret not in (NAME, MARK):  # the name is a label here, by the setting
            assert secret not in text, secret[:24]


def test_ray_export_carries_the_series(http: httpx.Client, traffic: Any) -> None:
    import ray

    port = ray._private.worker.global_worker.node.metrics_export_port
    deadline = time.monotonic() + 90
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        names = {f.name for f in text_string_to_metric_families(text)}
        wanted = {
            "ray_vaultvec_requests",
            "ray_vaultvec_request_stage_seconds",
            "ray_vaultvec_pool_calls",
            "ray_vaultvec_shard_search_seconds",
            "ray_vaultvec_index_items",
        }
        if wanted <= names or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert wanted <= names, wanted - names
    assert MARK not in text and "index_id" not in text
