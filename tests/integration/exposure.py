"""What a running service exposes on its machine, and what another local user can reach of it.

:func:`inventory` (as the service's user) lists everything a process tree holds open to others:
its TCP listeners and bound UDP sockets (from /proc/net and the tree's file descriptors), its
Unix sockets (path-named and abstract), and the files and directories under the given roots.
:func:`probe` then runs a child process that drops to another uid (``nobody``) after its imports
and tries each: opens files, lists directories, connects to Unix sockets, and speaks HTTP and
gRPC (without any credential) to every TCP port. :func:`reachable` reads the answers: what the
other user could read, use or get an answer with data from.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]

# Real methods of Ray's gRPC services (an unknown method is answered UNIMPLEMENTED before any
# authentication, so it proves nothing): each server implements one of them.
GRPC_METHODS = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
    "/ray.rpc.ReporterService/ReportOCMetrics",
    "/ray.rpc.MetricsAgentService/HealthCheck",
    "/ray.serve.ASGIService/HandleRequest",
)
HTTP_PATHS = ("/", "/metrics", "/stats", "/v1/indexes/list", "/api/version", "/-/routes")


@dataclass
class Listener:
    proto: str  # tcp, tcp6, udp, udp6
    address: str
    port: int
    pid: int
    process: str

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


@dataclass
class Inventory:
    listeners: list[Listener] = field(default_factory=list)
    unix_sockets: list[str] = field(default_factory=list)  # paths; "@name" for abstract ones
    paths: list[str] = field(default_factory=list)  # files and directories


# -- the service's side ------------------------------------------------------------------------
def process_tree(root: int) -> dict[int, str]:
    """pid -> name of ``root`` and all its descendants."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        parents[int(entry)] = int(rest.split()[1])
        names[int(entry)] = name
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: names.get(pid, "?") for pid in tree}


def socket_inodes(pids: Iterable[int]) -> dict[int, int]:
    """socket inode -> pid holding it."""
    found: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found[int(target[8:-1])] = pid
    return found


def _address(hexaddr: str, v6: bool) -> tuple[str, int]:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if v6:  # four little-endian 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return str(ipaddress.IPv6Address(raw)), int(port, 16)
    return str(ipaddress.IPv4Address(raw[::-1])), int(port, 16)


def inventory(root_pid: int, roots: Iterable[Path]) -> Inventory:
    tree = process_tree(root_pid)
    inodes = socket_inodes(tree)
    inv = Inventory()
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        for line in lines:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], int(cols[9])
            if inode not in inodes:
                continue
            listening = state == "0A" if proto.startswith("tcp") else remote.endswith(":0000")
            if not listening:
                continue
            address, port = _address(local, proto.endswith("6"))
            pid = inodes[inode]
            inv.listeners.append(Listener(proto, address, port, pid, tree[pid]))
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and int(cols[6]) in inodes and cols[7] not in inv.unix_sockets:
            inv.unix_sockets.append(cols[7])  # abstract ones start with "@"
    for top in roots:
        if not top.exists():
            continue
        inv.paths.append(str(top))
        for dirpath, dirnames, filenames in os.walk(top):
            inv.paths.extend(os.path.join(dirpath, n) for n in (*dirnames, *filenames))
    return inv


# -- the other user's side ---------------------------------------------------------------------
def probe(inv: Inventory, uid: int = NOBODY) -> dict[str, Any]:
    """Every item of ``inv`` tried as ``uid`` (the caller must be root): what it got."""
    targets = {
        "paths": inv.paths,
        "unix": inv.unix_sockets,
        "tcp": sorted(
            {(lst.address, lst.port) for lst in inv.listeners if lst.proto.startswith("tcp")}
        ),
    }
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.exposure", str(uid)],
        input=json.dumps(targets),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    assert os.getuid() == os.geteuid() == uid


def _try_path(path: str) -> str:
    try:
        if os.path.isdir(path):
            os.listdir(path)
            return "listed"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
        return "read"
    except OSError as exc:
        return f"refused:{exc.errno}"


def _try_unix(path: str) -> str:
    import socket

    address = "\0" + path[1:] if path.startswith("@") else path
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(3)
        try:
            s.connect(address)
            return "connected"
        except OSError as exc:
            if exc.errno == 91:  # EPROTOTYPE: the other kind of socket
                continue
            return f"refused:{exc.errno}"
        finally:
            s.close()
    return "refused"


def _try_http(host: str, port: int) -> dict[str, Any]:
    import http.client

    answers: dict[str, Any] = {}
    for path in (*HTTP_PATHS, "/v1/health"):
        conn = http.client.HTTPConnection(host, port, timeout=3)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            answers[path] = [r.status, r.read(200).decode("latin-1")]
        except Exception as exc:
            answers[path] = ["error", type(exc).__name__]
        finally:
            conn.close()
    return answers


def _try_grpc(host: str, port: int) -> dict[str, str]:
    import grpc

    answers = {}
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        for method in GRPC_METHODS:
            try:
                channel.unary_unary(method)(b"", timeout=3)
                answers[method] = "OK"
            except grpc.RpcError as exc:
                answers[method] = exc.code().name
    return answers


def _main() -> None:
    # Everything the probes use is loaded before the uid drop: after it, this interpreter's own
    # files may be out of reach (a virtualenv under /root).
    import encodings.idna
    import encodings.latin_1  # noqa: F401
    import http.client
    import socket  # noqa: F401

    import grpc

    warm_http = http.client.HTTPConnection("127.0.0.1", 1, timeout=0.1)
    with contextlib.suppress(OSError):
        warm_http.request("GET", "/")
    "x".encode("latin-1").decode("latin-1")
    # grpc loads its own parts lazily
    with grpc.insecure_channel("127.0.0.1:1") as warm, contextlib.suppress(grpc.RpcError):
        warm.unary_unary("/x.Y/Z")(b"", timeout=0.1)

    targets = json.loads(sys.stdin.read())
    _drop_to(int(sys.argv[1]))
    result: dict[str, Any] = {
        "uid": os.getuid(),
        "paths": {p: _try_path(p) for p in targets["paths"]},
        "unix": {p: _try_unix(p) for p in targets["unix"]},
        "tcp": {},
    }
    for host, port in targets["tcp"]:
        connect_to = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        result["tcp"][f"{host}:{port}"] = {
            "http": _try_http(connect_to, port),
            "grpc": _try_grpc(connect_to, port),
        }
    print(json.dumps(result))


# -- reading the answers -----------------------------------------------------------------------
def api_like(http: dict[str, Any]) -> bool:
    """The port serves vaultvec's app (the API port, a gateway replica's own port, Serve's
    fallback proxy): its health answers as the API's does."""
    health = http.get("/v1/health", ["error"])
    return health[0] == 200 and '"api_version"' in health[1]


def reachable(inv: Inventory, answers: dict[str, Any]) -> list[str]:
    """What the other user got: a file read or directory listed, a Unix socket connected, a TCP
    port that answered a request without credentials with something else than a refusal."""
    found = [f"{p}: {r}" for p, r in answers["paths"].items() if not r.startswith("refused")]
    found += [f"unix {p}: {r}" for p, r in answers["unix"].items() if r == "connected"]
    owners = {f"{lst.address}:{lst.port}": lst.process for lst in inv.listeners}
    for where, got in answers["tcp"].items():
        http, grpc_codes = got["http"], got["grpc"]
        label = f"tcp {where} ({owners.get(where, '?')})"
        if api_like(http):  # the API itself: data needs the key
            if http["/v1/indexes/list"][0] != 401:
                found.append(f"{label}: the API answered without the key: {http}")
            continue
        if any(code == "OK" for code in grpc_codes.values()):
            found.append(f"{label}: gRPC answered without the token: {grpc_codes}")
            continue
        if "UNAUTHENTICATED" in grpc_codes.values():
            continue  # Ray's gRPC server, behind its token
        statuses = {a[0] for a in http.values()}
        if statuses and statuses <= {401, 403}:
            continue  # Ray's HTTP servers, behind its token
        found.append(f"{label}: answered without credentials: {http}")
    return found


def as_json(inv: Inventory) -> str:
    return json.dumps(asdict(inv), indent=1)


if __name__ == "__main__":
    _main()
