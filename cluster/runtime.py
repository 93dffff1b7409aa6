"""Starting or joining Ray + Serve and running the vaultvec app on it."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from actors.control import NAMESPACE
from serve_app.app import build_app
from serve_app.settings import Settings

APP_NAME = "vaultvec"
KEY_FILE = "api-key"


def local_data_dir(settings: Settings) -> Path | None:
    if settings.storage.startswith("file://"):
        return Path(settings.storage.removeprefix("file://"))
    return None


def ensure_api_key(settings: Settings) -> tuple[Settings, str | None]:
    """Use the configured keys; else load or create one in the data directory (mode 0600).

    Returns the settings with keys filled in and the generated key (None if none was generated).
    """
    if settings.api_key:
        return settings, None
    data_dir = local_data_dir(settings)
    if data_dir is None:
        raise SystemExit(
            "no API key configured: set VAULTVEC_API_KEY or VAULTVEC_API_KEY_FILE, or pass "
            "--api-key-file"
        )
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / KEY_FILE
    created = None
    if path.exists():
        key = path.read_text().strip()
    else:
        key = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        created = key
    return settings.model_copy(update={"api_key": [key]}), created


def joins_cluster(settings: Settings) -> bool:
    return bool(settings.ray_address or os.environ.get("RAY_ADDRESS"))


def start(settings: Settings) -> str:
    """Start (or join) Ray, start Serve on host:port, deploy the app; returns the base URL."""
    if not ray.is_initialized():
        address = settings.ray_address or os.environ.get("RAY_ADDRESS")
        with contextlib.nullcontext() if settings.local_ray_monitors else without_monitors():
            ray.init(
                address=address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False
            )
    serve.start(
        http_options={
            "host": settings.host,
            "port": settings.port,
            "request_timeout_s": settings.http_request_timeout_s,
            "keep_alive_timeout_s": settings.http_keep_alive_timeout_s,
        }
    )
    serve.run(
        build_app(settings.model_dump(mode="json")), name=APP_NAME, route_prefix="/", blocking=False
    )
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"http://{host}:{settings.port}"
    wait_healthy(url)
    return url


@contextlib.contextmanager
def without_monitors() -> Iterator[None]:
    """While ``ray.init`` starts a local head node: without Ray's autoscaler monitor and log
    monitor, two idle Python daemons (docs/performance.md, Footprint) that a local vaultvec
    does not use. The monitor only reports to ``ray status`` and would add nodes from
    an autoscaling config, which a local Ray has none of; the log monitor streams the workers'
    logs to drivers, and the driver here asks for none (``log_to_driver=False``: they stay in
    the session's log files). ``ray.init`` has no parameter for either, so the head's
    parameters are set on their way to Ray's node (``RayParams.no_monitor`` and
    ``include_log_monitor``, the flags of ``ray start``); joining a cluster is unaffected."""
    from ray._private import node

    original = node.Node.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        params = kwargs.get("ray_params", args[0] if args else None)
        if kwargs.get("head") and params is not None:
            params.no_monitor = True
            params.include_log_monitor = False
        original(self, *args, **kwargs)

    node.Node.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        node.Node.__init__ = original  # type: ignore[method-assign]


def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"vaultvec did not become healthy at {url} within {timeout_s:.0f}s")
        time.sleep(0.2)


def stop(joined: bool = False) -> None:
    """Take the app down. A local Ray started by ``start`` goes down whole (Serve, shards and
    all: the data is durable in the store); on a joined cluster only the app is deleted."""
    try:
        if joined:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
