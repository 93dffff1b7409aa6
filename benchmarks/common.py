"""Shared helpers of the benchmark scripts: an in-process vaultvec, the project's client
(cluster.client) set up for a benchmark, recall, CPU accounting and table printing.

The scripts run from the repository root as ``.venv/bin/python benchmarks/<name>.py``; this
module sits next to them and is imported as ``common``. It puts the repository root on
``sys.path``, so that the scripts then import the helpers they share with the tests (synthetic
and SIFT data, exact search, free ports, Ray's temp dir) from ``tests.helpers``; a script
imports ``common`` before ``tests.helpers`` (isort does: ``common`` sorts as a third-party name).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import httpx
import numpy as np
import orjson

from actors.engine.locality import locality_order, request_order
from cluster.client import Client

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # for tests.helpers
    sys.path.insert(0, str(REPO))

from cluster import fastpath  # noqa: E402
from serve_app.settings import Settings  # noqa: E402
from tests.helpers import free_port, ray_tmpdir  # noqa: E402

# The service a benchmark starts runs as `vaultvec serve` does: Serve's switches are read when
# ray.serve is imported, before any script here imports it (serve_modes.py turns them off for
# its stock runs the same way, before the import).
fastpath.apply(Settings(**{}).serve_fast_path)

API_KEY = "bench-" + secrets.token_hex(8)
JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
JSON_HEADERS = {"Content-Type": "application/json"}
QUERY = "/v1/vectors/query"


# -- raw faiss and recall ---------------------------------------------------------------------
def locality_search(
    index: faiss.IndexIVF, q: np.ndarray, k: int, list_rank: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """raw faiss searched the way a shard searches a batch: coarse step, then the queries in
    locality order (actors.engine.locality.locality_order), results back in request order. Shows
    how much of a service ratio is the scan order rather than the service."""
    coarse, lists = index.quantizer.search(q, index.nprobe)
    order = locality_order(lists, list_rank)
    d, i = index.search_preassigned(q[order], k, lists[order], coarse[order])
    d, i = request_order(order, d, i)
    return d, i


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean |found[:k] ∩ truth[:k]| / k (found may hold -1 for missing results)."""
    hits = 0
    for f, t in zip(found[:, :k], truth[:, :k]):
        hits += len(np.intersect1d(f[f >= 0], t))
    return hits / (len(truth) * k)


# -- timing ---------------------------------------------------------------------------------
def pct(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), p))


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


# -- CPU accounting -------------------------------------------------------------------------
# Which process does what, by its command line (Ray names worker processes after their actor).
CPU_ROLES = (
    ("ray::Shard", "shards"),
    ("Gateway", "gateway"),
    ("ray::ProxyActor", "Serve proxy"),
    ("haproxy", "Serve proxy"),  # Serve's fast path: HAProxy in front of the gateway
    ("Embedder", "other"),
)
CPU_COLUMNS = ("this process", "gateway", "shards", "Serve proxy", "Ray daemons", "other")


def proc_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds so far) of every process visible in /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode("utf-8", "replace")
            )
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (cmd, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime
    return out


def cpu_role(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "this process"
    for needle, role in CPU_ROLES:
        if needle in cmd:
            return role
    if "/ray/" in cmd or cmd.startswith("ray::"):
        return "Ray daemons"  # raylet, GCS, Serve controller, dashboard agent, log monitor
    return "other"


def shard_resident_bytes() -> int | None:
    """Private resident memory (RssAnon) of every shard actor process on this machine, summed;
    None where /proc does not tell."""
    from actors.process.heap import resident_anon_bytes

    sizes = [
        resident_anon_bytes(pid)
        for pid, (cmd, _) in proc_cpu().items()
        if cpu_role(pid, cmd) == "shards"
    ]
    known = [size for size in sizes if size is not None]
    return sum(known) if known else None


_FAISS_RESIDENT = """
import sys
import faiss, numpy as np
from actors.process.heap import resident_anon_bytes
x, centroids = np.load(sys.argv[1]), np.load(sys.argv[2])
batch = int(sys.argv[3])
faiss.omp_set_num_threads(1)
quantizer = faiss.IndexFlatL2(x.shape[1])
quantizer.add(centroids)
index = faiss.IndexIVFFlat(quantizer, x.shape[1], len(centroids), faiss.METRIC_L2)
index.is_trained = True
before = resident_anon_bytes()
for start in range(0, len(x), batch):
    index.add(x[start : start + batch])
print((resident_anon_bytes() - before) / len(x))
"""


_FAISS_SEARCH = """
import sys, time
import faiss, numpy as np
x, centroids, q = (np.load(f) for f in sys.argv[1:4])
nprobe, k, threads, repeats = (int(v) for v in sys.argv[4:8])
faiss.omp_set_num_threads(threads)
quantizer = faiss.IndexFlatL2(x.shape[1])
quantizer.add(centroids)
index = faiss.IndexIVFFlat(quantizer, x.shape[1], len(centroids), faiss.METRIC_L2)
index.is_trained = True
index.add(x)
index.nprobe = nprobe
index.search(q, k)
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    index.search(q, k)
    times.append(time.perf_counter() - t0)
print(len(q) / sorted(times)[len(times) // 2])
"""


def _faiss_subprocess(script: str, arrays: list[np.ndarray], *args: int) -> float | None:
    """Run ``script`` in a fresh interpreter with ``arrays`` saved as .npy files (its first
    arguments, then ``args``); the number it prints last, or None if it printed none."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="vvfaiss-") as tmp:
        files = []
        for j, a in enumerate(arrays):
            files.append(Path(tmp) / f"a{j}.npy")
            np.save(files[-1], np.ascontiguousarray(a, dtype=np.float32))
        out = subprocess.run(
            [sys.executable, "-c", script, *map(str, files), *map(str, args)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def faiss_resident_bytes(x: np.ndarray, centroids: np.ndarray, batch: int) -> float | None:
    """Private resident bytes per vector of raw faiss holding ``x``: a fresh Python process
    builds an IndexIVFFlat on ``centroids`` and adds ``x`` in batches of ``batch`` (as a shard
    receives them). Unlike the serialised size this counts what faiss's own allocations keep
    resident (growth slack of the inverted lists); None where /proc does not tell."""
    return _faiss_subprocess(_FAISS_RESIDENT, [x, centroids], batch)


def faiss_fresh_process_qps(
    x: np.ndarray,
    centroids: np.ndarray,
    q: np.ndarray,
    nprobe: int,
    k: int,
    threads: int,
    repeats: int,
) -> float | None:
    """QPS (median of ``repeats``) of raw faiss searching ``q`` in a fresh Python process: the
    same IndexIVFFlat as in-process, without the benchmark process's own state (its heap, the
    driver's buffers, Ray's threads), which measurably moves the in-process figure."""
    return _faiss_subprocess(_FAISS_SEARCH, [x, centroids, q], nprobe, k, threads, repeats)


class CpuMeter:
    """CPU seconds of every process on the machine during a block, grouped by role (Linux).

    ``with meter.measure(label): ...`` adds that block's CPU per role to ``label``'s runs, so
    a table can show where a request's CPU goes: the service on the same cores as raw faiss
    is bounded by its total CPU, not by any one process. The kernel counts in clock ticks
    (10 ms on most Linux systems), so short runs are coarse: take medians over rounds."""

    def __init__(self) -> None:
        self.available = Path("/proc/self/stat").exists()
        self.runs: dict[str, list[dict[str, float]]] = {}

    @contextlib.contextmanager
    def measure(self, label: str) -> Iterator[None]:
        if not self.available:
            yield
            return
        before = proc_cpu()
        yield
        after = proc_cpu()
        roles = dict.fromkeys(CPU_COLUMNS, 0.0)
        for pid, (cmd, t) in after.items():
            roles[cpu_role(pid, cmd)] += t - before.get(pid, (cmd, 0.0))[1]
        self.runs.setdefault(label, []).append(roles)

    def median(self, label: str) -> dict[str, float]:
        runs = self.runs.get(label, [])
        return {c: median([r[c] for r in runs]) for c in CPU_COLUMNS} if runs else {}

    def table(self, baseline: str, title: str) -> None:
        """Median CPU milliseconds per run by role, and the median of the runs' totals against
        ``baseline``'s (so a row's roles need not add up to its total)."""
        if not self.available:
            print("\n(CPU by process: needs Linux /proc; skipped)")
            return
        base = median([sum(r.values()) for r in self.runs.get(baseline, [])] or [float("nan")])
        rows = []
        for label, runs in self.runs.items():
            m = self.median(label)
            total = median([sum(r.values()) for r in runs])
            cells = [f"{m[c] * 1e3:,.0f}" for c in CPU_COLUMNS]
            rows.append([label, *cells, f"{total * 1e3:,.0f}", f"{total / base:.2f}x"])
        print_table(["run", *CPU_COLUMNS, "total", "vs " + baseline], rows, title=title)


# -- environment ----------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    import faiss
    import ray

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "faiss": faiss.__version__,
        "ray": ray.__version__,
        "httpx": httpx.__version__,
        "loadavg": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def print_environment(env: dict[str, Any]) -> None:
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))


# -- tables ---------------------------------------------------------------------------------
def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None
) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "+".join("-" * (w + 2) for w in widths)
    if title:
        print(f"\n{title}")
    print(line)
    for j, r in enumerate(cells):
        print(
            " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )
        if j == 0:
            print(line)
    print(line)


# -- the service ----------------------------------------------------------------------------
@dataclass
class Service:
    url: str
    storage: Path
    settings: Any


@contextlib.contextmanager
def running_service(**overrides: Any) -> Iterator[Service]:
    """Start a private local Ray + Serve running vaultvec in this process; tear it down after.

    Ray is started as `vaultvec serve` starts it (cluster.runtime.start_local_ray: a Ray of its
    own, never one already running on the machine) in its own temp dir (tests.helpers.
    ray_tmpdir, which also holds the storage and is removed afterwards).
    """
    import ray

    from cluster import runtime
    from serve_app.settings import Settings

    if ray.is_initialized():
        raise RuntimeError("Ray is already running in this process")
    with ray_tmpdir("vvbench-") as root:
        storage = Path(root) / "store"
        storage.mkdir()
        settings = Settings(
            storage=f"file://{storage}",
            port=free_port(),
            api_key=[API_KEY],
            auto_train_threshold=10**9,
            **overrides,
        )
        os.environ.pop("RAY_ADDRESS", None)
        # The local Ray `vaultvec serve` starts (cluster.runtime), with a bounded object store.
        runtime.start_local_ray(settings, object_store_memory=1 << 30)
        try:
            t0 = time.perf_counter()
            url = runtime.start(settings)
            print(
                f"vaultvec up at {url} in {time.perf_counter() - t0:.1f}s (storage {storage})",
                flush=True,
            )
            yield Service(url, storage, settings)
        finally:
            runtime.stop()


# -- the project's client, set up for a benchmark --------------------------------------------
# What clients check an HTTPS service's certificate against (a CA file of the run's own, for a
# service started with a certificate made for it: serve_modes.py's tls mode).
VERIFY: bool | str = True


def connect(url: str, **options: Any) -> Client:
    """cluster.client.Client with the run's API key, a long timeout and requests of up to
    64 MiB (so that one upsert batch of a benchmark is one request)."""
    options = {"timeout": 1800.0, "max_request_bytes": 64 << 20, "verify": VERIFY, **options}
    return Client(url, API_KEY, **options)


def send(client: Client, path: str, content: bytes) -> httpx.Response:
    """POST JSON bytes on the client's connection (its base URL, API key and pool)."""
    return client.http.post(path, content=content, headers=JSON_HEADERS)


def post(client: Client, path: str, body: bytes | dict[str, Any]) -> Any:
    """POST ``body`` (JSON bytes encoded beforehand, or a dict encoded here) on the client's
    connection and decode the JSON answer; raises on any status but 200. The timed requests go
    this way: their bodies are encoded before the clock starts and their answers decoded as
    plain JSON, which the client's own methods (encoding, typed results) would add to."""
    content = body if isinstance(body, bytes) else orjson.dumps(body, option=JSON_OPTS)
    r = send(client, path, content)
    if r.status_code != 200:
        raise RuntimeError(f"POST {path} -> {r.status_code}: {r.text[:500]}")
    return orjson.loads(r.content)


def query(client: Client, body: bytes) -> Any:
    """A query body from ``query_body`` posted: its ``results``."""
    return post(client, QUERY, body)["results"]


def health(client: Client) -> None:
    """GET /v1/health, the no-op request the query latency is compared with."""
    r = client.http.get("/v1/health")
    if r.status_code != 200:
        raise RuntimeError(f"GET /v1/health -> {r.status_code}")


def query_body(
    name: str,
    key: str,
    q: np.ndarray,
    top_k: int,
    n_probes: int | None = None,
    greedy: bool = False,
    include: list[str] | None = None,
) -> bytes:
    """The JSON body of a query on the JSON route, encoded once before it is timed."""
    body: dict[str, Any] = {"index_name": name, "index_key": key, "query_vectors": q}
    body["top_k"] = top_k
    if n_probes:
        body["n_probes"] = n_probes
    if greedy:
        body["greedy"] = True
    if include is not None:
        body["include"] = include
    return orjson.dumps(body, option=JSON_OPTS)


def upsert_batches(
    idx: Any, x: np.ndarray, ids: Sequence[str], batch: int, label: str = ""
) -> float:
    """``idx.upsert`` (cluster.client Index) of ``batch`` items at a time, with a progress line;
    returns the seconds taken."""
    t0 = time.perf_counter()
    n = len(x)
    tty = sys.stdout.isatty()
    every = max(1, -(-n // batch) // 10)  # without a terminal: about ten progress lines
    for j, start in enumerate(range(0, n, batch)):
        stop = min(n, start + batch)
        idx.upsert(ids[start:stop], x[start:stop])
        el = time.perf_counter() - t0
        line = f"  upsert {label}: {stop:>9,}/{n:,} items  {el:6.1f}s  {stop / max(el, 1e-9):8,.0f} items/s"
        if tty:
            sys.stdout.write("\r" + line)
        elif (j + 1) % every == 0 or stop == n:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    if tty:
        sys.stdout.write("\n")
    return time.perf_counter() - t0


def train_and_wait(client: Client, idx: Any, n_lists: int | None = None) -> tuple[float, str]:
    """Train ``idx`` (``n_lists`` None or 0: automatic) and wait until it is done: (seconds,
    status)."""
    t0 = time.perf_counter()
    status = idx.train(n_lists=n_lists or None)
    while status == "in_progress":
        time.sleep(1.0)
        running = client.training_status()["training_indexes"]
        status = "in_progress" if idx.name in running else "success"
    return time.perf_counter() - t0, status


def settle(idx: Any, quiet_s: float = 8.0) -> dict[str, Any]:
    """Wait until the background measurements stop (the measured count holds for ``quiet_s``);
    describe's recall report."""
    last, since = None, time.perf_counter()
    while True:
        report = idx.describe().get("recall") or {}
        if report.get("sampled_queries") != last:
            last, since = report.get("sampled_queries"), time.perf_counter()
        elif time.perf_counter() - since >= quiet_s:
            return report
        time.sleep(0.5)


def result_ids(results: list[list[dict[str, Any]]], k: int) -> np.ndarray:
    """Batch query results -> (nq, k) int64 ids (ids are decimal row numbers), -1 padded."""
    out = np.full((len(results), k), -1, dtype=np.int64)
    for i, row in enumerate(results):
        ids = [int(e["id"]) for e in row[:k]]
        out[i, : len(ids)] = ids
    return out


def service_internals(name: str, key_hex: str) -> tuple[Any, np.ndarray | None]:
    """(IndexConfig, centroids) of an index, read from the control-plane actor in this process.

    Read-only; the benchmark owns the key. Used for what the API does not expose: the trained
    centroids (so raw faiss can use the very same ones) and the calibrated n_probes table.
    """
    import ray

    from actors.control.plane import CONTROL_NAME, NAMESPACE
    from actors.storage.crypto import derive_keys, parse_index_key

    control = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    meta = ray.get(control.lookup.remote(name))
    keys = derive_keys(parse_index_key(key_hex), name, meta.salt)
    view = ray.get(control.view.remote(name, keys.data_key))
    return view.config, view.centroids
