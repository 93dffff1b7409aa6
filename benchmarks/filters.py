"""Filtered single queries at scale: latency and recall@10 of automatic probing per filter
selectivity, side by side with the unfiltered query, on a live vaultvec.

One default server, one ivfflat index of N clustered vectors (128 dims, ``--n-lists`` 1,024:
0 for automatic) with metadata ``{cat: i % 100, grp: i % 10, flag: i % 2, rare: i % 1000,
few: i % (N / 5)}``, upserted through the Python client and trained. The index then answers
400 other queries of each kind in requests of 50 (``--learn``: unfiltered, the 50% filter and
the 10% filter: the kinds automatic probing fits a scale for; a filter answered by an exact
scan of its matches has none), waiting after each for the gateway's background measurements to
end, until they have measured 400 of each kind: an index's first 400 queries of a kind are
each answered once more exactly, which at 1M items costs tens of milliseconds of CPU per query
and would be timed with the queries otherwise.

Then per filter, 200 single queries (fresh vectors from the same generator, top_k 10, one
request each, one client) after 20 unmeasured ones: recall@10 against an exact search of the
matching items, the inverted lists scanned per query (describe's counters), and the filter's
first query alone (its evaluation not yet kept by the shards: actors/engine/selection.py).
Then the same 200 queries once more, the filters taking turns query by query: p50 and p99 of
the request, and the p50 against the unfiltered one's, measured side by side.

The filters: none; ``flag`` (50%), ``grp`` (10%), ``cat`` (1%), ``rare`` (0.1%), ``few`` (5
items, fewer than top_k: all of them, exactly); and ``cat`` with another value at every query
(1% each, never the same filter twice in a row: every query evaluates its filter).

Usage: .venv/bin/python benchmarks/filters.py [--n 1000000] [--queries 200] [--n-lists 1024]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common
import faiss
import numpy as np
import orjson

from tests.helpers import clustered

K = 10


def body(name: str, key: str, q: np.ndarray, flt: dict[str, Any] | None) -> bytes:
    doc: dict[str, Any] = {
        "index_name": name,
        "index_key": key,
        "query_vectors": q,
        "top_k": K,
        "include": ["distance"],
    }
    if flt is not None:
        doc["filters"] = flt
    return orjson.dumps(doc, option=common.JSON_OPTS)


def truth(x: np.ndarray, q: np.ndarray, rows: np.ndarray) -> list[set[int]]:
    flat = faiss.IndexFlatL2(x.shape[1])
    flat.add(x[rows])
    _, found = flat.search(q, min(K, len(rows)))
    return [{int(rows[j]) for j in r if j >= 0} for r in found]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--n-lists", type=int, default=1024, help="0: automatic")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--learn", type=int, default=400, help="queries of each kind first")
    args = ap.parse_args(argv)
    n, nq = args.n, args.queries
    data = clustered(n + args.warmup + nq + 3 * args.learn, args.dim, seed=0)
    x, q, learn = data[:n], data[n : n + args.warmup + nq], data[n + args.warmup + nq :]
    i = np.arange(n)
    columns = {"cat": i % 100, "grp": i % 10, "flag": i % 2, "rare": i % 1000, "few": i % (n // 5)}
    cases: list[tuple[str, Any]] = [
        ("none", None),
        ("flag: 1 (50%)", {"flag": 1}),
        ("grp: 3 (10%)", {"grp": 3}),
        ("cat: 7 (1%)", {"cat": 7}),
        ("rare: 7 (0.1%)", {"rare": 7}),
        ("few: 7 (5 items)", {"few": 7}),
        ("cat: another each query (1%)", "varying"),
    ]
    env = common.environment()
    common.print_environment(env)
    rows: list[list[str]] = []
    with common.running_service() as svc:
        client = common.connect(svc.url)
        key = common.secrets.token_hex(32)
        idx = client.create_index("filters", key, dimension=args.dim)
        t0 = time.perf_counter()
        for s in range(0, n, 20_000):
            e = min(n, s + 20_000)
            meta = [{c: int(v[j]) for c, v in columns.items()} for j in range(s, e)]
            idx.upsert([str(j) for j in range(s, e)], x[s:e], metadata=meta)
        print(f"upserted {n:,} in {time.perf_counter() - t0:.1f}s", flush=True)
        t_train, _ = common.train_and_wait(client, idx, args.n_lists or None)
        print(f"trained in {t_train:.1f}s, n_lists {idx.describe()['n_lists']}", flush=True)
        t0 = time.perf_counter()
        report: dict[str, Any] = {}
        for j, flt in enumerate([None, {"flag": 1}, {"grp": 3}]):
            part = learn[j * args.learn : (j + 1) * args.learn]
            for r in range(40):  # until the kind's early measurements are done
                s = (50 * r) % len(part)
                idx.query(part[s : s + 50], K, filters=flt, include=["distance"])
                report = common.settle(idx)
                if report.get("sampled_queries", 0) >= args.learn * (j + 1):
                    break
        print(f"learning queries answered and measured in {time.perf_counter() - t0:.1f}s")
        print(f"recall report: {report}", flush=True)
        all_bodies = []
        for label, flt in cases:
            before = idx.describe()["recall"]
            per_query = [{"cat": int(j % 100)} if flt == "varying" else flt for j in range(len(q))]
            bodies = [body("filters", key, q[j : j + 1], per_query[j]) for j in range(len(q))]
            all_bodies.append(bodies)
            first_ms = None
            times, found = [], []
            for j, b in enumerate(bodies):
                t = time.perf_counter()
                res = common.query(client, b)
                el = (time.perf_counter() - t) * 1000
                if j == 0:
                    first_ms = el
                if j >= args.warmup:
                    times.append(el)
                    found.append({int(e["id"]) for e in res[0]})
            measured = q[args.warmup :]
            groups: dict[str, list[int]] = {}
            for j in range(len(found)):
                groups.setdefault(repr(per_query[args.warmup + j]), []).append(j)
            hits, total = 0, 0
            for members in groups.values():
                mask = np.ones(n, bool)
                for c, v in (per_query[args.warmup + members[0]] or {}).items():
                    mask &= columns[c] == v
                wants = truth(x, measured[members], np.flatnonzero(mask))
                for j, want in zip(members, wants):
                    hits += len(want & found[j])
                    total += len(want)
            after = idx.describe()["recall"]
            lists = (
                after["lists_scanned_per_query"] * after["auto_queries"]
                - (before["lists_scanned_per_query"] or 0) * before["auto_queries"]
            ) / max(1, after["auto_queries"] - before["auto_queries"])
            rows.append([label, f"{hits / max(total, 1):.4f}", f"{lists:.1f}", f"{first_ms:.1f}"])
            print(f"  {label}: p50 {common.pct(times, 50):.2f} ms | " + " | ".join(rows[-1][1:]))
        # The latencies compared: the same queries again, the filters taking turns query by
        # query, so that the machine's drift falls on every filter alike.
        timed: list[list[float]] = [[] for _ in cases]
        for j in range(args.warmup, len(q)):
            for c, bodies in enumerate(all_bodies):
                t = time.perf_counter()
                common.query(client, bodies[j])
                timed[c].append((time.perf_counter() - t) * 1000)
        base_p50 = common.pct(timed[0], 50)
        for row, times in zip(rows, timed):
            p50 = common.pct(times, 50)
            row[1:1] = [f"{p50:.2f}", f"{common.pct(times, 99):.2f}", f"{p50 / base_p50:.2f}x"]
        print(f"recall report at the end: {idx.describe()['recall']}", flush=True)
        client.close()
    common.print_table(
        [
            "filter (share matching)",
            "p50 ms",
            "p99 ms",
            "p50 / unfiltered",
            "recall@10",
            "lists / query",
            "first query ms",
        ],
        rows,
        title=f"{n:,} x {args.dim}, {nq} single queries per filter (after {args.warmup})",
    )
    env["loadavg_end"] = " ".join(f"{v:.2f}" for v in __import__("os").getloadavg())
    common.print_environment(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
