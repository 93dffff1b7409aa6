"""One index as large as one default server holds: ingest, training, memory per vector, restart,
latency, throughput and recall, beside raw faiss on the same data in the same run.

``vaultvec serve`` is started as a user starts it (its own process group, Ray temp dir, data
directory or a PostgreSQL database, API key and port; automatic training off so that the
training is timed on its own). N clustered vectors (``--dim`` dimensions, 1,000 Gaussian
clusters; generated in pieces, so 10M × 128 needs no more than its 5 GB, and again piece by
piece for the upserts, so that this process does not hold them beside the service) are
upserted over the compact array route in requests of 20,000, then the index is trained
(``--n-lists``, 0 for automatic). Then:

- resident bytes per vector: the PSS of every process of the service (benchmarks/footprint.py)
  after training, less its PSS with the index created but empty (its shard actors up), over
  N, beside the raw float32 bytes (4 × dim); the same for the shard actors' processes alone,
  and both again after the restart;
- the learning queries: 400 queries in requests of 50, waiting for the gateway's background
  measurements (an index's first 400 queries are each answered once more exactly);
- single queries: ``--queries`` fresh queries from the same clusters, one request each at
  automatic probing, top_k 10: p50, p99 and recall@10 against an exact search of all N;
- batch: the same queries in one request of ``--batch`` rows (repeated, so as many rows as
  ``--batch``), three times: queries per second of the best;
- restart: SIGTERM, then the same command on the same store: seconds until /v1/health answers
  and until the first query is answered, and the PSS once it has answered.

Raw faiss, in this process before the service starts: an IndexIVFFlat (IndexIVFScalarQuantizer
or IndexIVFPQ for ``--index-type``, under an IndexRefineFlat that reranks 10 candidates per
result by the full vectors it keeps in memory, as vaultvec reranks by the ones it keeps sealed
on disk) with the same n_lists trained by faiss's own defaults, the same threads; its training and add times, resident bytes (RSS growth of this process), single
p50/p99 and batch QPS at the smallest n_probes reaching recall@10 0.95 on these queries, and
that recall.

    flock /tmp/vaultvec-ray.lock .venv/bin/python benchmarks/scale.py --n 1000000 \\
        [--dim 128] [--n-lists 0] [--store file|postgres] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import common
import faiss
import footprint
import httpx
import numpy as np
import orjson

from actors.control.training import auto_n_lists
from actors.engine.ivf import SQ_TYPES
from cluster.client import Client, generate_key
from serve_app.service.indexes import PRECISIONS

K = 10
BATCH_ROWS = 20_000  # items per upsert request
LEARN, LEARN_BATCH = 400, 50
TARGET = 0.95
RERANK_MULT = 10  # vaultvec's default (actors.constants.RERANK_MULT)


# -- data ---------------------------------------------------------------------------------------
def centres(dim: int, n_clusters: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n_clusters, dim)).astype(np.float32)


def vectors(c: np.ndarray, n: int, seed: int, spread: float = 0.15) -> np.ndarray:
    """``n`` points around the clusters ``c``, generated in float32 (no float64 copy)."""
    rng = np.random.default_rng(seed)
    out = rng.standard_normal(size=(n, c.shape[1]), dtype=np.float32)
    out *= spread
    out += c[rng.integers(0, len(c), size=n)]
    return out


PIECE = 1_000_000  # vectors generated at a time (each piece from its own seed)


def pieces(n: int, dim: int) -> Iterator[np.ndarray]:
    """The data set in order, a piece at a time: the same vectors on every pass."""
    c = centres(dim)
    for i, lo in enumerate(range(0, n, PIECE)):
        yield vectors(c, min(PIECE, n - lo), seed=1 + i)


def dataset(n: int, dim: int) -> np.ndarray:
    x = np.empty((n, dim), dtype=np.float32)
    at = 0
    for piece in pieces(n, dim):
        x[at : at + len(piece)] = piece
        at += len(piece)
    return x


def exact_top(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k ids of ``q`` over ``x`` (faiss.knn: no copy of ``x``)."""
    _, ids = faiss.knn(q, x, k)
    return ids


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# -- raw faiss -----------------------------------------------------------------------------------
def raw_faiss(
    x: np.ndarray,
    q: np.ndarray,
    truth: np.ndarray,
    n_lists: int,
    index_type: str,
    batch: int,
    pq_dim: int = 0,
    sq_bits: int | None = None,
) -> dict[str, Any]:
    d = x.shape[1]
    quantizer = faiss.IndexFlatL2(d)
    if index_type == "ivfflat":
        index: faiss.IndexIVF = faiss.IndexIVFFlat(quantizer, d, n_lists)
    elif index_type == "ivf":
        qtype = SQ_TYPES[sq_bits or 8]
        index = faiss.IndexIVFScalarQuantizer(quantizer, d, n_lists, qtype)
    else:
        index = faiss.IndexIVFPQ(quantizer, d, n_lists, pq_dim or min(64, d // 2), 8)
    ivf = index
    if index_type != "ivfflat":  # codes' candidates reranked by the full vectors, as vaultvec
        index = faiss.IndexRefineFlat(ivf)
        index.k_factor = RERANK_MULT
    before = rss_bytes()
    t0 = time.perf_counter()
    rows = np.random.default_rng(5).choice(len(x), min(len(x), n_lists * 256), replace=False)
    index.train(x[np.sort(rows)])
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for lo in range(0, len(x), 1_000_000):
        index.add(x[lo : lo + 1_000_000])
    add_s = time.perf_counter() - t0
    resident = rss_bytes() - before
    nprobe, r = 1, 0.0
    while nprobe <= n_lists:  # the smallest power-of-two-then-bisected n_probes reaching 0.95
        ivf.nprobe = nprobe
        r = common.recall_at_k(index.search(q, K)[1], truth, K)
        if r >= TARGET:
            break
        nprobe *= 2
    lo_p, hi_p = nprobe // 2, min(nprobe, n_lists)
    while hi_p - lo_p > 1:
        mid = (lo_p + hi_p) // 2
        ivf.nprobe = mid
        if common.recall_at_k(index.search(q, K)[1], truth, K) >= TARGET:
            hi_p = mid
        else:
            lo_p = mid
    ivf.nprobe = hi_p
    r = common.recall_at_k(index.search(q, K)[1], truth, K)
    singles = []
    for row in q:
        t = time.perf_counter()
        index.search(row[None, :], K)
        singles.append((time.perf_counter() - t) * 1000)
    qb = np.resize(q, (batch, d))
    best = min(footprint.timed(partial(index.search, qb, K)) for _ in range(3))
    out = {
        "train_s": train_s,
        "add_s": add_s,
        "bytes_per_vector": resident / len(x),
        "n_probes": hi_p,
        "recall": r,
        "p50_ms": common.pct(singles, 50),
        "p99_ms": common.pct(singles, 99),
        "batch_qps": batch / best,
    }
    del index, ivf, quantizer
    gc.collect()
    return out


# -- the service ---------------------------------------------------------------------------------
@contextlib.contextmanager
def store_url(kind: str) -> Iterator[str | None]:
    """None: the service's own directory store; ``postgres``: a database on a throwaway
    PostgreSQL server (tests/pg_server.py)."""
    if kind == "file":
        yield None
        return
    from tests.pg_server import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("SKIP: PostgreSQL is not installed")
    with PostgresServer(bindir) as pg:
        yield pg.create_database()


def store_bytes(url: str | None, data_dir: str) -> int:
    """What the store takes on disk: the database's size (dead rows not yet vacuumed
    included), or the files of the directory store."""
    if url is not None:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(data_dir) for f in files
    )


def pss(service: footprint.Service) -> tuple[int, int]:
    """(PSS of every process of the service, of its shard actors' processes)."""
    procs = footprint.snapshot(service.proc.pid, service.ray_tmp)
    return sum(p.pss for p in procs), sum(p.pss for p in procs if p.kind == "vaultvec: shards")


def query_body(name: str, key: str, q: np.ndarray, rerank_mult: int = 0) -> bytes:
    body = common.query_body(name, key, q, K, include=["distance"])
    if not rerank_mult:
        return body
    return orjson.dumps({**orjson.loads(body), "rerank_mult": rerank_mult})


def singles(client: Client, bodies: list[bytes], truth: np.ndarray) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, recall@10) of ``bodies`` sent one at a time."""
    took, found = [], np.full((len(bodies), K), -1, dtype=np.int64)
    for i, b in enumerate(bodies):
        t = time.perf_counter()
        res = common.query(client, b)
        took.append((time.perf_counter() - t) * 1000)
        found[i, : len(res[0])] = [int(e["id"][1:]) for e in res[0]]
    return common.pct(took, 50), common.pct(took, 99), common.recall_at_k(found, truth, K)


def first_answer(url: str, api_key: str, body: bytes, timeout_s: float = 600.0) -> float:
    """Seconds until ``body`` is answered 200 (from now), retrying what is not ready yet."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=60) as http:
        while time.perf_counter() - t0 < timeout_s:
            with contextlib.suppress(httpx.HTTPError):
                r = http.post(common.QUERY, content=body, headers=common.JSON_HEADERS)
                if r.status_code == 200:
                    return time.perf_counter() - t0
            time.sleep(0.05)
    raise TimeoutError("no answer after the restart")


def run_service(
    args: argparse.Namespace, q: np.ndarray, learn: np.ndarray, truth: np.ndarray
) -> dict[str, Any]:
    """The service's figures. The vectors are generated again piece by piece as they are
    upserted (at 10M × 128 they are 5 GB, which this process need not hold beside the
    service)."""
    out: dict[str, Any] = {}
    n, dim = args.n, args.dim
    vector_dir = tempfile.mkdtemp(prefix="vaultvec-vectors-")
    env = {"VAULTVEC_AUTO_TRAIN_THRESHOLD": str(10**12), "VAULTVEC_VECTOR_DIR": vector_dir}
    with store_url(args.store) as url:
        svc = footprint.start(env, storage=url)
        try:
            client = Client(svc.url, svc.api_key, timeout=3600, max_request_bytes=64 << 20)
            time.sleep(args.settle)
            out["idle_pss"] = pss(svc)[0]
            key = generate_key()
            if args.precision:  # CyborgDB's form: diskivf at a storage precision
                body = {"index_name": "scale", "index_key": key, "dimension": dim}
                body["storage_precision"] = args.precision
                with httpx.Client(base_url=svc.url, headers={"X-API-Key": svc.api_key}) as http:
                    http.post("/v1/indexes/create", json=body).raise_for_status()
                idx = client.index("scale", key)
            else:
                idx = client.create_index(
                    "scale",
                    key,
                    index_type=args.index_type,
                    dimension=dim,
                    pq_dim=args.pq_dim or None,
                )
            time.sleep(args.settle)
            idle = pss(svc)  # the shard actors up, the index empty
            t0, at = time.perf_counter(), 0
            for x in pieces(n, dim):
                for lo in range(0, len(x), BATCH_ROWS):
                    rows = x[lo : lo + BATCH_ROWS]
                    ids = [f"v{i}" for i in range(at, at + len(rows))]
                    idx.upsert(ids, rows, binary=True)
                    at += len(rows)
                el = time.perf_counter() - t0
                print(f"  upserted {at:,} in {el:.0f}s", flush=True)
            out["ingest_per_s"] = n / (time.perf_counter() - t0)
            out["store_bytes_ingested"] = store_bytes(url, svc.data_dir) / n
            del x
            gc.collect()
            out["train_s"], _ = common.train_and_wait(client, idx, args.n_lists or None)
            out["n_lists"] = idx.describe()["n_lists"]
            print(
                f"  ingest {out['ingest_per_s']:,.0f}/s, trained in {out['train_s']:.1f}s "
                f"({out['n_lists']} lists)",
                flush=True,
            )
            time.sleep(args.settle)
            total, shards = pss(svc)
            out["bytes_per_vector"] = (total - idle[0]) / n
            out["disk_bytes_per_vector"] = unnamed_file_bytes(svc, vector_dir) / n
            out["store_bytes_trained"] = store_bytes(url, svc.data_dir) / n
            out["shard_bytes_per_vector"] = (shards - idle[1]) / n
            for lo in range(0, len(learn), LEARN_BATCH):
                idx.query(learn[lo : lo + LEARN_BATCH], K, include=["distance"])
                common.settle(idx)
            bodies = [query_body("scale", key, q[i : i + 1]) for i in range(len(q))]
            out["p50_ms"], out["p99_ms"], out["recall"] = singles(client, bodies, truth)
            for m in args.rerank_mult:  # ivf/ivfpq: more candidates reranked per result
                asked = [query_body("scale", key, q[i : i + 1], m) for i in range(len(q))]
                out[f"rerank_{m}"] = singles(client, asked, truth)
            out["health_p50_ms"] = common.pct(
                [1000 * footprint.timed(partial(common.health, client)) for _ in range(200)], 50
            )
            qb = np.resize(q, (args.batch, dim))
            batch = query_body("scale", key, qb)
            best = min(footprint.timed(lambda: common.query(client, batch)) for _ in range(3))
            out["batch_qps"] = args.batch / best
            out["lists_per_query"] = (idx.describe().get("recall") or {}).get(
                "lists_scanned_per_query"
            )
            client.close()
            footprint.stop(svc, keep_data=True)
            t0 = time.perf_counter()
            svc = footprint.start(
                env,
                data_dir=svc.data_dir,
                storage=url,
                api_key=svc.api_key,
                port=int(svc.url.rsplit(":", 1)[1]),
            )
            out["restart_healthy_s"] = time.perf_counter() - t0
            out["restart_first_query_s"] = out["restart_healthy_s"] + first_answer(
                svc.url, svc.api_key, bodies[0]
            )
            time.sleep(args.settle)
            total, shards = pss(svc)
            out["bytes_per_vector_restarted"] = (total - idle[0]) / n
            out["shard_bytes_per_vector_restarted"] = (shards - idle[1]) / n
        except BaseException:
            fd, keep = tempfile.mkstemp(prefix="scale-serve-", suffix=".log")  # mode 0600
            with (
                os.fdopen(fd, "wb") as out,
                contextlib.suppress(OSError),
                open(svc.log_path, "rb") as log,
            ):
                shutil.copyfileobj(log, out)
            print(f"the run failed: the service's log is kept in {keep}", file=sys.stderr)
            raise
        finally:
            footprint.stop(svc)
            os.rmdir(vector_dir)  # (empty: the files had no name)
    return out


def unnamed_file_bytes(service: footprint.Service, directory: str) -> int:
    """Bytes of the unnamed files in ``directory`` that the service's processes hold open: the
    ivf/ivfpq partitions' sealed full vectors (actors.engine.fullvectors); on disk, not
    resident."""
    total, seen = 0, set()
    for p in footprint.snapshot(service.proc.pid, service.ray_tmp):
        fds = f"/proc/{p.pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fds}/{fd}").startswith(directory + "/"):
                        st = os.stat(f"{fds}/{fd}")
                        if (st.st_dev, st.st_ino) not in seen:
                            seen.add((st.st_dev, st.st_ino))
                            total += st.st_size
    return total


# -- report --------------------------------------------------------------------------------------
def report(args: argparse.Namespace, svc: dict[str, Any], raw: dict[str, Any]) -> None:
    n, dim = args.n, args.dim
    raw_bytes = 4 * dim

    def row(
        what: str,
        ours: float | None,
        theirs: float | None,
        fmt: str,
        note: str = "",
        per_vector: bool = False,
    ) -> list[str]:
        """(measure, vaultvec, raw faiss, vaultvec / faiss); per-vector bytes also over raw."""

        def cell(v: float | None) -> str:
            if v is None:
                return "–"
            text = format(v, fmt)
            return f"{text} ({v / raw_bytes:.2f}× raw)" if per_vector else text

        ratio = f"{ours / theirs:.2f}×" if ours is not None and theirs else "–"
        return [what, cell(ours), cell(theirs) + note, ratio]

    def bpv(name: str, theirs: float | None = None) -> tuple[Any, ...]:
        return (svc[name], theirs, ",.0f", "", True)

    rows = [
        row("ingest, items/s", svc["ingest_per_s"], n / raw["add_s"], ",.0f", " (add)"),
        row("training, s", svc["train_s"], raw["train_s"], ".1f"),
        row("resident bytes per vector", *bpv("bytes_per_vector", raw["bytes_per_vector"])),
        row("  after a restart", *bpv("bytes_per_vector_restarted")),
        row("  shard actors' bytes per vector", *bpv("shard_bytes_per_vector")),
        row("  the same after a restart", *bpv("shard_bytes_per_vector_restarted")),
        row("full vectors on local disk, bytes per vector", *bpv("disk_bytes_per_vector")),
        row("store on disk after ingest, bytes per vector", *bpv("store_bytes_ingested")),
        row("  after training", *bpv("store_bytes_trained")),
        row("restart: healthy, s", svc["restart_healthy_s"], None, ".1f"),
        row("restart: first query answered, s", svc["restart_first_query_s"], None, ".1f"),
        row("GET /v1/health p50, ms (for scale)", svc["health_p50_ms"], None, ".2f"),
        row("single query p50, ms", svc["p50_ms"], raw["p50_ms"], ".2f"),
        row("single query p99, ms", svc["p99_ms"], raw["p99_ms"], ".2f"),
        row(f"batch of {args.batch:,}, queries/s", svc["batch_qps"], raw["batch_qps"], ",.0f"),
        row("lists scanned per query", svc["lists_per_query"], raw["n_probes"], ".1f"),
        row("recall@10", svc["recall"], raw["recall"], ".4f"),
    ]
    for m in args.rerank_mult:
        p50, p99, r = svc[f"rerank_{m}"]
        rows.append(row(f"rerank_mult {m}: single query p50, ms", p50, None, ".2f"))
        rows.append(row(f"rerank_mult {m}: single query p99, ms", p99, None, ".2f"))
        rows.append(row(f"rerank_mult {m}: recall@10", r, None, ".4f"))
    common.print_table(
        ["measure", "vaultvec", "raw faiss", "vaultvec / faiss"],
        rows,
        title=f"{n:,} × {dim} {args.index_type} {args.precision or ''}, {svc['n_lists']} lists, "
        f"store {args.store}",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--n-lists", type=int, default=0, help="0: automatic")
    ap.add_argument("--index-type", default="ivfflat", choices=["ivfflat", "ivf", "ivfpq"])
    ap.add_argument("--pq-dim", type=int, default=0, help="ivfpq sub-quantizers; 0: default")
    ap.add_argument(
        "--precision",
        choices=["float16", "tq12", "tq8", "tq6", "tq4"],
        help="create as CyborgDB does, with this storage_precision (an ivf index; raw faiss: "
        "the same scalar quantizer)",
    )
    ap.add_argument(
        "--rerank-mult",
        type=int,
        action="append",
        default=[],
        help="ivf/ivfpq: single queries again at this rerank_mult (repeatable)",
    )
    ap.add_argument("--store", default="file", choices=["file", "postgres"])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds before a PSS reading")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    # SIGTERM ends the run as Ctrl-C does: the service and its store are taken down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = common.environment()
    common.print_environment(env)
    t0 = time.perf_counter()
    x = dataset(args.n, args.dim)
    c = centres(args.dim)
    q = vectors(c, args.queries, seed=10**6)
    learn = vectors(c, LEARN, seed=10**6 + 1)
    truth = exact_top(x, q, K)
    print(f"data and exact answers in {time.perf_counter() - t0:.1f}s", flush=True)
    n_lists = args.n_lists or auto_n_lists(args.n)
    if args.precision:
        args.index_type, sq_bits = PRECISIONS[args.precision]
    else:
        sq_bits = None
    raw = raw_faiss(x, q, truth, n_lists, args.index_type, args.batch, args.pq_dim, sq_bits)
    print(f"raw faiss: {raw}", flush=True)
    del x
    gc.collect()
    svc = run_service(args, q, learn, truth)
    report(args, svc, raw)
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps({"args": vars(args), "vaultvec": svc, "faiss": raw, "env": env}))
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    common.print_environment(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
