"""The service vs raw in-process faiss, side by side in one run (DESIGN.md §8).

On a synthetic clustered set (default 100k x 128, ivfflat) this starts vaultvec in-process,
ingests over HTTP, trains with a fixed n_lists, and then measures with the same data, the same
centroids (read back from the service) and the same n_probes:

* batch: 1,000 queries in one JSON request -> QPS, against raw faiss on the same 1,000 queries
  (bar: service >= 0.5x raw faiss);
* single queries: sequential requests on one keep-alive client -> p50/p99, against a no-op
  endpoint of the same Serve instance, GET /v1/health (bar: p50 <= 1.3x no-op p50);
* the floor of the single-query path: a bare Serve application deployed next to vaultvec on the
  same Serve instance (/floor) that only reads a POST body, and that also makes one no-op call
  to as many actors as the index has shards -> p50 against the same no-op (info);
* the same batch with two requests in flight (info: throughput under load);
* raw faiss searched in the shards' locality order (info: how much of the batch ratio is the
  scan order), and the batch body posted to the bare /floor app (info: Serve's own share);
* the single query against that POST no-op too (info: GET /v1/health carries no body, and Serve
  fetches a POST body from its proxy with one more actor call);
* recall@10 of the service and of raw faiss against exact search;
* the shards' private resident memory (Linux RssAnon) per vector after ingest and after training,
  over their memory with the index empty, against faiss's own index bytes per vector (the raw
  index serialised) (DESIGN.md §8 budget: <= 1.3x, plus fixed overhead). The index is filled
  in two halves, trained after each: the growth over the second half and its training is what
  a vector costs, and what the first half grew beyond that is the shards' fixed part (allocated
  once per process: BLAS buffers, code loaded on first use), left out of the per-vector
  figures and shown beside them; and, as info, what raw faiss itself keeps resident when a
  fresh process adds the same vectors in the shards' batch size;
* CPU per batch by process (Linux /proc): on a small machine the service shares its cores with
  the comparison, so its total CPU against raw faiss's bounds the batch ratio;
* a client-side breakdown of one batch request (where the time goes).

Usage: .venv/bin/python benchmarks/bench_service.py [--n 100000] [--check] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import orjson
from common import (
    JSON_OPTS,
    QUERY,
    CpuMeter,
    connect,
    environment,
    faiss_resident_bytes,
    health,
    locality_search,
    median,
    pct,
    post,
    print_environment,
    print_table,
    query,
    query_body,
    recall_at_k,
    result_ids,
    running_service,
    send,
    service_internals,
    shard_resident_bytes,
    train_and_wait,
    upsert_batches,
)

from actors.constants import TRIM_AFTER_WRITES_S
from actors.control.training import TrainParams, auto_n_lists, sample_size, train_template
from actors.engine.locality import rank_lists
from cluster.client import Client, generate_key
from tests.helpers import clustered, exact_knn

BATCH_BAR = 0.5  # service batch QPS >= 0.5x raw faiss
SINGLE_BAR = 1.3  # service single-query p50 <= 1.3x no-op p50
MEMORY_BAR = 1.3  # shard resident bytes per vector <= 1.3x faiss's own index bytes (DESIGN §8)
SETTLE_S = TRIM_AFTER_WRITES_S + 1.0  # memory is read once a shard has trimmed after writes
INDEX = "bench"
CPU_SERVICE = "service, batch JSON, include=[distance]"
CPU_RAW = "raw faiss"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=100_000, help="vectors in the index")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=1000, help="queries in the batch request")
    p.add_argument("--single", type=int, default=300, help="sequential single-query requests")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--n-lists", type=int, default=0, help="0 = automatic rule, 4*sqrt(N) capped")
    p.add_argument(
        "--n-probes",
        type=int,
        default=0,
        help="0 = the service's calibrated automatic n_probes for top_k (16 if unavailable)",
    )
    p.add_argument("--repeats", type=int, default=5, help="batch measurements (median taken)")
    p.add_argument("--batch-size", type=int, default=5000, help="items per upsert request")
    p.add_argument("--threads", type=int, default=0, help="raw faiss threads; 0 = all cores")
    p.add_argument(
        "--raw-centroids",
        choices=("service", "own"),
        default="service",
        help="raw faiss uses the service's trained centroids (default) or trains its own",
    )
    p.add_argument("--shards", type=int, default=0, help="shards per index; 0 = service default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="exit 1 if a bar is missed")
    p.add_argument("--json-out", help="write machine-readable results here")
    return p.parse_args(argv)


def timed(fn: Any, *a: Any, **kw: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t0, out


def raw_index(
    x: np.ndarray, centroids: np.ndarray | None, n_lists: int, source: str, service_n: int
) -> faiss.IndexIVFFlat:
    d = x.shape[1]
    if source == "service" and centroids is not None:
        quantizer = faiss.IndexFlatL2(d)
        quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
        index = faiss.IndexIVFFlat(quantizer, d, n_lists, faiss.METRIC_L2)
        index.is_trained = True
        index.own_fields = True  # the index owns (and keeps alive) its quantizer
        quantizer.this.disown()
    else:
        # The service's own recipe: same sample-size rule, same k-means (actors.control.training).
        size = sample_size(n_lists, service_n, d, None)
        rows = np.sort(np.random.default_rng(0).choice(len(x), size, replace=False))
        index = train_template(x[rows], "ivfflat", n_lists, None, None, TrainParams())
    index.add(x)
    return index


def deploy_floor(n_shards: int) -> None:
    """A bare Serve application on the same Serve instance, under /floor: what any design that
    answers a POST on Serve and asks ``n_shards`` actors pays before doing any work.

    POST /floor/body reads the body and answers; POST /floor/hop also sends the body to
    ``n_shards`` no-op actors at once (one Ray call each, as the gateway calls shards on other
    nodes); POST /floor/socket sends it to the same actors over their Unix sockets instead (as
    the gateway calls the shards on its own node: actors.pool.channel). Plain Serve HTTP (no
    FastAPI routing), so it is a lower bound."""
    import ray
    from ray import serve
    from starlette.responses import Response

    ok = b'{"ok":true}'

    @ray.remote(num_cpus=0.01)
    class Noop:
        def ping(self, body: bytes) -> bytes:
            return b""

        def socket(self) -> str:
            from actors.pool import channel

            directory = channel.socket_directory()
            assert directory is not None, "no private directory for the socket"
            self.server = channel.ChannelServer({channel.FRAMED: self.ping}, directory)
            return self.server.path

    @serve.deployment(ray_actor_options={"num_cpus": 0.05})
    class Floor:
        def __init__(self, n: int) -> None:
            from actors.pool import channel

            self.actors = [Noop.remote() for _ in range(n)]  # type: ignore[attr-defined]
            paths = ray.get([a.socket.remote() for a in self.actors])
            self.channels = [channel.Channel(path) for path in paths]

        async def __call__(self, request: Any) -> Response:
            from actors.pool import channel

            body = await request.body()
            if request.url.path.endswith("/hop"):
                await asyncio.gather(*(a.ping.remote(body) for a in self.actors))
            elif request.url.path.endswith("/socket"):
                await asyncio.gather(*(c.call(channel.FRAMED, body) for c in self.channels))
            return Response(ok, media_type="application/json")

    serve.run(Floor.bind(n_shards), name="floor", route_prefix="/floor")  # type: ignore[attr-defined]


# -- what a run measures ------------------------------------------------------------------
@dataclass
class Data:
    x: np.ndarray  # the indexed vectors
    q: np.ndarray  # held-out queries
    truth: np.ndarray  # exact top-k row numbers of each query
    n_lists: int


@dataclass
class Ingest:
    ingest_s: float
    train_s: float
    # shards' private resident bytes: empty, half ingested and trained, all ingested, trained
    memory: tuple[int | None, int | None, int | None, int | None]
    half: int  # vectors in the first half


@dataclass
class Internals:
    """What the service's control plane says about the trained index (not in the API)."""

    centroids: np.ndarray | None
    auto_nprobe: int | None
    table: Any
    n_shards: int | str
    nprobe: int  # the n_probes used everywhere


@dataclass
class Raw:
    index: faiss.IndexIVFFlat
    source: str  # whose centroids: "service" or "own"
    faiss_bytes: float  # faiss's own index bytes per vector (serialised)
    resident: dict[str, float | None]  # raw faiss resident bytes per vector, by how added


@dataclass
class Batches:
    body: bytes  # the batch query, include=[distance]
    distance_s: list[float]
    default_s: list[float]  # the same batch, default include
    raw: dict[str, list[float]]  # raw faiss: "raw", "raw1" (one thread), "ordered"
    in_flight_s: list[float]  # seconds per batch with two requests in flight
    found_svc: np.ndarray
    found_raw: np.ndarray


@dataclass
class Singles:
    times: dict[str, list[float]]  # "noop", "query" and, with /floor, "floor_body", "floor_hop"
    raw_s: list[float]  # raw faiss, one query at a time
    batch_floor_s: list[float]  # the batch body to the bare /floor app


@dataclass
class Run:
    args: argparse.Namespace
    env: dict[str, Any]
    threads: int
    data: Data
    ingest: Ingest
    internals: Internals
    raw: Raw
    batches: Batches
    singles: Singles
    profile: list[tuple[str, float, str]]
    cpu: CpuMeter


# -- set-up -------------------------------------------------------------------------------
def setup_environment(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    env = environment()
    threads = args.threads or env["cores"] or 1
    faiss.omp_set_num_threads(threads)
    env["raw_faiss_threads"] = threads
    print_environment(env)
    return env, threads


def prepare_data(args: argparse.Namespace) -> Data:
    k, n, nq = args.top_k, args.n, args.queries
    n_lists = args.n_lists or auto_n_lists(n)
    print(
        f"data: clustered {n:,} x {args.dim} + {nq:,} held-out queries, ivfflat, n_lists={n_lists}, top_k={k}"
    )
    data = clustered(n + nq, args.dim, seed=args.seed)
    x, q = np.ascontiguousarray(data[:n]), np.ascontiguousarray(data[n:])
    t_exact, (_, truth) = timed(exact_knn, x, q, k)
    print(f"exact ground truth (numpy, float64): {t_exact:.1f}s")
    return Data(x, q, truth, n_lists)


def create_index(client: Client, key: str, x: np.ndarray) -> Any:
    idx = client.create_index(INDEX, key, index_type="ivfflat", dimension=x.shape[1])
    # One item in and out: every shard is up and has loaded its code before the baseline.
    idx.upsert(["-"], x[:1])
    idx.delete(["-"])
    return idx


def ingest(client: Client, idx: Any, data: Data, batch_size: int) -> Ingest:
    """Fill the index in two halves, training after each: what the second half adds after
    training is what a vector costs; what the first half added beyond that is fixed (allocated
    once per shard process: BLAS buffers, code loaded on first use). Memory is read once the
    shards have trimmed after their writes."""
    time.sleep(1.0)
    mem0 = shard_resident_bytes()
    n, half = len(data.x), len(data.x) // 2
    ids = [str(i) for i in range(n)]
    label = f"{batch_size}/request"
    t_ingest = upsert_batches(idx, data.x[:half], ids[:half], batch_size, label=label)
    train_and_wait(client, idx, data.n_lists)
    time.sleep(SETTLE_S)
    mem_half_trained = shard_resident_bytes()
    t_ingest += upsert_batches(idx, data.x[half:], ids[half:], batch_size, label=label)
    time.sleep(SETTLE_S)
    mem_ingest = shard_resident_bytes()
    t_train, status = train_and_wait(client, idx, data.n_lists)
    time.sleep(SETTLE_S)
    mem_train = shard_resident_bytes()
    desc = idx.describe()
    print(
        f"ingest {t_ingest:.1f}s ({n / t_ingest:,.0f} items/s), train {t_train:.1f}s ({status}); "
        f"describe: n_lists={desc['index_config']['n_lists']} num_vectors={desc['num_vectors']:,}"
    )
    return Ingest(t_ingest, t_train, (mem0, mem_half_trained, mem_ingest, mem_train), half)


def read_internals(key: str, k: int, n_probes: int) -> Internals:
    try:
        cfg, centroids = service_internals(INDEX, key)
        auto_nprobe = cfg.auto_nprobe(k)
        table = cfg.nprobe_table
        n_shards: int | str = cfg.n_shards
    except Exception as exc:  # the internals are a convenience, not part of the API
        print(f"(could not read the service's centroids / n_probes table: {exc!r})")
        centroids, auto_nprobe, table, n_shards = None, None, (), "?"
    nprobe = n_probes or auto_nprobe or 16
    print(
        f"n_probes={nprobe} (service automatic for top_k={k}: {auto_nprobe}; calibration table {table})"
    )
    return Internals(centroids, auto_nprobe, table, n_shards, nprobe)


def build_raw(data: Data, svc: Internals, args: argparse.Namespace, threads: int) -> Raw:
    """raw faiss on the same vectors, the service's centroids (or its own) and n_probes."""
    n = len(data.x)
    source = args.raw_centroids if svc.centroids is not None else "own"
    t_build, index = timed(raw_index, data.x, svc.centroids, data.n_lists, source, n)
    index.nprobe = svc.nprobe
    print(
        f"raw faiss IndexIVFFlat built in {t_build:.1f}s with {source} centroids, {threads} threads"
    )
    faiss_bytes = len(faiss.serialize_index(index)) / n  # faiss's own index, per vector
    resident: dict[str, float | None] = {}
    if svc.centroids is not None and isinstance(svc.n_shards, int):
        # As the shards were filled (each gets its share of every upsert request), and as a
        # training rebuild fills them (everything at once).
        shard_batch = max(1, args.batch_size // svc.n_shards)
        resident = {
            "in the shards' batches": faiss_resident_bytes(data.x, svc.centroids, shard_batch),
            "at once": faiss_resident_bytes(data.x, svc.centroids, n),
        }
    return Raw(index, source, faiss_bytes, resident)


# -- measurements -------------------------------------------------------------------------
# After a parallel search, OpenMP's worker threads spin for a while (GNU OpenMP's default wait:
# about 7 ms of CPU here) in whichever process ran it, this one's raw faiss or the service's
# shard. Each timed batch starts once they have gone idle, so that neither side is measured
# while the other's threads still hold a core.
QUIET_S = 0.02


def measure_batches(
    client: Client,
    bodies: list[bytes],
    index: faiss.Index,
    q: np.ndarray,
    k: int,
    repeats: int,
    cpu: CpuMeter,
) -> tuple[list[list[float]], dict[str, list[float]], np.ndarray, np.ndarray]:
    """Batch timings, interleaved round by round (each service body, raw faiss with the set
    threads, raw faiss with one thread, raw faiss in the shards' locality order) so that
    background load hits every side alike.
    Service time = POST + JSON decode of the response. ``cpu`` records every process's CPU
    during the first body's requests and the raw faiss runs."""
    for body in bodies:  # warm-up
        query(client, body)
    index.search(q, k)
    threads = faiss.omp_get_max_threads()
    svc_times: list[list[float]] = [[] for _ in bodies]
    raw_runs: dict[str, list[float]] = {"raw": [], "raw1": [], "ordered": []}
    rank = rank_lists(index)
    # What the locality order must not change: the same coarse step, the queries in request
    # order (not index.search's answer, whose coarse step runs per thread's slice of the
    # queries: BLAS may round a distance differently there and pick another n_probes-th list).
    coarse, lists = index.quantizer.search(q, index.nprobe)
    in_order = index.search_preassigned(q, k, lists, coarse)[1]
    found_svc: Any = None
    found_raw: Any = None
    for _ in range(repeats):
        for j, body in enumerate(bodies):
            time.sleep(QUIET_S)
            with cpu.measure(CPU_SERVICE) if j == 0 else contextlib.nullcontext():
                t0 = time.perf_counter()
                results = query(client, body)
                svc_times[j].append(time.perf_counter() - t0)
            if j == 0:
                found_svc = results
        time.sleep(QUIET_S)
        with cpu.measure(CPU_RAW):
            t, (_, found_raw) = timed(index.search, q, k)
        raw_runs["raw"].append(t)
        faiss.omp_set_num_threads(1)
        time.sleep(QUIET_S)
        raw_runs["raw1"].append(timed(index.search, q, k)[0])
        faiss.omp_set_num_threads(threads)
        time.sleep(QUIET_S)
        t, (_, found_ordered) = timed(locality_search, index, q, k, rank)
        raw_runs["ordered"].append(t)
        assert (found_ordered == in_order).all(), "locality order changed raw faiss's results"
    return svc_times, raw_runs, result_ids(found_svc, k), found_raw


def measure_in_flight(url: str, body: bytes, repeats: int, clients: int = 2) -> list[float]:
    """Seconds per batch with ``clients`` batch requests in flight (one client each, two
    requests per client per round): the service's batch throughput under load, where one
    request's serial phases (Serve's transfer, parsing, the answer) overlap another's search."""
    pool = [connect(url) for _ in range(clients)]
    try:
        with ThreadPoolExecutor(clients) as ex:
            list(ex.map(lambda c: query(c, body), pool))  # warm-up
            per_batch = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(ex.map(lambda c: [query(c, body) for _ in range(2)], pool))
                per_batch.append((time.perf_counter() - t0) / (2 * clients))
        return per_batch
    finally:
        for c in pool:
            c.close()


def batch_section(
    client: Client, url: str, key: str, data: Data, raw: Raw, run_args: tuple[int, int, CpuMeter]
) -> Batches:
    """The batch request (include=[distance], then default include) against raw faiss, and
    with two requests in flight."""
    nprobe, repeats, cpu = run_args
    k = data.truth.shape[1]
    body_d = query_body(INDEX, key, data.q, k, nprobe, include=["distance"])
    body_default = query_body(INDEX, key, data.q, k, nprobe)
    (bt_d, bt_def), raw_runs, found_svc, found_raw = measure_batches(
        client, [body_d, body_default], raw.index, data.q, k, repeats, cpu
    )
    bt_flight = measure_in_flight(url, body_d, repeats)
    return Batches(body_d, bt_d, bt_def, raw_runs, bt_flight, found_svc, found_raw)


def measure_single(
    client: Client, bodies: list[bytes], floor: bool, warmup: int = 20
) -> dict[str, list[float]]:
    """Sequential single queries interleaved with the no-op GET /v1/health on the same client
    (and, with ``floor``, the same bodies to the bare /floor app's two routes)."""
    calls: dict[str, Any] = {
        "noop": lambda b: health(client),
        "query": lambda b: query(client, b),
    }
    if floor:
        calls["floor_body"] = lambda b: post(client, "/floor/body", b)
        calls["floor_hop"] = lambda b: post(client, "/floor/hop", b)
    for b in bodies[:warmup]:
        for call in calls.values():
            call(b)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for b in bodies:
        for name, call in calls.items():
            t0 = time.perf_counter()
            call(b)
            times[name].append(time.perf_counter() - t0)
    return times


def raw_single(index: faiss.Index, q: np.ndarray, k: int, n: int) -> list[float]:
    for i in range(min(20, n)):
        index.search(q[i % len(q) : i % len(q) + 1], k)
    times = []
    for i in range(n):
        row = q[i % len(q) : i % len(q) + 1]
        t0 = time.perf_counter()
        index.search(row, k)
        times.append(time.perf_counter() - t0)
    return times


def single_section(
    client: Client,
    key: str,
    data: Data,
    svc: Internals,
    raw: Raw,
    b: Batches,
    args: argparse.Namespace,
) -> Singles:
    """Single queries against the no-op (and the /floor app when it deploys), the batch body
    to /floor, and raw faiss one query at a time."""
    k, nq = args.top_k, len(data.q)
    singles = [
        query_body(INDEX, key, data.q[i % nq], k, svc.nprobe, include=["distance"])
        for i in range(args.single)
    ]
    try:
        deploy_floor(svc.n_shards if isinstance(svc.n_shards, int) else 2)
        floor = True
    except Exception as exc:  # the floor is a reference point, not part of the service
        print(f"(could not deploy the /floor reference app: {exc!r})")
        floor = False
    st = measure_single(client, singles, floor)
    batch_floor: list[float] = []
    if floor:  # the batch body through Serve, answered without work: Serve's own share
        post(client, "/floor/body", b.body)
        for _ in range(args.repeats):
            batch_floor.append(timed(post, client, "/floor/body", b.body)[0])
    return Singles(st, raw_single(raw.index, data.q, k, args.single), batch_floor)


# -- where the time of one batch request goes ------------------------------------------------
def median_timed(fn: Any, *a: Any, reps: int = 5) -> tuple[float, Any]:
    """Median seconds of ``reps`` calls after a warm one, and the last call's answer."""
    fn(*a)  # warm
    runs = [timed(fn, *a) for _ in range(reps)]
    return median([t for t, _ in runs]), runs[-1][1]


def profile_client(
    client: Client, key: str, q: np.ndarray, k: int, nprobe: int, include: list[str], reps: int
) -> tuple[list[tuple[str, float, str]], bytes, float, float]:
    """The client side of one batch request: (rows, the body, round trip s, single-query 404 s)."""
    t_enc, body = median_timed(query_body, INDEX, key, q, k, nprobe, False, include, reps=reps)
    t_rt, r = median_timed(send, client, QUERY, body, reps=reps)
    # The same body to an unknown index: Serve ingress + body transfer + parse + as_matrix + one
    # control-plane lookup, then 404 - the request-side cost without any search.
    body404 = query_body("no-such-index", key, q, k, nprobe, False, include)
    t_404, r404 = median_timed(send, client, QUERY, body404, reps=reps)
    assert r404.status_code == 404, r404.status_code
    one404 = query_body("no-such-index", key, q[0], k, nprobe, False, include)
    t_404_1 = median([timed(send, client, QUERY, one404)[0] for _ in range(50)])
    t_dec, parsed = median_timed(orjson.loads, r.content, reps=reps)
    t_ids, _ = median_timed(result_ids, parsed["results"], k, reps=reps)
    rows = [
        ("client: encode request (orjson)", t_enc, f"{len(body) / 1e6:.2f} MB"),
        (
            "client: POST round trip (send, server, receive)",
            t_rt,
            f"response {len(r.content) / 1e6:.2f} MB",
        ),
        ("client: decode response (orjson)", t_dec, ""),
        ("  same body, unknown index -> 404 (no search)", t_404, "ingress + parse + 1 lookup"),
        ("client: results -> id matrix", t_ids, ""),
    ]
    return rows, body, t_rt, t_404_1


def gateway_view(key: str) -> tuple[Any, Any]:
    """A gateway's Engine in this process, on the live control plane, and its view of the index."""
    import ray

    from actors.control.client import ControlClient
    from actors.control.plane import CONTROL_NAME, NAMESPACE
    from serve_app.gateway.engine import Engine

    engine = Engine(ControlClient(ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)))
    return engine, asyncio.run(engine.view(INDEX, key))


def profile_gateway(
    gateway: tuple[Any, Any],
    body: bytes,
    k: int,
    nprobe: int,
    include: list[str],
    raw: Any,
    reps: int,
) -> list[tuple[str, float, str]]:
    """The gateway's steps re-run in this process against the live shard actors, with one faiss
    thread (Ray gives a fractional-CPU replica one); the last row is their sum."""
    import ray

    from actors.types import SearchRequest
    from serve_app.gateway.hits import merge
    from serve_app.models import QueryRequest
    from serve_app.service.checks import as_matrix
    from serve_app.service.results import results_json

    engine, cv = gateway
    with_meta = "metadata" in include
    t_json, obj = median_timed(orjson.loads, body, reps=reps)
    t_model, model = median_timed(QueryRequest.model_validate, obj, reps=reps)
    t_mat, (x, _) = median_timed(as_matrix, model.query_vectors, "query_vectors", reps=reps)
    t_plan, (lists, coarse) = median_timed(engine.plan, cv, x, nprobe, reps=reps)
    req = SearchRequest(x, k, cv.config.version, lists, coarse, None, with_meta)

    def fan_out(req: SearchRequest) -> Any:
        return ray.get([s.handle.search.remote(s.partition, cv.key, req) for s in cv.shards])

    t_fan, parts = median_timed(fan_out, req, reps=reps)
    t_merge, hits = median_timed(merge, parts, k, with_meta, reps=reps)
    t_render, out = median_timed(
        results_json, hits, cv.config.metric, "distance" in include, with_meta, False, reps=reps
    )
    # faiss work alone: the same preassigned lists on the unsharded raw index, one thread.
    dist = np.empty((len(x), k), dtype=np.float32)
    lab = np.empty((len(x), k), dtype=np.int64)
    t_faiss, _ = median_timed(
        lambda: raw.search_preassigned(x, k, lists, coarse, D=dist, I=lab), reps=reps
    )
    server = t_json + t_model + t_mat + t_plan + t_fan + t_merge + t_render
    n_shards = len(cv.shards)
    return [
        ("gateway step: orjson.loads(body)", t_json, "re-run in this process"),
        ("gateway step: QueryRequest.model_validate", t_model, "reads the vectors with numpy"),
        ("gateway step: as_matrix (float64 -> float32)", t_mat, ""),
        ("gateway step: coarse quantizer (1 thread)", t_plan, f"n_probes={nprobe}"),
        ("gateway step: shard fan-out (Ray calls)", t_fan, f"{n_shards} shards, in parallel"),
        ("  of which faiss work (all shards, 1 thread)", t_faiss, "search_preassigned, unsharded"),
        ("gateway step: merge per-shard top-k", t_merge, ""),
        ("gateway step: results_json", t_render, f"{len(out) / 1e6:.2f} MB"),
        ("sum of gateway steps", server, ""),
    ]


def profile_shard_calls(
    gateway: tuple[Any, Any], q: np.ndarray, k: int, nprobe: int, with_meta: bool
) -> tuple[float, float]:
    """Median of 50 each: one query's shard fan-out, and a bare Ray call to every shard."""
    import ray

    from actors.types import SearchRequest

    engine, cv = gateway
    x1 = np.ascontiguousarray(q[:1], dtype=np.float32)
    l1, c1 = engine.plan(cv, x1, nprobe)
    req1 = SearchRequest(x1, k, cv.config.version, l1, c1, None, with_meta)
    shards = cv.shards
    t_one = median(
        [
            timed(
                lambda: ray.get([s.handle.search.remote(s.partition, cv.key, req1) for s in shards])
            )[0]
            for _ in range(50)
        ]
    )
    t_ping = median(
        [timed(lambda: ray.get([s.handle.ping.remote() for s in shards]))[0] for _ in range(50)]
    )
    return t_one, t_ping


def profile_batch(
    client: Client,
    key: str,
    q: np.ndarray,
    k: int,
    nprobe: int,
    include: list[str],
    raw: faiss.IndexIVF,
    reps: int = 5,
) -> list[tuple[str, float, str]]:
    """Time the phases of one batch request (median of ``reps`` each): the client side, and the
    gateway's steps re-run in this process against the live shard actors."""
    rows, body, t_rt, t_404_1 = profile_client(client, key, q, k, nprobe, include, reps)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        view = gateway_view(key)
        steps = profile_gateway(view, body, k, nprobe, include, raw, reps)
        t_one, t_ping = profile_shard_calls(view, q, k, nprobe, "metadata" in include)
    finally:
        faiss.omp_set_num_threads(threads)
    server = steps[-1][1]
    return [
        *rows,
        *steps,
        ("round trip - gateway steps", t_rt - server, "Serve proxy + ASGI + transfer"),
        ("single query, unknown index -> 404 (no search)", t_404_1, "median of 50, over HTTP"),
        ("single query: shard fan-out (1 query)", t_one, "median of 50, re-run here"),
        ("bare Ray call to every shard: ping", t_ping, "median of 50, Ray floor"),
    ]


# -- the scenario -------------------------------------------------------------------------
def run_service(args: argparse.Namespace, env: dict[str, Any], threads: int, data: Data) -> Run:
    """Start vaultvec, fill and train the index, and take every measurement on it."""
    key = generate_key()
    cpu = CpuMeter()
    overrides = {"shards": args.shards} if args.shards else {}
    with running_service(**overrides) as svc, connect(svc.url) as client:
        idx = create_index(client, key, data.x)
        ing = ingest(client, idx, data, args.batch_size)
        internals = read_internals(key, args.top_k, args.n_probes)
        raw = build_raw(data, internals, args, threads)
        b = batch_section(client, svc.url, key, data, raw, (internals.nprobe, args.repeats, cpu))
        singles = single_section(client, key, data, internals, raw, b, args)
        print("profiling one batch request ...", flush=True)
        prof = profile_batch(
            client, key, data.q, args.top_k, internals.nprobe, ["distance"], raw.index
        )
    return Run(args, env, threads, data, ing, internals, raw, b, singles, prof, cpu)


# -- figures and tables -------------------------------------------------------------------
def figures(run: Run) -> dict[str, float]:
    """The headline numbers: QPS, latency percentiles (ms) and recall."""
    nq, k, b, st = len(run.data.q), run.args.top_k, run.batches, run.singles.times
    return {
        "qps_d": nq / median(b.distance_s),
        "qps_def": nq / median(b.default_s),
        "qps_raw": nq / median(b.raw["raw"]),
        "qps_raw1": nq / median(b.raw["raw1"]),
        "qps_ordered": nq / median(b.raw["ordered"]),
        "qps_flight": nq / median(b.in_flight_s),
        "p50": pct(st["query"], 50) * 1e3,
        "p99": pct(st["query"], 99) * 1e3,
        "n50": pct(st["noop"], 50) * 1e3,
        "n99": pct(st["noop"], 99) * 1e3,
        "r50": pct(run.singles.raw_s, 50) * 1e3,
        "r99": pct(run.singles.raw_s, 99) * 1e3,
        "rec_svc": recall_at_k(b.found_svc, run.data.truth, k),
        "rec_raw": recall_at_k(b.found_raw, run.data.truth, k),
        "same": float(np.mean([set(x) == set(y) for x, y in zip(b.found_svc, b.found_raw)])),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def row(
    label: str, value: str, against: str, ratio: str, bar: str = "-", result: str = "info"
) -> list[str]:
    return [label, value, against, ratio, bar, result]


def batch_rows(f: dict[str, float], run: Run) -> list[list[str]]:
    raw = f"{f['qps_raw']:,.0f} (raw faiss)"
    rows = [
        row("batch QPS, JSON, include=[distance]", f"{f['qps_d']:,.0f}", raw,
            f"{f['qps_d'] / f['qps_raw']:.3f}x", f">= {BATCH_BAR}x", verdict(f["qps_d"] >= BATCH_BAR * f["qps_raw"])),
        row("batch QPS, JSON, default include", f"{f['qps_def']:,.0f}", raw,
            f"{f['qps_def'] / f['qps_raw']:.3f}x", f">= {BATCH_BAR}x", verdict(f["qps_def"] >= BATCH_BAR * f["qps_raw"])),
        row("batch QPS vs raw faiss on 1 thread", f"{f['qps_d']:,.0f}", f"{f['qps_raw1']:,.0f} (raw, 1 thread)",
            f"{f['qps_d'] / f['qps_raw1']:.3f}x"),
        row("batch QPS, JSON, 2 requests in flight", f"{f['qps_flight']:,.0f}", raw,
            f"{f['qps_flight'] / f['qps_raw']:.3f}x"),
        row("faiss in locality order vs raw faiss", f"{f['qps_ordered']:,.0f}", raw,
            f"{f['qps_ordered'] / f['qps_raw']:.3f}x"),
    ]  # fmt: skip
    if run.singles.batch_floor_s:
        # Serve's transfer of the same request body (answered with a few bytes, no work): no
        # gateway code avoids it, so next to raw faiss's batch time it bounds the batch ratio.
        fb, rb = median(run.singles.batch_floor_s), median(run.batches.raw["raw"])
        rows.append(
            row("floor: batch body to a bare Serve POST (ms)", f"{fb * 1e3:.1f}",
                f"{rb * 1e3:.1f} (raw faiss batch)", f"{fb / rb:.2f}x")
        )  # fmt: skip
    return rows


def single_rows(f: dict[str, float], run: Run) -> list[list[str]]:
    st, n50 = run.singles.times, f["n50"]
    p50, p99 = f["p50"], f["p99"]
    rows = [
        row("single query p50 (ms)", f"{p50:.2f}", f"{n50:.2f} (no-op)", f"{p50 / n50:.2f}x",
            f"<= {SINGLE_BAR}x", verdict(p50 <= SINGLE_BAR * n50)),
        row("single query p99 (ms)", f"{p99:.2f}", f"{f['n99']:.2f} (no-op)", f"{p99 / f['n99']:.2f}x"),
    ]  # fmt: skip
    for name, label in (
        ("floor_body", "floor: bare Serve POST, same body (ms)"),
        ("floor_hop", f"floor: same + 1 no-op call x {run.internals.n_shards} actors (ms)"),
    ):
        if name in st:
            f50 = pct(st[name], 50) * 1e3
            rows.append(row(label, f"{f50:.2f}", f"{n50:.2f} (no-op)", f"{f50 / n50:.2f}x"))
    if "floor_body" in st:
        # Against a no-op that takes the same POST body: GET /v1/health has no body, and Serve
        # fetches a POST body from its proxy with one more actor call.
        b50 = pct(st["floor_body"], 50) * 1e3
        rows.append(
            row(
                "single query p50 vs POST no-op (ms)",
                f"{p50:.2f}",
                f"{b50:.2f} (POST no-op)",
                f"{p50 / b50:.2f}x",
            )
        )
    rows += [
        row("single query p50 vs raw faiss (ms)", f"{p50:.2f}", f"{f['r50']:.3f} (raw faiss)", f"{p50 / f['r50']:.0f}x"),
        row("single query p99 vs raw faiss (ms)", f"{p99:.2f}", f"{f['r99']:.3f} (raw faiss)", f"{p99 / f['r99']:.0f}x"),
    ]  # fmt: skip
    return rows


def recall_rows(f: dict[str, float], k: int) -> list[list[str]]:
    return [
        row(f"recall@{k} vs exact", f"{f['rec_svc']:.4f}", f"{f['rec_raw']:.4f} (raw faiss)",
            f"{f['rec_svc'] - f['rec_raw']:+.4f}"),
        row(f"identical top-{k} sets service vs raw", f"{f['same']:.4f}", "-", "-"),
    ]  # fmt: skip


def resident_rows(raw: Raw, memory: dict[str, float]) -> list[list[str]]:
    """What raw faiss itself keeps resident per vector (info), into ``memory`` too."""
    rows = []
    for how, per_vector in raw.resident.items():
        if per_vector is None:
            continue
        memory[f"faiss_resident_bytes_per_vector_added_{how.split()[-1]}"] = per_vector
        rows.append(
            row(f"raw faiss resident, added {how} (bytes/vector)", f"{per_vector:,.0f}",
                f"{raw.faiss_bytes:,.0f} (faiss index)", f"{per_vector / raw.faiss_bytes:.2f}x")
        )  # fmt: skip
    return rows


def shard_memory_rows(run: Run, memory: dict[str, float]) -> tuple[list[list[str]], bool]:
    """The shards' resident bytes per vector against faiss's own index bytes (the bar), with
    the fixed part apart; into ``memory`` too. No rows when /proc does not tell."""
    readings, fb = run.ingest.memory, run.raw.faiss_bytes
    if any(r is None for r in readings):
        return [], True
    m0, m_half_trained, m_ingest, m_train = (float(r or 0) for r in readings)
    n, half = len(run.data.x), run.ingest.half
    marginal = (m_train - m_half_trained) / (n - half)  # per vector, trained both times
    fixed = max(0.0, m_half_trained - m0 - marginal * half)  # all shards, bytes
    shards = run.internals.n_shards if isinstance(run.internals.n_shards, int) else 2
    memory["fixed_bytes_per_shard"] = fixed / shards
    rows, ok_mem = [], True
    for name, label, spread, per in (
        # the second half went into trained lists: after ingest, only the fixed part is apart
        ("after_ingest", "shard memory after ingest (bytes/vector)", (m_ingest - m0) / n, (m_ingest - m0 - fixed) / n),
        ("after_training", "shard memory after training (bytes/vector)", (m_train - m0) / n, marginal),
    ):  # fmt: skip
        memory[name] = per
        memory[name + "_with_fixed_part"] = spread
        ok = per <= MEMORY_BAR * fb
        ok_mem &= ok
        rows.append(
            row(
                label,
                f"{per:,.0f}",
                f"{fb:,.0f} (faiss index)",
                f"{per / fb:.2f}x",
                f"<= {MEMORY_BAR}x",
                verdict(ok),
            )
        )
        rows.append(row("  the same with the fixed part spread over the vectors", f"{spread:,.0f}",
                        f"{fb:,.0f} (faiss index)", f"{spread / fb:.2f}x"))  # fmt: skip
    rows.append(
        row("shard memory, fixed part per shard (MB)", f"{fixed / shards / 1e6:.1f}", "-", "-")
    )
    return rows, ok_mem


def print_report(run: Run, rows: list[list[str]]) -> None:
    args, nq, svc = run.args, len(run.data.q), run.internals
    print_table(
        ["metric", "service", "raw faiss / no-op", "ratio", "bar", "result"],
        rows,
        title=(
            f"vaultvec vs raw faiss: N={args.n:,} d={args.dim} ivfflat n_lists={run.data.n_lists} n_probes={svc.nprobe} "
            f"top_k={args.top_k}; batch={nq:,} queries x {args.repeats} interleaved repeats (median); single={args.single} "
            f"requests; raw faiss threads={run.threads}; service shards={svc.n_shards}"
        ),
    )
    run.cpu.table(
        CPU_RAW,
        title=(
            f"CPU milliseconds per {nq:,}-query batch (all processes on the machine, median), by "
            f"process: on {run.env['cores']} cores the service is bounded by its total CPU"
        ),
    )
    print_table(
        ["phase of one batch request", "ms", "note"],
        [[name, f"{t * 1e3:.1f}", note] for name, t, note in run.profile],
        title=f"where the time goes (one {nq:,}-query request, include=[distance]; median of 5 each)",
    )
    ing = run.ingest
    print(
        f"\ningest {ing.ingest_s:.1f}s ({args.n / ing.ingest_s:,.0f} items/s over HTTP), training {ing.train_s:.1f}s"
    )
    run.env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print_environment(run.env)


def results_json(
    run: Run, f: dict[str, float], memory: dict[str, Any], checks: dict[str, bool]
) -> dict[str, Any]:
    """Every figure of the run, machine-readable (--json-out)."""
    b, st, svc = run.batches, run.singles.times, run.internals
    return {
        "env": run.env,
        "params": vars(run.args) | {"n_lists": run.data.n_lists},
        "ingest_s": run.ingest.ingest_s,
        "train_s": run.ingest.train_s,
        "n_probes": svc.nprobe,
        "auto_n_probes": svc.auto_nprobe,
        "nprobe_table": [list(p) for p in svc.table],
        "raw_centroids": run.raw.source,
        "batch": {
            "service_qps_distance": f["qps_d"],
            "service_qps_default_include": f["qps_def"],
            "raw_faiss_qps": f["qps_raw"],
            "raw_faiss_qps_1_thread": f["qps_raw1"],
            "ratio_distance": f["qps_d"] / f["qps_raw"],
            "ratio_default_include": f["qps_def"] / f["qps_raw"],
            "bar": BATCH_BAR,
            "pass": checks["batch"],
            "service_s": b.distance_s,
            "service_default_s": b.default_s,
            "raw_s": b.raw["raw"],
            "raw_1_thread_s": b.raw["raw1"],
            "service_qps_2_in_flight": f["qps_flight"],
            "service_2_in_flight_s_per_batch": b.in_flight_s,
            "locality_order_faiss_qps": f["qps_ordered"],
            "locality_order_faiss_s": b.raw["ordered"],
            "serve_floor_s": run.singles.batch_floor_s,
        },
        "single": {
            "service_p50_ms": f["p50"],
            "service_p99_ms": f["p99"],
            "noop_p50_ms": f["n50"],
            "noop_p99_ms": f["n99"],
            "raw_faiss_p50_ms": f["r50"],
            "raw_faiss_p99_ms": f["r99"],
            "ratio_p50": f["p50"] / f["n50"],
            **{
                f"{name}_p50_ms": pct(st[name], 50) * 1e3 for name in st if name.startswith("floor")
            },
            "bar": SINGLE_BAR,
            "pass": checks["single"],
        },
        "recall": {"service": f["rec_svc"], "raw_faiss": f["rec_raw"], "identical_sets": f["same"]},
        "memory": memory | {"bar": MEMORY_BAR, "pass": checks["memory"]},
        "profile_ms": {name: t * 1e3 for name, t, _ in run.profile},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env, threads = setup_environment(args)
    data = prepare_data(args)
    run = run_service(args, env, threads, data)
    f = figures(run)
    memory: dict[str, float] = {"faiss_index_bytes_per_vector": run.raw.faiss_bytes}
    mem_rows = resident_rows(run.raw, memory)
    shard_rows, ok_mem = shard_memory_rows(run, memory)
    mem_rows += shard_rows
    checks = {
        "batch": f["qps_d"] >= BATCH_BAR * f["qps_raw"]
        and f["qps_def"] >= BATCH_BAR * f["qps_raw"],
        "single": f["p50"] <= SINGLE_BAR * f["n50"],
        "memory": bool(ok_mem and mem_rows),
    }
    rows = batch_rows(f, run) + single_rows(f, run) + recall_rows(f, args.top_k) + mem_rows
    print_report(run, rows)
    if args.json_out:
        with open(args.json_out, "wb") as out:
            results = results_json(run, f, memory, checks)
            out.write(orjson.dumps(results, option=orjson.OPT_INDENT_2 | JSON_OPTS))
        print(f"results written to {args.json_out}")
    passed = checks["batch"] and checks["single"] and ok_mem
    print(
        f"\nbars: {'all PASS' if passed else 'some FAIL'}"
        + ("" if args.check else " (no --check: exit 0)")
    )
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
