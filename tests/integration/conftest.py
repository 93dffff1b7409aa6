"""One local Ray + Serve per test session, serving vaultvec over real HTTP on a free port."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, ray_tmpdir
from tests.integration.support import Index, create_index

API_KEY = "test-api-key"
AUTO_TRAIN_THRESHOLD = 2_000
BODY_IDLE_TIMEOUT_S = 2.0  # short, so the slow-client test cuts its clients off quickly


@dataclass(frozen=True)
class Service:
    url: str
    storage: Path


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from cluster import runtime
    from serve_app.settings import Settings

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    storage = tmp_path_factory.mktemp("store")
    settings = Settings(
        storage=f"file://{storage}",
        port=free_port(),
        api_key=[API_KEY, "second-key"],
        auto_train_threshold=AUTO_TRAIN_THRESHOLD,
        wal_max_records=16,
        max_body_bytes=8 << 20,
        body_idle_timeout_s=BODY_IDLE_TIMEOUT_S,
        ray_metrics_export=True,  # tests/integration/test_prometheus.py reads Ray's export
    )
    with ray_tmpdir("vvi"):
        url = runtime.start(settings)
        yield Service(url, storage)
        runtime.stop(joined=False)


@pytest.fixture()
def client(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=300) as c:
        yield c


@pytest.fixture(scope="session")
def http(service: Service) -> Iterator[httpx.Client]:
    """One authenticated client shared by module-scoped fixtures."""
    with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=120) as c:
        yield c


@pytest.fixture()
def make_index(http: httpx.Client) -> Iterator[Callable[..., Index]]:
    """Factory of fresh indexes (unique name, random key); every one is deleted afterwards.

    Each index holds shard actors that reserve CPU, so tests keep only a few alive at a time.
    """
    made: list[Index] = []

    def make(**kwargs: Any) -> Index:
        idx = create_index(http, **kwargs)
        made.append(idx)
        return idx

    yield make
    for idx in made:
        idx.drop()
