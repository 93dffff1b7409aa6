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

from actors.control.plane import NAMESPACE
from actors.pool import channel
from actors.process import private
from cluster import fastpath, haproxy_guard
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
        if address:
            ray.init(
                address=address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False
            )
        else:
            start_local_ray(settings)
    tls = settings.tls_options()
    serve.start(
        http_options={
            "host": settings.host,
            "port": settings.port,
            "request_timeout_s": settings.http_request_timeout_s,
            "keep_alive_timeout_s": settings.http_keep_alive_timeout_s,
            # Serve's own proxy serves HTTPS itself; under the fast path HAProxy does
            # (cluster.haproxy_guard), and the replicas behind it speak plain HTTP on the node.
            **({} if fastpath.haproxy_on() else tls),
        }
    )
    serve.run(
        build_app(settings.model_dump(mode="json")), name=APP_NAME, route_prefix="/", blocking=False
    )
    url = settings.url()
    wait_healthy(url)
    return url


def start_local_ray(settings: Settings, **init: Any) -> None:
    """A Ray of this machine only, for this service (docs/security.md, On the machine): every
    port it opens on loopback (Ray binds them there when its node address is 127.0.0.1), its
    files (sockets, logs, the object store's spill files) in the private runtime directory
    unless RAY_TMPDIR says otherwise, its token in a private file made for it, and no process
    that would answer without the token (Ray's Prometheus exporters: off unless
    ``ray_metrics_export`` asks for them)."""
    runtime = private.claim()
    temp_dir = os.environ.get("RAY_TMPDIR") or os.path.join(runtime, "ray")
    os.environ.update(LOOPBACK)
    # HAProxy's guard reads the certificate's paths from the environment it inherits
    # (cluster.haproxy_guard); on a cluster you start, each node's environment has them.
    os.environ.update(settings.tls_env())
    # Ray turns its token on for a new local cluster unless RAY_AUTH_MODE says otherwise (and
    # reads that mode when it is imported: it is not set here); the token is ours, private.
    if os.environ.get(AUTH_MODE, "token") == "token" and not (
        {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)
    ):
        os.environ["RAY_AUTH_TOKEN_PATH"] = ray_token(runtime)
    with local_head(monitors=settings.local_ray_monitors, metrics=settings.ray_metrics_export):
        ray.init(
            address="local",  # a Ray of its own, never one that runs on the machine already
            namespace=NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=temp_dir,
            _system_config=(
                {} if settings.ray_metrics_export else {"enable_metrics_collection": False}
            ),
            **init,
        )
    # For `vaultvec bulk-query --transport ray` on this machine (join_local): where to join.
    haproxy_guard.write_private(
        os.path.join(runtime, ADDRESS_FILE), ray.get_runtime_context().gcs_address.encode()
    )


ADDRESS_FILE = "ray-address"


def forget_local_ray(address: str | None) -> None:
    """After the local Ray at ``address`` has ended: the file naming it (unless another
    service of this user has written its own there since) and the sockets of the shard pool
    actors it ended without a word."""
    runtime = private.runtime_directory()
    if runtime is None:
        return
    path = os.path.join(runtime, ADDRESS_FILE)
    with contextlib.suppress(OSError):
        with open(path) as f:
            ours = f.read().strip() == address
        if ours:
            os.unlink(path)
    channel.remove_stale(runtime)


def join(address: str | None) -> None:
    """Join a running service's Ray cluster as a driver (the bulk driver's Ray transport):
    ``address``, else $RAY_ADDRESS, else the local Ray of a `vaultvec serve` of this user on
    this machine (its runtime directory names its address and holds its token), else Ray's own
    ``auto`` look-up."""
    address = address or os.environ.get("RAY_ADDRESS")
    runtime = private.runtime_directory()
    local = None if runtime is None else os.path.join(runtime, ADDRESS_FILE)
    if address in (None, "auto") and local is not None and os.path.exists(local):
        with open(local) as f:
            address = f.read().strip()
        token = os.path.join(runtime or "", TOKEN_FILE)
        if os.path.exists(token) and not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(
            os.environ
        ):
            os.environ["RAY_AUTH_TOKEN_PATH"] = token
            if AUTH_MODE not in os.environ:  # Ray read the mode when it was imported
                from ray._private.authentication import authentication_token_setup

                authentication_token_setup._enable_token_auth()
        os.environ.update(LOOPBACK)
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # this driver's own ports on loopback too
    ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False)


# Ray binds its ports (GCS, raylet, workers, agents) to loopback when the node's address is
# 127.0.0.1, which it picks for a local node when this is off (Ray's switch for laptops;
# ray._private.services.get_node_ip_address). A local Ray has no other node to be reached by.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_FILE = "ray-auth-token"


def ray_token(runtime: str) -> str:
    """A file holding a random Ray token, readable by this user only (Ray's own, generated into
    ~/.ray/auth_token, is readable by every local user who may enter the home directory)."""
    path = os.path.join(runtime, TOKEN_FILE)
    if not os.path.exists(path):
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
    return path


@contextlib.contextmanager
def local_head(monitors: bool = False, metrics: bool = False) -> Iterator[None]:
    """While ``ray.init`` starts a local head node: without the processes a local vaultvec does
    not use (docs/performance.md, Footprint; docs/security.md, On the machine). ``ray.init`` has
    no parameter for them, so they are left out on their way to Ray's node:

    - unless ``monitors``: Ray's autoscaler monitor (it only reports to ``ray status`` and
      would add nodes from an autoscaling config, which a local Ray has none of) and log
      monitor (it streams the workers' logs to drivers, and the driver here asks for none):
      ``RayParams.no_monitor`` and ``include_log_monitor``, the flags of ``ray start``;
    - the dashboard's head process: with ``include_dashboard=False`` it runs only Ray's usage
      statistics, and its Prometheus exporter answers anyone on its port;
    - unless ``metrics``: the metrics export of the node's dashboard agent (the agent's
      ``--disable-metrics-collection``), a Prometheus exporter that answers anyone.

    Joining a cluster is unaffected."""
    from ray._private import node, ray_constants, services

    init, api_server, start_process = (
        node.Node.__init__,
        node.Node.start_api_server,
        services.start_ray_process,
    )

    def head_init(self: Any, *args: Any, **kwargs: Any) -> None:
        params = kwargs.get("ray_params", args[0] if args else None)
        if kwargs.get("head") and params is not None and not monitors:
            params.no_monitor = True
            params.include_log_monitor = False
        init(self, *args, **kwargs)

    def no_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        if include_dashboard is not False:
            api_server(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
            return
        self._webui_url = None

    def start(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET and not metrics:
            command = [
                f"{c} --disable-metrics-collection" if c.startswith(AGENT_COMMAND) else c
                for c in command
            ]
        return start_process(command, process_type, *args, **kwargs)

    cluster = ray_constants.ENABLE_RAY_CLUSTER
    node.Node.__init__ = head_init  # type: ignore[method-assign]
    node.Node.start_api_server = no_api_server  # type: ignore[method-assign]
    services.start_ray_process = start
    # Read from LOOPBACK when ray was imported: already imported here.
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        node.Node.__init__ = init  # type: ignore[method-assign]
        node.Node.start_api_server = api_server  # type: ignore[method-assign]
        services.start_ray_process = start_process
        ray_constants.ENABLE_RAY_CLUSTER = cluster


AGENT_COMMAND = "--dashboard_agent_command="


def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    """Until ``url`` (this machine's service) answers its health check. Over HTTPS the
    certificate is not checked: it may name another host than the address polled, and the
    check sends nothing secret."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2.0, verify=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"vaultvec did not become healthy at {url} within {timeout_s:.0f}s")
        time.sleep(0.2)


def stop(joined: bool = False) -> None:
    """Take the app down. A local Ray started by ``start`` goes down whole (Serve, shards and
    all: the data is durable in the store); on a joined cluster only the app is deleted."""
    node_id = address = None
    if not joined and ray.is_initialized():
        with contextlib.suppress(Exception):  # nothing to tidy is no reason not to shut down
            context = ray.get_runtime_context()
            node_id, address = context.get_node_id(), context.gcs_address
    try:
        if joined:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
        if node_id is not None:  # what its processes left in the runtime directory
            fastpath.forget_node(node_id)
            forget_local_ray(address)
