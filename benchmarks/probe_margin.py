"""Automatic probing's margin, in one process: what the gateway's fit reaches on queries it has
not seen, fitted as for the batch its measured rows are drawn from (two standard errors of the
measured recall, whichever rule scans fewer lists) and as for queries to come (two standard
errors of a difference of two means, a fixed count only for a clear saving):
serve_app.gateway.probing.Bucket.fit with ``ahead`` False and True.

The set (``--set``: text or titles, from the cache benchmarks/evalsets.py builds) in two
in-process shards trained as the service trains (benchmarks/probe_curve.py), its 3,000
evaluation queries and 1,500 of its learning queries (those recall.py sends under the filter)
measured once per filter as the gateway measures them (every list, each exact result's needs:
actors.engine.adaptive). Then ``--windows`` times: a window as the gateway holds after recall.py's
5,000 learning queries (128 of the first 200 evaluation queries, the first batch measured, and
272 learning queries), the rule fitted on it by serve_app.gateway.probing.Bucket (the adaptive
rule's scale or a fixed count of lists, whichever it keeps), and the rule scored from the
needs on the first 1,000 evaluation queries and on all 3,000: recall@10, and lists per query
against the oracle (the smallest fixed count of lists reaching 0.95 on those very queries).

Usage: .venv/bin/python benchmarks/probe_margin.py [--set text] [--filters none,50%,10%]
       [--windows 12]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from probe_curve import KEY, Built, K, build

from actors.types import REACH_SCALES, Probing, SearchRequest, fixed_lists
from serve_app.gateway.hits import Hits, merge
from serve_app.gateway.probing import Bucket, IndexProbing, Needs

TARGET = 0.95
_REACH_LOG2 = np.log2(REACH_SCALES)


def measure(b: Built, name: str, q: np.ndarray) -> Hits:
    """The gateway's measure search of ``q`` under filter ``name``: every list, the needs."""
    dis, lists = b.quantizer.search(q, 1)
    probing = Probing("measure", first=b.first, slacks=b.slacks)
    req = SearchRequest(q, K, 1, lists, dis, b.node(name), probing=probing)
    return merge([sh.search(KEY, req) for sh in b.shards], K, False)


def needs_of(rows: list[tuple[Hits, int]], first: int) -> Needs:
    """What the measured queries ``rows`` (answer, row) need, as the gateway learns it."""

    def column(name: str) -> np.ndarray:
        return np.stack([getattr(h, name)[i] for h, i in rows])

    return Needs(column("needed"), column("lists_needed"), column("reach"), first)


def fixed_recall(lists: np.ndarray, p: int) -> float:
    """Mean recall@K of a fixed count of ``p`` lists, from each result's lists needed."""
    found = np.where(np.isnan(lists), np.nan, lists <= p)
    return float(np.nanmean(found, axis=1).mean())


def scored(bucket: Bucket, first: int, h: Hits, n: int) -> tuple[float, float]:
    """(recall, lists per query) of the bucket's rule on the first ``n`` measured queries."""
    assert h.needed is not None and h.lists_needed is not None and h.reach is not None
    if bucket.fixed:
        p = fixed_lists(bucket.fixed, first)
        return fixed_recall(h.lists_needed[:n], p), float(p)
    needed = h.needed[:n]
    found = np.where(np.isnan(needed), np.nan, needed < bucket.scale)
    recall = float(np.nanmean(found, axis=1).mean())
    lists = float(np.interp(np.log2(bucket.scale), _REACH_LOG2, h.reach[:n].mean(axis=0)))
    return recall, lists


def oracle(h: Hits, n: int, n_lists: int) -> int:
    assert h.lists_needed is not None
    return next(p for p in range(1, n_lists + 1) if fixed_recall(h.lists_needed[:n], p) >= TARGET)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="text", choices=["text", "titles"])
    ap.add_argument("--filters", default="none,50%,10%")
    ap.add_argument("--windows", type=int, default=12)
    args = ap.parse_args(argv)
    b = build(args.set, n_more=2000)
    n_lists = b.quantizer.ntotal
    # recall.py's learning queries under each filter: the j-th 5,000, else the first 5,000
    order = {"none": 0, "10%": 1, "50%": 2} if args.set == "text" else {}
    for name in args.filters.split(","):
        j = order.get(name, 0)
        learning = b.traffic[j * 5000 : j * 5000 + 1500]
        if len(learning) < 1500:
            learning = b.traffic[:1500]
        h_eval, h_learn = measure(b, name, b.queries), measure(b, name, learning)
        oracles = {n: oracle(h_eval, n, n_lists) for n in (1000, 3000)}
        print(f"  filter {name}: oracle {oracles[1000]} lists on 1,000, {oracles[3000]} on 3,000")
        for ahead, label in ((False, "as for a batch"), (True, "as for queries to come")):
            rows = []
            for seed in range(args.windows):
                g = np.random.default_rng(seed)
                window = [(h_eval, i) for i in np.sort(g.choice(200, 128, replace=False))]
                window += [(h_learn, i) for i in g.choice(len(learning), 272, replace=False)]
                state = IndexProbing(version=1, target=TARGET)
                state.learn(0, needs_of(window, b.first), ahead)  # as the gateway does
                bucket = state.buckets[0]
                row = []
                for n in (1000, 3000):
                    recall, lists = scored(bucket, b.first, h_eval, n)
                    row += [recall, lists / oracles[n]]
                rows.append([*row, float(bool(bucket.fixed))])
            v = np.array(rows, dtype=float)
            print(f"    fitted {label}: a fixed count in {v[:, 4].mean():.0%} of windows")
            for col, n in ((0, 1000), (2, 3000)):
                r, c = v[:, col], v[:, col + 1]
                print(
                    f"      on {n:,}: recall min {r.min():.4f} mean {r.mean():.4f}, below 0.95 "
                    f"in {np.mean(r < TARGET):.0%}; lists / oracle mean {c.mean():.2f}x "
                    f"max {c.max():.2f}x",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
