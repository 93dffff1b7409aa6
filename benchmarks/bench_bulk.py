"""The bulk-query driver vs raw in-process faiss, side by side in one run.

On a synthetic clustered set (default 100k x 128, ivfflat) this starts vaultvec in-process,
ingests with the Python client (binary route), trains, and then answers the same 10,000 queries
(top_k 10, the same n_probes everywhere, the service's own centroids for raw faiss) with:

* raw faiss in-process: IndexIVFFlat.search over all queries, on all cores and on one thread
  (the faster of the two is the baseline);
* raw faiss searching in the shards' locality order (info): the scan order alone, without the
  service, so that a reader sees how much of a ratio is the order and how much the service;
* raw faiss in a fresh Python process (info, after the rounds): the same index and queries
  without this process's state (its heap after the driver's runs, Ray's threads), which moves
  the in-process baseline by 10-20% on a small VM; the row gives the binary and Ray paths'
  ratios to it as well;
* the bulk driver (cluster.bulk.bulk_query, .npy in -> .npy out) over HTTP with JSON bodies;
* the bulk driver over HTTP with the binary routes;
* the bulk driver over the Ray transport (DeploymentHandle on the Serve app, no HTTP).

Rounds are interleaved (raw, json, binary, ray, repeated) and medians reported as QPS and
ratios to raw faiss. Bars: binary path and Ray transport >= 0.95x raw faiss. A second table
gives each run's CPU by process (Linux /proc: this process, gateway, shards, Serve proxy, Ray's
own daemons): when the service and raw faiss share the same few cores, the ratio of their
total CPU bounds the QPS ratio.

Ray starts its worker processes (the gateway, the shards) at niceness 15. Once the service is
up, this process (raw faiss and the driver) moves to the same niceness, so that whatever else
runs on the machine weighs on both sides alike; --no-equal-niceness keeps it as it is.

Usage: .venv/bin/python benchmarks/bench_bulk.py [--n 100000] [--queries 10000] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from common import (
    API_KEY,
    CpuMeter,
    connect,
    environment,
    faiss_fresh_process_qps,
    locality_search,
    median,
    print_environment,
    print_table,
    recall_at_k,
    running_service,
    service_internals,
    train_and_wait,
    upsert_batches,
)

from actors.control.training import auto_n_lists
from actors.engine.locality import rank_lists
from cluster import bulk
from cluster.client import generate_key
from tests.helpers import clustered, exact_knn

BAR = 0.95  # binary path and Ray transport >= 0.95x raw faiss QPS
WORKER_NICENESS = int(os.environ.get("RAY_worker_niceness", "15"))  # noqa: SIM112 (Ray's name)
INDEX = "bulk-bench"
# raw faiss with the shards' scan order (info): what of a ratio is the order, not the service
LOCALITY = "faiss, {threads} threads, locality order"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=100_000, help="vectors in the index")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--n-lists", type=int, default=0, help="0 = automatic rule")
    p.add_argument("--n-probes", type=int, default=0, help="0 = the service's automatic value")
    p.add_argument(
        "--batch-size", type=int, default=0, help="driver batch; 0 = the driver's default"
    )
    p.add_argument("--concurrency", type=int, default=0, help="0 = the CLI default")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--threads", type=int, default=0, help="raw faiss threads; 0 = all cores")
    p.add_argument("--shards", type=int, default=0, help="shards per index; 0 = service default")
    p.add_argument(
        "--gateway-threads",
        type=int,
        default=None,
        help="the service's gateway_threads setting (default: the service default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also try other batch sizes/concurrency")
    p.add_argument(
        "--no-equal-niceness",
        dest="equal_niceness",
        action="store_false",
        help="keep this process at its niceness instead of Ray workers' (15)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a bar is missed")
    return p.parse_args(argv)


def raw_index(x: np.ndarray, centroids: np.ndarray, n_lists: int) -> faiss.IndexIVFFlat:
    d = x.shape[1]
    quantizer = faiss.IndexFlatL2(d)
    quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    index = faiss.IndexIVFFlat(quantizer, d, n_lists, faiss.METRIC_L2)
    index.is_trained = True
    index.own_fields = True
    quantizer.this.disown()
    index.add(x)
    return index


async def run_driver(
    transport: Any, qfile: Path, out: Path, opts: bulk.QueryOptions, batch: int, conc: int
) -> tuple[float, np.ndarray]:
    """One complete bulk-query run (.npy in, .npy out); (seconds, result ids)."""
    t0 = time.perf_counter()
    report = await bulk.bulk_query(
        qfile,
        out,
        transport,
        opts,
        index=INDEX,
        batch_size=batch,
        concurrency=conc,
        overwrite=True,
        show_progress=False,
    )
    t = time.perf_counter() - t0
    assert report.ok, report.summary()
    return t, np.load(out)["ids"]


async def measure(
    transports: dict[str, Any],
    index: faiss.Index,
    q: np.ndarray,
    k: int,
    qfile: Path,
    out: Path,
    opts: bulk.QueryOptions,
    batch: int,
    conc: int,
    args: argparse.Namespace,
    threads: int,
    cpu: CpuMeter,
) -> tuple[dict[str, list[float]], dict[str, np.ndarray], np.ndarray, list[list[Any]]]:
    """Interleaved rounds in one event loop: raw faiss (all cores, then one thread), then each
    transport; then the optional batch-size / concurrency sweep. ``cpu`` records every
    process's CPU during each timed run."""
    raw_all, raw_one = f"raw faiss, {threads} threads", "raw faiss, 1 thread"
    ordered = LOCALITY.format(threads=threads)
    times: dict[str, list[float]] = {
        raw_all: [],
        raw_one: [],
        ordered: [],
        **{n: [] for n in transports},
    }
    rank = rank_lists(index)
    found: dict[str, np.ndarray] = {}
    index.search(q, k)  # warm-up
    for t in transports.values():
        await run_driver(t, qfile, out, opts, batch, conc)
    # What the locality order must not change: the same coarse step, the queries in request
    # order. (Not index.search's answer: it runs its coarse step per thread's slice of the
    # queries, and BLAS may round a distance differently on another slice, which can pick
    # another list at the n_probes-th place.)
    faiss.omp_set_num_threads(threads)
    coarse, lists = index.quantizer.search(q, index.nprobe)
    in_order = index.search_preassigned(q, k, lists, coarse)
    raw: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(args.repeats):
        for name, nthreads in ((raw_all, threads), (raw_one, 1)):
            faiss.omp_set_num_threads(nthreads)
            with cpu.measure(name):
                t0 = time.perf_counter()
                raw[name] = index.search(q, k)
                times[name].append(time.perf_counter() - t0)
        faiss.omp_set_num_threads(threads)
        with cpu.measure(ordered):
            t0 = time.perf_counter()
            ordered_d, ordered_ids = locality_search(index, q, k, rank)
            times[ordered].append(time.perf_counter() - t0)
        assert (ordered_d == in_order[0]).all() and (ordered_ids == in_order[1]).all(), (
            "locality order changed raw faiss's results"
        )
        for name, t in transports.items():
            with cpu.measure(name):
                sec, ids = await run_driver(t, qfile, out, opts, batch, conc)
            times[name].append(sec)
            found[name] = ids
    raw_ids = raw[raw_all][1] if raw else np.empty(0)
    sweep: list[list[Any]] = []
    if args.sweep:
        for b, c in ((500, 2), (1000, 1), (1000, 2), (1000, 4), (2500, 2), (5000, 2), (10000, 1)):
            row: list[Any] = [f"batch {b}, concurrency {c}"]
            for name in ("driver, HTTP binary", "driver, Ray transport"):
                runs = [
                    (await run_driver(transports[name], qfile, out, opts, b, c))[0]
                    for _ in range(3)
                ]
                row.append(f"{len(q) / median(runs):,.0f}")
            sweep.append(row)
    for t in transports.values():
        await t.close()
    return times, found, raw_ids, sweep


@dataclass
class Setup:
    """The run's parameters and data: ``n`` vectors ``x``, ``nq`` queries ``q`` (also saved in
    ``qfile`` for the driver, under the temp dir ``tmp``)."""

    k: int
    n: int
    nq: int
    dim: int
    batch: int
    conc: int
    n_lists: int
    threads: int
    x: np.ndarray
    q: np.ndarray
    tmp: Path

    @property
    def qfile(self) -> Path:
        return self.tmp / "queries.npy"


@dataclass
class Measured:
    """What the interleaved rounds and the runs after them measured."""

    times: dict[str, list[float]]
    found: dict[str, np.ndarray]
    raw_ids: np.ndarray
    sweep: list[list[Any]]
    fresh_qps: float | None
    n_lists: int
    nprobe: int
    transports: list[str]


def prepare(args: argparse.Namespace, threads: int) -> Setup:
    k, n, nq = args.top_k, args.n, args.queries
    print(f"data: clustered {n:,} x {args.dim} + {nq:,} held-out queries, ivfflat, top_k={k}")
    data = clustered(n + nq, args.dim, seed=args.seed)
    conc = args.concurrency or bulk.DEFAULT_CONCURRENCY
    s = Setup(
        k=k,
        n=n,
        nq=nq,
        dim=args.dim,
        batch=bulk.query_batch(nq, conc, args.batch_size or None),
        conc=conc,
        n_lists=args.n_lists or auto_n_lists(n),
        threads=threads,
        x=np.ascontiguousarray(data[:n]),
        q=np.ascontiguousarray(data[n:]),
        tmp=Path(tempfile.mkdtemp(prefix="vvbulk-")),
    )
    np.save(s.qfile, s.q)
    return s


def ingest_and_train(url: str, key: str, s: Setup) -> None:
    """Create the index, upsert with the client (binary route) and train it."""
    with connect(url) as client:
        idx = client.create_index(INDEX, key, dimension=s.dim)
        ids = [str(i) for i in range(s.n)]
        t_ingest = upsert_batches(idx, s.x, ids, 20_000, label="client")
        t_train, _ = train_and_wait(client, idx, s.n_lists)
    print(
        f"ingest {t_ingest:.1f}s ({s.n / t_ingest:,.0f} vectors/s, client, binary route), "
        f"train {t_train:.1f}s"
    )


def equal_niceness(env: dict[str, Any], equal: bool) -> None:
    if equal:
        # Ray runs its workers (gateway, shards) at niceness 15: measure raw faiss and the
        # driver at the same priority, so that load from other processes on the machine
        # weighs on both sides alike (no effect on an idle machine).
        os.nice(WORKER_NICENESS - os.nice(0))
    env["niceness"] = os.nice(0)


def transports_for(url: str, key: str) -> dict[str, Any]:
    from ray import serve

    return {
        "driver, HTTP JSON": bulk.HttpTransport(url, API_KEY, INDEX, key, wire="json"),
        "driver, HTTP binary": bulk.HttpTransport(url, API_KEY, INDEX, key, wire="binary"),
        "driver, Ray transport": bulk.RayTransport(serve.get_app_handle("vaultvec"), INDEX, key),
    }


def measure_service(
    url: str, key: str, s: Setup, args: argparse.Namespace, cpu: CpuMeter
) -> Measured:
    """raw faiss on the service's centroids against the driver's transports, interleaved; then
    raw faiss in a fresh process."""
    cfg, centroids = service_internals(INDEX, key)
    assert centroids is not None, "the index was trained above"
    nprobe = args.n_probes or cfg.auto_nprobe(s.k)
    print(f"n_lists={cfg.n_lists} n_probes={nprobe} shards={cfg.n_shards}")
    index = raw_index(s.x, centroids, cfg.n_lists)
    index.nprobe = nprobe
    opts = bulk.QueryOptions(top_k=s.k, n_probes=nprobe, include=("distance",))
    transports = transports_for(url, key)
    times, found, raw_ids, sweep = asyncio.run(
        measure(
            transports,
            index,
            s.q,
            s.k,
            s.qfile,
            s.tmp / "out.npy",
            opts,
            s.batch,
            s.conc,
            args,
            s.threads,
            cpu,
        )
    )
    fresh = faiss_fresh_process_qps(s.x, centroids, s.q, nprobe, s.k, s.threads, args.repeats)
    return Measured(times, found, raw_ids, sweep, fresh, cfg.n_lists, nprobe, list(transports))


def raw_rows(m: Measured, s: Setup, qps: dict[str, float], best_raw: str) -> list[list[Any]]:
    """The raw faiss rows: in-process runs (the faster one is the baseline) and, as info, the
    fresh process with the binary and Ray ratios to it."""
    raw_qps = qps[best_raw]
    rows = []
    raw_names = [name for name in qps if name.startswith("raw faiss")]
    for name in [*raw_names, LOCALITY.format(threads=s.threads)]:
        note = "baseline (the faster raw run)" if name == best_raw else "info"
        rows.append(
            [
                name + " (in-process)",
                f"{qps[name]:,.0f}",
                f"{qps[name] / raw_qps:.3f}x",
                "-",
                note,
                "-",
            ]
        )
    if m.fresh_qps is not None:
        against = ", ".join(
            f"{name.split(', ')[-1]} {qps[name] / m.fresh_qps:.3f}x"
            for name in m.transports
            if "JSON" not in name
        )
        rows.append(
            [
                f"raw faiss, {s.threads} threads (fresh process)",
                f"{m.fresh_qps:,.0f}",
                f"{m.fresh_qps / raw_qps:.3f}x",
                "-",
                f"info; {against} of it",
                "-",
            ]
        )
    return rows


def transport_rows(
    m: Measured, qps: dict[str, float], raw_qps: float
) -> tuple[list[list[Any]], bool]:
    """One row per transport against raw faiss; whether every barred one passed."""
    rows, passed = [], True
    for name in m.transports:
        ratio = qps[name] / raw_qps
        ids = np.where(m.found[name] == "", "-1", m.found[name]).astype(np.int64)
        same = float(np.mean([set(a) == set(b) for a, b in zip(ids, m.raw_ids)]))
        has_bar = "JSON" not in name
        ok = ratio >= BAR
        passed &= ok or not has_bar
        rows.append(
            [
                name,
                f"{qps[name]:,.0f}",
                f"{ratio:.3f}x",
                f">= {BAR}x" if has_bar else "-",
                ("PASS" if ok else "FAIL") if has_bar else "info",
                f"{same:.4f}",
            ]
        )
    return rows, passed


def report(
    m: Measured, s: Setup, args: argparse.Namespace, env: dict[str, Any], cpu: CpuMeter
) -> bool:
    """Print the tables; whether every bar passed."""
    qps = {name: s.nq / median(ts) for name, ts in m.times.items()}
    best_raw = max((name for name in qps if name.startswith("raw faiss")), key=lambda n: qps[n])
    rows, passed = transport_rows(m, qps, qps[best_raw])
    print_table(
        ["path", "QPS", "vs raw faiss", "bar", "result", "same top-k as raw"],
        raw_rows(m, s, qps, best_raw) + rows,
        title=(
            f"bulk query: N={s.n:,} d={s.dim} ivfflat n_lists={m.n_lists} n_probes={m.nprobe} "
            f"top_k={s.k}, {s.nq:,} queries; driver batch={s.batch} concurrency={s.conc} (.npy in, "
            f".npy out); {args.repeats} interleaved rounds (median)"
        ),
    )
    print(
        "times (s): "
        + "; ".join(f"{name}: " + " ".join(f"{t:.3f}" for t in ts) for name, ts in m.times.items())
    )
    cpu.table(
        best_raw,
        title=(
            "CPU milliseconds per run (all processes on the machine, median), by process: on "
            f"{env['cores']} cores the service is bounded by its total CPU"
        ),
    )
    if m.sweep:
        print_table(
            ["driver config", "HTTP binary QPS", "Ray transport QPS"],
            m.sweep,
            title="batch size / concurrency sweep (median of 3 runs each, info)",
        )
    return passed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    threads = args.threads or env["cores"] or 1
    faiss.omp_set_num_threads(threads)
    env["raw_faiss_threads"] = threads
    print_environment(env)
    s = prepare(args, threads)
    key = generate_key()
    cpu = CpuMeter()
    overrides: dict[str, Any] = {"shards": args.shards} if args.shards else {}
    if args.gateway_threads is not None:
        overrides["gateway_threads"] = args.gateway_threads
    try:
        with running_service(**overrides) as svc:
            ingest_and_train(svc.url, key, s)
            equal_niceness(env, args.equal_niceness)
            m = measure_service(svc.url, key, s, args, cpu)
    finally:
        shutil.rmtree(s.tmp, ignore_errors=True)
    passed = report(m, s, args, env, cpu)
    _, truth = exact_knn(s.x, s.q, s.k)
    print(f"recall@{s.k} of raw faiss vs exact: {recall_at_k(m.raw_ids, truth, s.k):.4f}")
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print_environment(env)
    print(f"\nbars: {'all PASS' if passed else 'some FAIL'}")
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
