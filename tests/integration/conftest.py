"""One local Ray + Serve per test session, serving vaultvec over real HTTP on a free port."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-api-key"
AUTO_TRAIN_THRESHOLD = 2_000


@dataclass(frozen=True)
class Service:
    url: str
    storage: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from cluster import runtime
    from cluster.settings import Settings

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    storage = tmp_path_factory.mktemp("store")
    settings = Settings(
        storage=f"file://{storage}",
        port=free_port(),
        api_key=[API_KEY, "second-key"],
        auto_train_threshold=AUTO_TRAIN_THRESHOLD,
        wal_max_records=16,
        max_body_bytes=8 << 20,
    )
    url = runtime.start(settings)
    yield Service(url, storage)
    runtime.stop()


@pytest.fixture()
def client(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=300) as c:
        yield c
