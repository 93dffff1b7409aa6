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
from typing import Any

import faiss
import numpy as np
import orjson
from common import (
    JSON_OPTS,
    Client,
    CpuMeter,
    environment,
    faiss_resident_bytes,
    locality_search,
    median,
    pct,
    print_environment,
    print_table,
    random_key,
    recall_at_k,
    result_ids,
    running_service,
    service_internals,
    shard_resident_bytes,
)
from common import clustered as make_clustered

from actors.partition import rank_lists
from actors.shard import TRIM_AFTER_WRITES_S
from actors.training import TrainParams, auto_n_lists, sample_size, train_template

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
        # The service's own recipe: same sample-size rule, same k-means (actors.training).
        size = sample_size(n_lists, service_n, d, None)
        rows = np.sort(np.random.default_rng(0).choice(len(x), size, replace=False))
        index = train_template(x[rows], "ivfflat", n_lists, None, None, TrainParams())
    index.add(x)
    return index


def deploy_floor(n_shards: int) -> None:
    """A bare Serve application on the same Serve instance, under /floor: what any design that
    answers a POST on Serve and asks ``n_shards`` actors pays before doing any work.

    POST /floor/body reads the body and answers; POST /floor/hop also sends the body to
    ``n_shards`` no-op actors at once (one call each, as the gateway calls its shards). Plain
    Serve HTTP (no FastAPI routing), so it is a lower bound."""
    import ray
    from ray import serve
    from starlette.responses import Response

    ok = b'{"ok":true}'

    @ray.remote(num_cpus=0.01)
    class Noop:
        def ping(self, body: bytes) -> bytes:
            return b""

    @serve.deployment(ray_actor_options={"num_cpus": 0.05})
    class Floor:
        def __init__(self, n: int) -> None:
            self.actors = [Noop.remote() for _ in range(n)]  # type: ignore[attr-defined]

        async def __call__(self, request: Any) -> Response:
            body = await request.body()
            if request.url.path.endswith("/hop"):
                await asyncio.gather(*(a.ping.remote(body) for a in self.actors))
            return Response(ok, media_type="application/json")

    serve.run(Floor.bind(n_shards), name="floor", route_prefix="/floor")  # type: ignore[attr-defined]


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
        client.query(body)
    index.search(q, k)
    threads = faiss.omp_get_max_threads()
    svc_times: list[list[float]] = [[] for _ in bodies]
    raw_times: list[float] = []
    raw1_times: list[float] = []
    ordered_times: list[float] = []
    rank = rank_lists(index)
    found_svc: Any = None
    found_raw: Any = None
    for _ in range(repeats):
        for j, body in enumerate(bodies):
            with cpu.measure(CPU_SERVICE) if j == 0 else contextlib.nullcontext():
                t0 = time.perf_counter()
                results = client.query(body)
                svc_times[j].append(time.perf_counter() - t0)
            if j == 0:
                found_svc = results
        with cpu.measure(CPU_RAW):
            t, (_, found_raw) = timed(index.search, q, k)
        raw_times.append(t)
        faiss.omp_set_num_threads(1)
        raw1_times.append(timed(index.search, q, k)[0])
        faiss.omp_set_num_threads(threads)
        t, (_, found_ordered) = timed(locality_search, index, q, k, rank)
        ordered_times.append(t)
        assert (found_ordered == found_raw).all(), "locality order changed raw faiss's results"
    raw_runs = {"raw": raw_times, "raw1": raw1_times, "ordered": ordered_times}
    return svc_times, raw_runs, result_ids(found_svc, k), found_raw


def measure_in_flight(url: str, body: bytes, repeats: int, clients: int = 2) -> list[float]:
    """Seconds per batch with ``clients`` batch requests in flight (one client each, two
    requests per client per round): the service's batch throughput under load, where one
    request's serial phases (Serve's transfer, parsing, the answer) overlap another's search."""
    pool = [Client(url) for _ in range(clients)]
    try:
        with ThreadPoolExecutor(clients) as ex:
            list(ex.map(lambda c: c.query(body), pool))  # warm-up
            per_batch = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(ex.map(lambda c: [c.query(body) for _ in range(2)], pool))
                per_batch.append((time.perf_counter() - t0) / (2 * clients))
        return per_batch
    finally:
        for c in pool:
            c.close()


def measure_single(
    client: Client, bodies: list[bytes], floor: bool, warmup: int = 20
) -> dict[str, list[float]]:
    """Sequential single queries interleaved with the no-op GET /v1/health on the same client
    (and, with ``floor``, the same bodies to the bare /floor app's two routes)."""
    calls: dict[str, Any] = {
        "noop": lambda b: client.health(),
        "query": client.query,
    }
    if floor:
        calls["floor_body"] = lambda b: client.post("/floor/body", b)
        calls["floor_hop"] = lambda b: client.post("/floor/hop", b)
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
    import ray

    from actors.control import CONTROL_NAME, NAMESPACE
    from actors.types import SearchRequest
    from serve_app.engine import Engine, merge
    from serve_app.models import QueryRequest
    from serve_app.results import shape_results
    from serve_app.vectors import as_matrix

    def med(fn: Any, *a: Any) -> tuple[float, Any]:
        fn(*a)  # warm
        runs = [timed(fn, *a) for _ in range(reps)]
        return median([t for t, _ in runs]), runs[-1][1]

    with_meta = "metadata" in include
    t_enc, body = med(client.query_body, INDEX, key, q, k, nprobe, False, include)
    t_rt, r = med(lambda: client.http.post("/v1/vectors/query", content=body))
    # The same body to an unknown index: Serve ingress + body transfer + parse + as_matrix + one
    # control-plane lookup, then 404 - the request-side cost without any search.
    body404 = client.query_body("no-such-index", key, q, k, nprobe, False, include)
    t_404, r404 = med(lambda: client.http.post("/v1/vectors/query", content=body404))
    assert r404.status_code == 404, r404.status_code
    one404 = client.query_body("no-such-index", key, q[0], k, nprobe, False, include)
    t_404_1 = median(
        [timed(client.http.post, "/v1/vectors/query", content=one404)[0] for _ in range(50)]
    )
    t_dec, parsed = med(orjson.loads, r.content)
    t_ids, _ = med(result_ids, parsed["results"], k)

    # The gateway's steps with one faiss thread (Ray gives a fractional-CPU replica one).
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        t_json, obj = med(orjson.loads, body)
        t_model, model = med(QueryRequest.model_validate, obj)
        t_mat, (x, _) = med(as_matrix, model.query_vectors, "query_vectors")
        engine = Engine(ray.get_actor(CONTROL_NAME, namespace=NAMESPACE))
        cv = asyncio.run(engine.view(INDEX, key))
        t_plan, (lists, coarse) = med(engine.plan, cv, x, nprobe)
        req = SearchRequest(x, k, cv.config.version, lists, coarse, None, False, with_meta)

        def fan_out(req: SearchRequest) -> Any:
            return ray.get([s.search.remote(cv.key, req) for s in cv.view.shards])

        def ping() -> Any:
            return ray.get([s.ping.remote() for s in cv.view.shards])

        t_fan, parts = med(fan_out, req)
        t_merge, hits = med(merge, [p[0] for p in parts], k, with_meta)
        t_shape, results = med(
            shape_results, hits, cv.config.metric, "distance" in include, with_meta
        )
        t_render, out = med(orjson.dumps, {"results": results}, JSON_OPTS)

        # faiss work alone: the same preassigned lists on the unsharded raw index, one thread.
        dist = np.empty((len(x), k), dtype=np.float32)
        lab = np.empty((len(x), k), dtype=np.int64)

        def preassigned() -> None:
            raw.search_preassigned(x, k, lists, coarse, D=dist, I=lab)

        t_faiss, _ = med(preassigned)
        # The single-query path and the bare Ray actor-call floor.
        x1 = x[:1]
        l1, c1 = engine.plan(cv, x1, nprobe)
        req1 = SearchRequest(x1, k, cv.config.version, l1, c1, None, False, with_meta)
        t_one = median([timed(fan_out, req1)[0] for _ in range(50)])
        t_ping = median([timed(ping)[0] for _ in range(50)])
    finally:
        faiss.omp_set_num_threads(threads)
    server = t_json + t_model + t_mat + t_plan + t_fan + t_merge + t_shape + t_render
    return [
        ("client: encode request (orjson)", t_enc, f"{len(body) / 1e6:.2f} MB"),
        (
            "client: POST round trip (send, server, receive)",
            t_rt,
            f"response {len(r.content) / 1e6:.2f} MB",
        ),
        ("client: decode response (orjson)", t_dec, ""),
        ("  same body, unknown index -> 404 (no search)", t_404, "ingress + parse + 1 lookup"),
        ("client: results -> id matrix", t_ids, ""),
        ("gateway step: orjson.loads(body)", t_json, "re-run in this process"),
        ("gateway step: QueryRequest.model_validate", t_model, ""),
        ("gateway step: as_matrix (lists -> float32)", t_mat, ""),
        ("gateway step: coarse quantizer (1 thread)", t_plan, f"n_probes={nprobe}"),
        (
            "gateway step: shard fan-out (Ray calls)",
            t_fan,
            f"{len(cv.view.shards)} shards, in parallel",
        ),
        ("  of which faiss work (all shards, 1 thread)", t_faiss, "search_preassigned, unsharded"),
        ("gateway step: merge per-shard top-k", t_merge, ""),
        ("gateway step: shape_results (dicts)", t_shape, ""),
        ("gateway step: render JSON (orjson)", t_render, f"{len(out) / 1e6:.2f} MB"),
        ("sum of gateway steps", server, ""),
        ("round trip - gateway steps", t_rt - server, "Serve proxy + ASGI + transfer"),
        ("single query, unknown index -> 404 (no search)", t_404_1, "median of 50, over HTTP"),
        ("single query: shard fan-out (1 query)", t_one, "median of 50, re-run here"),
        ("bare Ray call to every shard: ping", t_ping, "median of 50, Ray floor"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    threads = args.threads or env["cores"] or 1
    faiss.omp_set_num_threads(threads)
    env["raw_faiss_threads"] = threads
    print_environment(env)
    k, n, nq = args.top_k, args.n, args.queries
    n_lists = args.n_lists or auto_n_lists(n)
    print(
        f"data: clustered {n:,} x {args.dim} + {nq:,} held-out queries, ivfflat, n_lists={n_lists}, top_k={k}"
    )
    data = make_clustered(n + nq, args.dim, seed=args.seed)
    x, q = np.ascontiguousarray(data[:n]), np.ascontiguousarray(data[n:])
    ids = [str(i) for i in range(n)]
    t_exact, (_, truth) = timed(lambda: faiss_exact(x, q, k))
    print(f"exact ground truth (faiss IndexFlatL2): {t_exact:.1f}s")

    key = random_key()
    overrides = {"shards": args.shards} if args.shards else {}
    results: dict[str, Any] = {"env": env, "params": vars(args) | {"n_lists": n_lists}}
    with running_service(**overrides) as svc:
        client = Client(svc.url)
        client.create(INDEX, key, args.dim)
        # One item in and out: every shard is up and has loaded its code before the baseline.
        one = {"index_name": INDEX, "index_key": key}
        client.post("/v1/vectors/upsert", one | {"items": [{"id": "-", "vector": x[0]}]})
        client.post("/v1/vectors/delete", one | {"ids": ["-"]})
        time.sleep(1.0)
        mem0 = shard_resident_bytes()
        # In two halves, training after each: what the second half adds after training is what
        # a vector costs; what the first half added beyond that is fixed (allocated once per
        # shard process: BLAS buffers, code loaded on first use).
        half = n // 2
        label = f"{args.batch_size}/request"
        t_ingest = client.upsert(INDEX, key, x[:half], ids[:half], args.batch_size, label=label)
        client.train(INDEX, key, n_lists)
        time.sleep(SETTLE_S)
        mem_half_trained = shard_resident_bytes()
        t_ingest += client.upsert(INDEX, key, x[half:], ids[half:], args.batch_size, label=label)
        time.sleep(SETTLE_S)
        mem_ingest = shard_resident_bytes()
        t_train, status = client.train(INDEX, key, n_lists)
        time.sleep(SETTLE_S)
        mem_train = shard_resident_bytes()
        desc = client.describe(INDEX, key)
        print(
            f"ingest {t_ingest:.1f}s ({n / t_ingest:,.0f} items/s), train {t_train:.1f}s ({status}); "
            f"describe: n_lists={desc['index_config']['n_lists']} num_vectors={desc['num_vectors']:,}"
        )
        try:
            cfg, centroids = service_internals(INDEX, key)
            auto_nprobe = cfg.auto_nprobe(k)
            table = cfg.nprobe_table
            n_shards: int | str = cfg.n_shards
        except Exception as exc:  # the internals are a convenience, not part of the API
            print(f"(could not read the service's centroids / n_probes table: {exc!r})")
            centroids, auto_nprobe, table, n_shards = None, None, (), "?"
        nprobe = args.n_probes or auto_nprobe or 16
        print(
            f"n_probes={nprobe} (service automatic for top_k={k}: {auto_nprobe}; calibration table {table})"
        )

        source = args.raw_centroids if centroids is not None else "own"
        t_build, index = timed(raw_index, x, centroids, n_lists, source, n)
        index.nprobe = nprobe
        print(
            f"raw faiss IndexIVFFlat built in {t_build:.1f}s with {source} centroids, {threads} threads"
        )

        faiss_bytes = len(faiss.serialize_index(index)) / n  # faiss's own index, per vector
        faiss_resident: dict[str, float | None] = {}
        if centroids is not None and isinstance(n_shards, int):
            # As the shards were filled (each gets its share of every upsert request), and as a
            # training rebuild fills them (everything at once).
            faiss_resident = {
                "in the shards' batches": faiss_resident_bytes(
                    x, centroids, max(1, args.batch_size // n_shards)
                ),
                "at once": faiss_resident_bytes(x, centroids, n),
            }

        inc_d = ["distance"]
        body_d = client.query_body(INDEX, key, q, k, nprobe, include=inc_d)
        body_default = client.query_body(INDEX, key, q, k, nprobe)
        cpu = CpuMeter()
        (bt_d, bt_def), raw_runs, found_svc, found_raw = measure_batches(
            client, [body_d, body_default], index, q, k, args.repeats, cpu
        )
        rt_b, rt_b1 = raw_runs["raw"], raw_runs["raw1"]
        bt_flight = measure_in_flight(svc.url, body_d, args.repeats)

        singles = [
            client.query_body(INDEX, key, q[i % nq], k, nprobe, include=inc_d)
            for i in range(args.single)
        ]
        try:
            deploy_floor(n_shards if isinstance(n_shards, int) else 2)
            floor = True
        except Exception as exc:  # the floor is a reference point, not part of the service
            print(f"(could not deploy the /floor reference app: {exc!r})")
            floor = False
        st = measure_single(client, singles, floor)
        batch_floor: list[float] = []
        if floor:  # the batch body through Serve, answered without work: Serve's own share
            client.post("/floor/body", body_d)
            for _ in range(args.repeats):
                batch_floor.append(timed(client.post, "/floor/body", body_d)[0])
        st_q, st_noop = st["query"], st["noop"]
        st_raw = raw_single(index, q, k, args.single)

        print("profiling one batch request ...", flush=True)
        prof = profile_batch(client, key, q, k, nprobe, inc_d, index)
        client.close()

    qps_d, qps_def, qps_raw = nq / median(bt_d), nq / median(bt_def), nq / median(rt_b)
    qps_raw1 = nq / median(rt_b1)
    qps_ordered = nq / median(raw_runs["ordered"])
    qps_flight = nq / median(bt_flight)
    p50, p99 = pct(st_q, 50) * 1e3, pct(st_q, 99) * 1e3
    n50, n99 = pct(st_noop, 50) * 1e3, pct(st_noop, 99) * 1e3
    r50, r99 = pct(st_raw, 50) * 1e3, pct(st_raw, 99) * 1e3
    rec_svc, rec_raw = recall_at_k(found_svc, truth, k), recall_at_k(found_raw, truth, k)
    same = float(np.mean([set(a) == set(b) for a, b in zip(found_svc, found_raw)]))

    floor_rows = []
    for name, label in (
        ("floor_body", "floor: bare Serve POST, same body (ms)"),
        ("floor_hop", f"floor: same + 1 no-op call x {n_shards} actors (ms)"),
    ):
        if name in st:
            f50 = pct(st[name], 50) * 1e3
            floor_rows.append(
                [label, f"{f50:.2f}", f"{n50:.2f} (no-op)", f"{f50 / n50:.2f}x", "-", "info"]
            )

    if "floor_body" in st:
        # Against a no-op that takes the same POST body: GET /v1/health has no body, and Serve
        # fetches a POST body from its proxy with one more actor call.
        b50 = pct(st["floor_body"], 50) * 1e3
        floor_rows.append(
            [
                "single query p50 vs POST no-op (ms)",
                f"{p50:.2f}",
                f"{b50:.2f} (POST no-op)",
                f"{p50 / b50:.2f}x",
                "-",
                "info",
            ]
        )
    batch_floor_rows = []
    if batch_floor:
        # Serve's transfer of the same request body (answered with a few bytes, no work): no
        # gateway code avoids it, so next to raw faiss's batch time it bounds the batch ratio.
        fb = median(batch_floor)
        batch_floor_rows.append(
            [
                "floor: batch body to a bare Serve POST (ms)",
                f"{fb * 1e3:.1f}",
                f"{median(rt_b) * 1e3:.1f} (raw faiss batch)",
                f"{fb / median(rt_b):.2f}x",
                "-",
                "info",
            ]
        )
    memory: dict[str, float] = {"faiss_index_bytes_per_vector": faiss_bytes}
    mem_rows = []
    for how, per_vector in faiss_resident.items():
        if per_vector is None:
            continue
        memory[f"faiss_resident_bytes_per_vector_added_{how.split()[-1]}"] = per_vector
        mem_rows.append(
            [
                f"raw faiss resident, added {how} (bytes/vector)",
                f"{per_vector:,.0f}",
                f"{faiss_bytes:,.0f} (faiss index)",
                f"{per_vector / faiss_bytes:.2f}x",
                "-",
                "info",
            ]
        )
    ok_mem = True
    readings = (mem0, mem_half_trained, mem_ingest, mem_train)
    if all(r is not None for r in readings):
        m0, m_half_trained, m_ingest, m_train = (float(r or 0) for r in readings)
        marginal = (m_train - m_half_trained) / (n - half)  # per vector, trained both times
        fixed = max(0.0, m_half_trained - m0 - marginal * half)  # all shards, bytes
        shards = n_shards if isinstance(n_shards, int) else 2
        memory["fixed_bytes_per_shard"] = fixed / shards
        for name, label, spread, per in (
            (
                "after_ingest",
                "shard memory after ingest (bytes/vector)",
                (m_ingest - m0) / n,
                (m_ingest - m0 - fixed) / n,  # the second half went into trained lists
            ),
            (
                "after_training",
                "shard memory after training (bytes/vector)",
                (m_train - m0) / n,
                marginal,
            ),
        ):
            memory[name] = per
            memory[name + "_with_fixed_part"] = spread
            ok = per <= MEMORY_BAR * faiss_bytes
            ok_mem &= ok
            for row_label, value, bar, verdict_ in (
                (label, per, f"<= {MEMORY_BAR}x", "PASS" if ok else "FAIL"),
                ("  the same with the fixed part spread over the vectors", spread, "-", "info"),
            ):
                mem_rows.append(
                    [
                        row_label,
                        f"{value:,.0f}",
                        f"{faiss_bytes:,.0f} (faiss index)",
                        f"{value / faiss_bytes:.2f}x",
                        bar,
                        verdict_,
                    ]
                )
        mem_rows.append(
            [
                "shard memory, fixed part per shard (MB)",
                f"{fixed / shards / 1e6:.1f}",
                "-",
                "-",
                "-",
                "info",
            ]
        )

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    ok_b_d = qps_d >= BATCH_BAR * qps_raw
    ok_b_def = qps_def >= BATCH_BAR * qps_raw
    ok_s = p50 <= SINGLE_BAR * n50
    rows = [
        [
            "batch QPS, JSON, include=[distance]",
            f"{qps_d:,.0f}",
            f"{qps_raw:,.0f} (raw faiss)",
            f"{qps_d / qps_raw:.3f}x",
            f">= {BATCH_BAR}x",
            verdict(ok_b_d),
        ],
        [
            "batch QPS, JSON, default include",
            f"{qps_def:,.0f}",
            f"{qps_raw:,.0f} (raw faiss)",
            f"{qps_def / qps_raw:.3f}x",
            f">= {BATCH_BAR}x",
            verdict(ok_b_def),
        ],
        [
            "batch QPS vs raw faiss on 1 thread",
            f"{qps_d:,.0f}",
            f"{qps_raw1:,.0f} (raw, 1 thread)",
            f"{qps_d / qps_raw1:.3f}x",
            "-",
            "info",
        ],
        [
            "batch QPS, JSON, 2 requests in flight",
            f"{qps_flight:,.0f}",
            f"{qps_raw:,.0f} (raw faiss)",
            f"{qps_flight / qps_raw:.3f}x",
            "-",
            "info",
        ],
        [
            "faiss in locality order vs raw faiss",
            f"{qps_ordered:,.0f}",
            f"{qps_raw:,.0f} (raw faiss)",
            f"{qps_ordered / qps_raw:.3f}x",
            "-",
            "info",
        ],
        *batch_floor_rows,
        [
            "single query p50 (ms)",
            f"{p50:.2f}",
            f"{n50:.2f} (no-op)",
            f"{p50 / n50:.2f}x",
            f"<= {SINGLE_BAR}x",
            verdict(ok_s),
        ],
        [
            "single query p99 (ms)",
            f"{p99:.2f}",
            f"{n99:.2f} (no-op)",
            f"{p99 / n99:.2f}x",
            "-",
            "info",
        ],
        *floor_rows,
        [
            "single query p50 vs raw faiss (ms)",
            f"{p50:.2f}",
            f"{r50:.3f} (raw faiss)",
            f"{p50 / r50:.0f}x",
            "-",
            "info",
        ],
        [
            "single query p99 vs raw faiss (ms)",
            f"{p99:.2f}",
            f"{r99:.3f} (raw faiss)",
            f"{p99 / r99:.0f}x",
            "-",
            "info",
        ],
        [
            f"recall@{k} vs exact",
            f"{rec_svc:.4f}",
            f"{rec_raw:.4f} (raw faiss)",
            f"{rec_svc - rec_raw:+.4f}",
            "-",
            "info",
        ],
        [f"identical top-{k} sets service vs raw", f"{same:.4f}", "-", "-", "-", "info"],
        *mem_rows,
    ]
    print_table(
        ["metric", "service", "raw faiss / no-op", "ratio", "bar", "result"],
        rows,
        title=(
            f"vaultvec vs raw faiss: N={n:,} d={args.dim} ivfflat n_lists={n_lists} n_probes={nprobe} "
            f"top_k={k}; batch={nq:,} queries x {args.repeats} interleaved repeats (median); single={args.single} "
            f"requests; raw faiss threads={threads}; service shards={n_shards}"
        ),
    )
    cpu.table(
        CPU_RAW,
        title=(
            f"CPU milliseconds per {nq:,}-query batch (all processes on the machine, median), by "
            f"process: on {env['cores']} cores the service is bounded by its total CPU"
        ),
    )
    print_table(
        ["phase of one batch request", "ms", "note"],
        [[name, f"{t * 1e3:.1f}", note] for name, t, note in prof],
        title=f"where the time goes (one {nq:,}-query request, include=[distance]; median of 5 each)",
    )
    print(
        f"\ningest {t_ingest:.1f}s ({n / t_ingest:,.0f} items/s over HTTP), training {t_train:.1f}s"
    )
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print_environment(env)

    results.update(
        ingest_s=t_ingest,
        train_s=t_train,
        n_probes=nprobe,
        auto_n_probes=auto_nprobe,
        nprobe_table=[list(p) for p in table],
        raw_centroids=source,
        batch={
            "service_qps_distance": qps_d,
            "service_qps_default_include": qps_def,
            "raw_faiss_qps": qps_raw,
            "raw_faiss_qps_1_thread": qps_raw1,
            "ratio_distance": qps_d / qps_raw,
            "ratio_default_include": qps_def / qps_raw,
            "bar": BATCH_BAR,
            "pass": bool(ok_b_d and ok_b_def),
            "service_s": bt_d,
            "service_default_s": bt_def,
            "raw_s": rt_b,
            "raw_1_thread_s": rt_b1,
            "service_qps_2_in_flight": qps_flight,
            "service_2_in_flight_s_per_batch": bt_flight,
            "locality_order_faiss_qps": qps_ordered,
            "locality_order_faiss_s": raw_runs["ordered"],
            "serve_floor_s": batch_floor,
        },
        single={
            "service_p50_ms": p50,
            "service_p99_ms": p99,
            "noop_p50_ms": n50,
            "noop_p99_ms": n99,
            "raw_faiss_p50_ms": r50,
            "raw_faiss_p99_ms": r99,
            "ratio_p50": p50 / n50,
            **{
                f"{name}_p50_ms": pct(st[name], 50) * 1e3 for name in st if name.startswith("floor")
            },
            "bar": SINGLE_BAR,
            "pass": bool(ok_s),
        },
        recall={"service": rec_svc, "raw_faiss": rec_raw, "identical_sets": same},
        memory=memory | {"bar": MEMORY_BAR, "pass": bool(ok_mem and mem_rows)},
        profile_ms={name: t * 1e3 for name, t, _ in prof},
    )
    if args.json_out:
        with open(args.json_out, "wb") as f:
            f.write(orjson.dumps(results, option=orjson.OPT_INDENT_2 | JSON_OPTS))
        print(f"results written to {args.json_out}")
    passed = ok_b_d and ok_b_def and ok_s and ok_mem
    print(
        f"\nbars: {'all PASS' if passed else 'some FAIL'}"
        + ("" if args.check else " (no --check: exit 0)")
    )
    return 1 if args.check and not passed else 0


def faiss_exact(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    flat = faiss.IndexFlatL2(x.shape[1])
    flat.add(x)
    return flat.search(q, k)


if __name__ == "__main__":
    sys.exit(main())
