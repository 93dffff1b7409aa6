"""The memory footprint of a whole ``vaultvec serve``: every process it runs, by kind.

Starts ``vaultvec serve`` as a user would (its own data directory, Ray temp dir, free port and
API key), waits for /v1/health, then measures every process of the service after each scenario:

- idle: nothing created yet;
- one index without a model (vectors only, its shard actors up);
- plus an index with ``embedding_model`` all-MiniLM-L6-v2 and one text upsert (the Embedder
  and its model loaded); the first text requests are timed (the cold start);
- with ``--large``: plus a 100,000 × 128 ivfflat index upserted over the compact array route.

The processes are the CLI's process tree and every process of the Ray session it started (Ray's
daemons and workers, found by the session's temp dir in their command line or environment, and
their children). Each process's RSS and PSS come from /proc/<pid>/smaps: RSS counts a shared
page in every process that maps it, PSS splits it between them, so PSS is the fair sum.

Ray's object store is one shared-memory file that every Ray process maps. A page of it that an
object once used stays allocated after the object is freed, mapped or not: in a process's PSS
only while that process has it mapped, and in nobody's once no process does. So the processes'
rows leave their share of the store out, and the store is a row of its own: the pages its file
holds (counted once, whoever maps them).

    flock /tmp/vaultvec-ray.lock .venv/bin/python benchmarks/footprint.py [--large] [--check]

``--check`` exits 1 when a bar is missed: the idle service's PSS over 1.0 GB (1,000 MB), a
process mapping libtorch before the first text request, or (``--large``) the 100k × 128 index
adding more than 3× its raw vector bytes (51 MB) to the PSS. PSS moves by a few tens of MB between
runs: a shared page's share depends on how many processes map it, other programs of the same
virtual environment included.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import common  # noqa: F401  (puts the repository root on sys.path)
import httpx
import numpy as np

from cluster import fastpath
from cluster.client import Client, generate_key
from tests.helpers import clustered, free_port

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000
IDLE_BAR_MB = 1_000
MODEL = "all-MiniLM-L6-v2"
BEFORE_TEXT = ("idle", "+ index, no model")  # the scenarios before any text request
LARGE, LARGE_N, LARGE_D, LARGE_BAR = "+ 100k×128 ivfflat", 100_000, 128, 3
# Process kinds by command line (Ray renames its workers after their actor or task), in order.
KINDS = (
    ("gcs_server", "ray: gcs_server"),
    ("/raylet", "ray: raylet"),
    ("dashboard/dashboard.py", "ray: dashboard head"),
    ("ray::DashboardAgent", "ray: dashboard agent"),
    ("ray::RuntimeEnvAgent", "ray: runtime env agent"),
    ("log_monitor.py", "ray: log monitor"),
    ("autoscaler/_private/monitor.py", "ray: autoscaler monitor"),
    ("ray::ServeController", "serve: controller"),
    ("ray::ProxyActor", "serve: proxy"),
    ("ray::HAProxyManager", "serve: HAProxy manager"),
    ("bin/haproxy", "serve: HAProxy"),
    ("Gateway", "vaultvec: gateway"),
    ("Embedder", "vaultvec: embedder"),
    ("ray::ControlPlane", "vaultvec: control plane"),
    ("ray::Shard", "vaultvec: shards"),
    ("ray::IDLE", "ray: idle workers"),
)
STORE_FILE = "/plasma"  # Ray's object store: /dev/shm/plasma<random> (deleted once mapped)
STORE_KIND = "ray: object store (pages in use)"


@dataclass(frozen=True)
class Proc:
    pid: int
    kind: str
    rss: int  # bytes, Ray's object store left out
    pss: int
    torch: bool  # libtorch mapped


# -- processes ------------------------------------------------------------------------------
def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:  # the process is gone or not ours to read
        return ""


def children_map() -> dict[int, list[int]]:
    """ppid -> pids of every live process."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read(f"/proc/{entry}/stat")
            if stat:  # the fields after the command name, which may hold spaces
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(roots: Iterable[int], children: dict[int, list[int]]) -> set[int]:
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def in_session(pid: int, ray_tmp: str) -> bool:
    """A process of our Ray session: the temp dir is in its command line or its environment."""
    if ray_tmp in read(f"/proc/{pid}/cmdline"):
        return True
    return f"RAY_TMPDIR={ray_tmp}\0" in read(f"/proc/{pid}/environ")


def service_pids(cli_pid: int, ray_tmp: str) -> set[int]:
    """The CLI's tree, plus every process of its Ray session and their trees (Ray's daemons
    may be reparented away from the CLI)."""
    children = children_map()
    everyone = {p for kids in children.values() for p in kids}
    session = {p for p in everyone if p != os.getpid() and in_session(p, ray_tmp)}
    return descendants({cli_pid, *session}, children)


def kind_of(pid: int, cli_pid: int) -> str:
    if pid == cli_pid:
        return "vaultvec serve (driver)"
    cmd = read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
    for needle, kind in KINDS:
        if needle in cmd:
            return kind
    return "other: " + cmd[:60]


def memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes from smaps, without the mappings of Ray's object store; (0, 0) when
    the process is gone."""
    rss = pss = 0
    store = False
    for line in read(f"/proc/{pid}/smaps").splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if not head.endswith(":"):  # a mapping's first line: range, perms, offset, dev, inode, path
            store = STORE_FILE in line
        elif not store and head in ("Rss:", "Pss:"):
            kb = int(line.split()[1]) * 1024
            if head == "Rss:":
                rss += kb
            else:
                pss += kb
    return rss, pss


def store_bytes(procs: Iterable[int]) -> int:
    """The pages Ray's object store file holds (tmpfs allocates a page when it is first
    written), read through a process that keeps it open (the raylet); 0 when none is found."""
    for pid in procs:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                path = f"/proc/{pid}/fd/{fd}"
                with contextlib.suppress(OSError):
                    if STORE_FILE in os.readlink(path):
                        return os.stat(path).st_blocks * 512
    return 0


def maps_torch(pid: int) -> bool:
    return "libtorch" in read(f"/proc/{pid}/maps")


def snapshot(cli_pid: int, ray_tmp: str) -> list[Proc]:
    procs = []
    pids = sorted(service_pids(cli_pid, ray_tmp))
    for pid in pids:
        rss, pss = memory(pid)
        if rss:
            procs.append(Proc(pid, kind_of(pid, cli_pid), rss, pss, maps_torch(pid)))
    raylets = [p.pid for p in procs if p.kind == "ray: raylet"]
    held = store_bytes(raylets)
    if held:
        procs.append(Proc(0, STORE_KIND, held, held, False))
    return procs


# -- the service ----------------------------------------------------------------------------
@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    api_key: str
    ray_tmp: str
    data_dir: str
    log_path: Path


def start(
    env_extra: dict[str, str],
    data_dir: str | None = None,
    storage: str | None = None,
    api_key: str | None = None,
    port: int | None = None,
) -> Service:
    """``vaultvec serve`` in a process group of its own, healthy. A ``data_dir`` given (with
    the ``storage``, ``api_key`` and ``port`` of an earlier start) restarts that service on
    what it stored; by default both are new, the store a directory in ``data_dir``."""
    ray_tmp = tempfile.mkdtemp(prefix="vvfp", dir="/tmp")  # short: socket paths ≤ 108 bytes
    data_dir = data_dir or tempfile.mkdtemp(prefix="vvfp-data")
    storage = storage or f"file://{data_dir}/store"
    api_key = api_key or secrets.token_urlsafe(24)
    port = port or free_port()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    # Not this process's Serve switches (benchmarks/common.py applies the default to it): the
    # service applies its own, so that --env VAULTVEC_SERVE_FAST_PATH=false turns them off.
    env = {**fastpath.without(dict(os.environ)), "PYTHONPATH": path, "RAY_TMPDIR": ray_tmp}
    env.update(env_extra)
    env["VAULTVEC_API_KEY"] = api_key
    log_path = Path(data_dir) / "serve.log"
    # The `vaultvec` console script's code (cluster.cli:main), run from this checkout.
    cmd = [sys.executable, "-m", "cluster.cli", "serve", "--port", str(port)]
    cmd += ["--storage", storage]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    service = Service(proc, f"http://127.0.0.1:{port}", api_key, ray_tmp, data_dir, log_path)
    try:
        wait_healthy(service)
    except BaseException:
        stop(service)
        raise
    return service


def wait_healthy(service: Service, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise RuntimeError(f"vaultvec serve exited:\n{service.log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{service.url}/v1/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"vaultvec serve not healthy within {timeout_s:.0f}s")


def stop(service: Service, keep_data: bool = False) -> None:
    """SIGTERM to the CLI (it takes Ray down), then end whatever of the session is left and
    remove its directories once no process of it can write there any more (the data
    directory kept with ``keep_data``, for a restart)."""
    if service.proc.poll() is None:
        service.proc.send_signal(signal.SIGTERM)
    try:
        service.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        service.proc.kill()
        service.proc.wait()
    deadline = time.monotonic() + 30
    while (left := service_pids(service.proc.pid, service.ray_tmp) - {service.proc.pid}) and (
        time.monotonic() < deadline
    ):
        time.sleep(2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(service.ray_tmp, ignore_errors=True)
    if not keep_data:
        shutil.rmtree(service.data_dir, ignore_errors=True)


# -- scenarios ------------------------------------------------------------------------------
def settle(seconds: float) -> None:
    """Let Ray start (or reap) its workers and the heaps settle before a snapshot."""
    time.sleep(seconds)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def vector_index(client: Client) -> dict[str, float]:
    """An index without a model and 100 vectors; its creation timed (for reference)."""
    key = generate_key()
    out = {
        "create index, no model": timed(
            lambda: client.create_index("fp-vectors", key, dimension=128)
        )
    }
    client.index("fp-vectors", key).upsert(
        [f"v{i}" for i in range(100)], clustered(100, 128, seed=1)
    )
    return out


def text_index(client: Client) -> dict[str, float]:
    """The first text requests, timed: they start the Embedder's model (the cold start)."""
    key = generate_key()
    out: dict[str, float] = {}
    out["create index with model"] = timed(
        lambda: client.create_index("fp-text", key, embedding_model=MODEL)
    )
    index = client.index("fp-text", key)
    out["first text upsert"] = timed(
        lambda: index.upsert(["t0"], contents=["gzip compresses files to save disk space"])
    )
    out["first text query"] = timed(lambda: index.query(contents="make files smaller", top_k=1))
    warm = [timed(partial(index.query, contents=f"rain {i}", top_k=1)) for i in range(20)]
    out["text query p50, the next 20"] = float(np.median(warm))
    return out


def large_index(client: Client, n: int = LARGE_N, d: int = LARGE_D) -> None:
    index = client.create_index("fp-large", generate_key(), index_type="ivfflat", dimension=d)
    x = clustered(n, d, seed=2)
    ids = np.char.add("x", np.arange(n).astype(str)).tolist()
    index.upsert(ids, x, binary=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # the upsert passes the auto-training threshold
        status = client.training_status()
        if not status.get("currently_training") and not status.get("queued_indexes"):
            break
        time.sleep(1.0)


# -- report ---------------------------------------------------------------------------------
def by_kind(procs: list[Proc]) -> dict[str, tuple[int, int, int]]:
    """kind -> (processes, RSS, PSS)."""
    out: dict[str, tuple[int, int, int]] = {}
    for p in procs:
        n, rss, pss = out.get(p.kind, (0, 0, 0))
        out[p.kind] = (n + 1, rss + p.rss, pss + p.pss)
    return out


def cell(entry: tuple[int, int, int] | None) -> str:
    if entry is None:
        return "–"
    n, rss, pss = entry
    count = f" ×{n}" if n > 1 else ""
    return f"{rss / MB:,.0f} / {pss / MB:,.0f}{count}"


def processes(procs: list[Proc]) -> int:
    return sum(p.pid != 0 for p in procs)


def table(scenarios: dict[str, list[Proc]]) -> str:
    kinds = sorted({p.kind for procs in scenarios.values() for p in procs})
    grouped = {name: by_kind(procs) for name, procs in scenarios.items()}
    head = "| process (RSS / PSS MB) | " + " | ".join(scenarios) + " |"
    lines = [head, "|---" * (len(scenarios) + 1) + "|"]
    for kind in kinds:
        cells = [cell(grouped[name].get(kind)) for name in scenarios]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    totals = [
        cell((processes(p), sum(x.rss for x in p), sum(x.pss for x in p)))
        for p in scenarios.values()
    ]
    lines.append("| **total** | " + " | ".join(totals) + " |")
    torch = [str(sum(p.torch for p in procs)) for procs in scenarios.values()]
    lines.append("| processes with libtorch mapped | " + " | ".join(torch) + " |")
    return "\n".join(lines)


def bars(scenarios: dict[str, list[Proc]]) -> list[tuple[str, bool]]:
    """(what, met) of each bar: the idle PSS, no torch before the first text request, and with
    ``--large`` what the 100k × 128 index added to the PSS over its raw vector bytes."""
    idle = scenarios["idle"]
    pss, rss = sum(p.pss for p in idle) / MB, sum(p.rss for p in idle) / MB
    early = [procs for name, procs in scenarios.items() if name in BEFORE_TEXT]
    torch = len({p.pid for procs in early for p in procs if p.torch})
    met = [
        (
            f"idle PSS ≤ {IDLE_BAR_MB:,} MB: {pss:,.0f} MB "
            f"(RSS summed {rss:,.0f} MB, {processes(idle)} processes)",
            pss <= IDLE_BAR_MB,
        ),
        (f"no libtorch before the first text request: {torch} processes map it", torch == 0),
    ]
    if LARGE in scenarios:
        before = list(scenarios.values())[list(scenarios).index(LARGE) - 1]
        added = (sum(p.pss for p in scenarios[LARGE]) - sum(p.pss for p in before)) / MB
        raw = LARGE_N * LARGE_D * 4 / MB
        met.append(
            (
                f"the 100k × 128 index adds ≤ {LARGE_BAR}× its raw vectors ({raw:,.0f} MB): "
                f"{added:,.0f} MB = {added / raw:.2f}×",
                added <= LARGE_BAR * raw,
            )
        )
    return met


def run(args: argparse.Namespace) -> tuple[dict[str, list[Proc]], dict[str, float]]:
    env = dict(kv.split("=", 1) for kv in args.env)
    service = start(env)
    scenarios: dict[str, list[Proc]] = {}
    try:
        with Client(service.url, service.api_key, timeout=600) as client:
            settle(args.settle)
            scenarios[BEFORE_TEXT[0]] = snapshot(service.proc.pid, service.ray_tmp)
            timings = vector_index(client)
            settle(args.settle)
            scenarios[BEFORE_TEXT[1]] = snapshot(service.proc.pid, service.ray_tmp)
            timings |= text_index(client)
            settle(args.settle)
            scenarios["+ MiniLM index, 1 text"] = snapshot(service.proc.pid, service.ray_tmp)
            if args.large:
                large_index(client)
                settle(args.settle)
                scenarios[LARGE] = snapshot(service.proc.pid, service.ray_tmp)
    finally:
        stop(service)
    return scenarios, timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", action="store_true", help="add the 100k×128 ivfflat index")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before a snapshot")
    parser.add_argument("--check", action="store_true", help="exit 1 when a bar is missed")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)"
    )
    args = parser.parse_args()
    scenarios, timings = run(args)
    print(table(scenarios) + "\n")
    for what, seconds in timings.items():
        print(f"{what}: {seconds:.2f} s")
    results = bars(scenarios)
    for what, met in results:
        print(f"bar: {what}: {'met' if met else 'NOT met'}")
    return 1 if args.check and not all(met for _, met in results) else 0


if __name__ == "__main__":
    sys.exit(main())
