"""Recall@10 and bytes per vector of CyborgDB's storage precisions (float32, float16, tq12, tq8,
tq6, tq4) over HTTP (docs/performance.md, Storage precisions).

One service; for each set and precision an index is created with ``storage_precision``, filled,
trained (automatic n_lists) and queried. The sets are benchmarks/recall.py's (unfiltered):

* ``sift``: the real SIFT sample ../shared/data/sift-5k.tsv (skipped with a message when
  absent): 3,000 rows stored, 1,000 held-out rows with Gaussian noise as queries, the other
  1,000 with fresh noise as learning traffic. Euclidean.
* ``text``: 30,000 docstrings of the installed packages embedded with the bundled
  all-MiniLM-L6-v2, queried with 1,000 embedded function and class names, other names as
  learning traffic (benchmarks/evalsets.py builds and caches the set; skipped with a message
  when the model is not installed). Cosine.

Per precision, recall@10 against exact search with every list probed (what the codes allow),
with greedy probing, and with automatic probing as trained ("auto first") and, with
``--traffic N``, again after N learning queries, of which the service measures a share
(``--sample-share``) to fit its probing (serve_app/gateway/probing.py; "auto live"); the lists
automatic probing scanned per query come from describe's recall report. Bytes a vector: the
faiss code (what the precision keeps per vector in its inverted lists) and describe's resident
bytes over the vectors (codes, ids, the id map and per-item state of the partitions).

With ``--rotation`` it also (in-process faiss, no service) compares each scalar quantiser with and
without a random orthogonal rotation of vectors and queries: the same k-means lists, recall@10
with every list probed, mean over ``--seeds`` rotations.

Usage: .venv/bin/python benchmarks/precisions.py [--datasets sift,text] [--traffic 5000]
       [--rotation] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import faiss
import numpy as np
import orjson
import recall
from common import (
    JSON_OPTS,
    connect,
    environment,
    post,
    print_environment,
    print_table,
    recall_at_k,
    running_service,
    service_internals,
    train_and_wait,
)
from recall import found_rows, probing_counters, settle

from actors.control.training import auto_n_lists, kmeans
from actors.engine.ivf import SQ_TYPES, new_ivf
from cluster.client import generate_key
from tests.helpers import exact_knn

K = 10
PRECISIONS = ("float32", "float16", "tq12", "tq8", "tq6", "tq4")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--datasets", default="sift,text", help="comma-separated")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated")
    p.add_argument("--traffic", type=int, default=0, help="learning queries before auto live")
    p.add_argument(
        "--sample-share",
        type=float,
        default=0.03,
        help="the service's VAULTVEC_RECALL_SAMPLE_SHARE",
    )
    p.add_argument("--rotation", action="store_true", help="also the random-rotation experiment")
    p.add_argument("--seeds", type=int, default=3, help="rotations per quantiser (--rotation)")
    p.add_argument("--batch-size", type=int, default=5000, help="items per upsert request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", help="write machine-readable results here")
    return p.parse_args(argv)


def load_sets(args: argparse.Namespace) -> list[recall.EvalSet]:
    """benchmarks/recall.py's sets, with its evaluation queries (its default 15,000 learning
    queries drawn, as they decide the SIFT queries' noise); it prints a SKIP line for a set it
    cannot load."""
    wanted = {s.strip() for s in args.datasets.split(",") if s.strip()} & {"sift", "text"}
    options = argparse.Namespace(
        datasets=",".join(sorted(wanted)), seed=args.seed, traffic=15_000, n=0
    )
    return recall.load_sets(options)


def code_bytes(cfg: Any) -> int:
    """Bytes of the faiss code a partition of this index keeps per vector."""
    d = cfg.dimension
    return int(new_ivf(cfg.index_type, d, 1, cfg.pq_dim, cfg.pq_bits, cfg.sq_bits).code_size)


def run_one(
    client: Any, s: recall.EvalSet, precision: str, truth: np.ndarray, args: Any
) -> dict[str, Any]:
    n, d = s.x.shape
    name, key = f"prec-{s.name}-{precision}", generate_key()
    post(
        client,
        "/v1/indexes/create",
        {
            "index_name": name,
            "index_key": key,
            "dimension": d,
            "metric": s.metric,
            "storage_precision": precision,
        },
    )
    idx = client.index(name, key)
    ids = [str(i) for i in range(n)]
    t0 = time.perf_counter()
    for start in range(0, n, args.batch_size):
        stop = min(n, start + args.batch_size)
        idx.upsert(ids[start:stop], s.x[start:stop])
    t_ingest = time.perf_counter() - t0
    t_train, status = train_and_wait(client, idx)
    desc = idx.describe()
    n_lists = int(desc["n_lists"])
    cfg, _ = service_internals(name, key)

    def recall_of(**options: Any) -> float:
        found = found_rows(idx.query(s.queries, K, include=["distance"], **options))
        return recall_at_k(found, truth, K)

    every = recall_of(n_probes=n_lists)
    greedy = recall_of(greedy=True)
    n0, l0, _ = probing_counters(idx)
    auto = recall_of()
    n1, l1, _ = probing_counters(idx)
    live, live_lists = None, None
    if args.traffic:
        for i in range(0, args.traffic, 500):
            idx.query(s.traffic[i : min(args.traffic, i + 500)], K, include=["distance"])
            settle(idx, timeout=5.0)
        settle(idx)
        n2, l2, _ = probing_counters(idx)
        live = recall_of()
        n3, l3, _ = probing_counters(idx)
        live_lists = (l3 - l2) / max(1, n3 - n2)
    row = {
        "dataset": s.name,
        "precision": precision,
        "index_type": desc["index_type"],
        "described_precision": desc.get("storage_precision"),
        "sq_bits": cfg.sq_bits,
        "n": n,
        "dimension": d,
        "n_lists": n_lists,
        "code_bytes": code_bytes(cfg),
        "resident_bytes_per_vector": desc["memory"]["resident_bytes"] / n,
        "recall_every_list": every,
        "recall_greedy": greedy,
        "recall_auto": auto,
        "auto_lists_per_query": (l1 - l0) / max(1, n1 - n0),
        "recall_auto_live": live,
        "auto_live_lists_per_query": live_lists,
        "ingest_s": t_ingest,
        "train_s": t_train,
        "train_status": status,
    }
    print(
        f"  {precision:>7}: code {row['code_bytes']} B, resident "
        f"{row['resident_bytes_per_vector']:.0f} B/vector; recall@10 every list {every:.4f}, "
        f"greedy {greedy:.4f}, auto {auto:.4f} @{row['auto_lists_per_query']:.1f}"
        + ("" if live is None else f", auto live {live:.4f} @{live_lists:.1f}")
        + f" of {n_lists} lists (ingest {t_ingest:.1f}s, train {t_train:.1f}s)",
        flush=True,
    )
    client.delete_index(name, key)
    return row


def rotation_experiment(s: recall.EvalSet, truth: np.ndarray, seeds: int) -> list[dict[str, Any]]:
    """Each scalar quantiser with and without a random orthogonal rotation (faiss
    RandomRotationMatrix) of the vectors, the queries and the k-means centroids; the rest as
    vaultvec builds its lists (actors.control.training: k-means, then the quantiser trained on
    the residuals)."""
    x, q = s.x, s.queries
    if s.metric == "cosine":  # vaultvec searches cosine indexes as L2 over unit vectors
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
    n, d = x.shape
    n_lists = auto_n_lists(n)
    centroids = kmeans(x, n_lists, 20, None, 1234)
    rows = []
    for bits in (16, 8, 6, 4):
        plain, rotated = 0.0, []
        for rotate in [None, *range(seeds)]:
            xr, qr, cr = x, q, centroids
            if rotate is not None:
                rot = faiss.RandomRotationMatrix(d, d)
                rot.init(rotate)
                xr, qr, cr = rot.apply_py(x), rot.apply_py(q), rot.apply_py(centroids)
            quantizer = faiss.IndexFlatL2(d)
            quantizer.add(cr)
            index = faiss.IndexIVFScalarQuantizer(quantizer, d, n_lists, SQ_TYPES[bits])
            index.train(xr)
            index.add(xr)
            index.nprobe = n_lists
            found = index.search(qr, K)[1]
            r = recall_at_k(found, truth, K)
            if rotate is None:
                plain = r
            else:
                rotated.append(r)
        row = {
            "dataset": s.name,
            "sq_bits": bits,
            "plain": plain,
            "rotated_mean": float(np.mean(rotated)),
            "rotated_sd": float(np.std(rotated)),
        }
        rows.append(row)
        print(
            f"  {bits:>2}-bit SQ: plain {plain:.4f}, rotated {row['rotated_mean']:.4f} "
            f"(sd {row['rotated_sd']:.4f} over {seeds})",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    print_environment(env)
    sets = load_sets(args)
    if not sets:
        print("no dataset to run")
        return 0
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    truths = {s.name: exact_knn(s.x, s.queries, K, s.metric)[1] for s in sets}
    rows: list[dict[str, Any]] = []
    with running_service(recall_sample_share=args.sample_share) as svc:
        client = connect(svc.url)
        for s in sets:
            n, d = s.x.shape
            print(f"\n== {s.name}: {n:,} x {d} stored ({s.metric}), {len(s.queries):,} queries")
            for precision in precisions:
                rows.append(run_one(client, s, precision, truths[s.name], args))
        client.close()
    print_table(
        [
            "set",
            "precision",
            "stored as",
            "code B/vector",
            "resident B/vector",
            "every list",
            "greedy",
            "auto first: recall / lists",
            "auto live: recall / lists",
        ],
        [
            [
                r["dataset"],
                r["precision"],
                r["index_type"] + (f" sq_bits {r['sq_bits']}" if r["sq_bits"] else ""),
                str(r["code_bytes"]),
                f"{r['resident_bytes_per_vector']:.0f}",
                f"{r['recall_every_list']:.4f}",
                f"{r['recall_greedy']:.4f}",
                f"{r['recall_auto']:.4f} / {r['auto_lists_per_query']:.1f} of {r['n_lists']}",
                "-"
                if r["recall_auto_live"] is None
                else f"{r['recall_auto_live']:.4f} / {r['auto_live_lists_per_query']:.1f}",
            ]
            for r in rows
        ],
        title=f"recall@{K} over HTTP vs exact search, by storage_precision",
    )
    rotation: list[dict[str, Any]] = []
    if args.rotation:
        for s in sets:
            print(f"\n== random rotation, {s.name} (in-process faiss, every list probed)")
            rotation += rotation_experiment(s, truths[s.name], args.seeds)
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print_environment(env)
    if args.json_out:
        out = {"env": env, "params": vars(args), "rows": rows, "rotation": rotation}
        with open(args.json_out, "wb") as f:
            f.write(orjson.dumps(out, option=orjson.OPT_INDENT_2 | JSON_OPTS))
        print(f"results written to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
