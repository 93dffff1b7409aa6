"""A vaultvec server for the SDK compatibility suite.

The server is started like the integration suite's (one local Ray + Serve, real HTTP on a free
port) but package-scoped, as in tests/cluster: it is torn down before the integration tests
start their own Ray in the same pytest process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers import free_port, ray_tmpdir
from tests.integration.conftest import API_KEY, Service


@pytest.fixture(scope="package")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from cluster import runtime
    from serve_app.settings import Settings

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    storage = tmp_path_factory.mktemp("compat-store")
    settings = Settings(
        storage=f"file://{storage}",
        port=free_port(),
        api_key=[API_KEY],
        # The driver trains explicitly; its few hundred vectors must not auto-train.
        auto_train_threshold=1_000_000,
    )
    with ray_tmpdir("vvk"):
        url = runtime.start(settings)
        yield Service(url, storage)
        from ray import serve

        serve.shutdown()
        runtime.stop(joined=False)
