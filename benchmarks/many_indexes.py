"""Thousands of indexes on one default server (the shard pool), and memory under churn.

Starts ``vaultvec serve`` as a user would (benchmarks/footprint.py's launcher: its own data
directory, Ray temp dir, port and key) and, in one run:

1. many indexes: one index of ``--items`` items (dim 128, small metadata) and the p50 of a
   single query on it; then ``--indexes`` - 1 more created (create latency p50/p99) and filled
   alike; the whole service's memory (PSS of every process, benchmarks/footprint.py) against
   the raw bytes of the vectors and metadata; and the single-query p50 on random indexes
   (each queried once before, so resident) beside the same query with 1 index, measured
   before the build and again once all but the first index are deleted (the machine's speed
   drifts over the minutes of the build: the bar takes the mean of the two); and, in
   alternating blocks, queries on random indexes and on the first one with all 1,000 resident
   (the same moments of the machine for both: the cost of many indexes without the drift);
2. churn, on a fresh server: one index of ``--churn-items`` items (dim 64, small metadata)
   filled, then every item replaced ``--rounds`` times (new vectors from the same distribution
   each round); the shard pool's private memory (RssAnon) per live item after the first and
   after the last round of replacements, beside what the partitions' arrays hold.

    flock /tmp/vaultvec-ray.lock .venv/bin/python benchmarks/many_indexes.py [--check]

``--check`` exits 1 when a bar of the shard pool is missed: memory ≤ 3× raw + 2 GB, query p50
with many indexes ≤ 1.2× with one, memory per live item after the last churn round ≤ 1.1×
after the first.
"""

from __future__ import annotations

import argparse
import sys
import time

import footprint
import numpy as np

from actors.process.heap import resident_anon_bytes
from cluster.client import Client, generate_key
from tests.helpers import clustered

MB = 1_000_000
QUERIES = 400


def items(n: int, d: int, seed: int) -> tuple[list[str], np.ndarray, list[dict[str, object]]]:
    x = clustered(n, d, n_clusters=20, seed=seed)
    meta: list[dict[str, object]] = [{"n": i, "tag": f"t{i % 7}"} for i in range(n)]
    return [f"i{j}" for j in range(n)], x, meta


def raw_bytes(x: np.ndarray, meta: list[dict[str, object]]) -> int:
    import orjson

    return x.nbytes + sum(len(orjson.dumps(m)) for m in meta)


def pss(service: footprint.Service, kind: str | None = None) -> int:
    procs = footprint.snapshot(service.proc.pid, service.ray_tmp)
    return sum(p.pss for p in procs if kind is None or p.kind == kind)


def shard_anon(service: footprint.Service) -> int:
    """Private resident memory (RssAnon) of the shard pool's processes: what the partitions
    hold, without the pages of Ray's shared object store that carried the upserts (PSS counts
    those, and they grow with every batch the process has touched)."""
    procs = footprint.snapshot(service.proc.pid, service.ray_tmp)
    return sum(resident_anon_bytes(p.pid) or 0 for p in procs if p.kind == "vaultvec: shards")


def query_times_ms(
    indexes: list, q: np.ndarray, rng: np.random.Generator, n: int = QUERIES
) -> list[float]:
    times = []
    for j in range(n):
        index = indexes[int(rng.integers(len(indexes)))]
        t0 = time.perf_counter()
        index.query(q[j % len(q)], top_k=10)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def query_p50_ms(indexes: list, q: np.ndarray, rng: np.random.Generator) -> float:
    return float(np.median(query_times_ms(indexes, q, rng)))


def interleaved_p50_ms(
    created: list, q: np.ndarray, rng: np.random.Generator, blocks: int = 10
) -> tuple[float, float]:
    """(p50 on random indexes, p50 on the first index) in alternating blocks: the same
    moments of the machine for both."""
    spread, one = [], []
    for _ in range(blocks):
        spread += query_times_ms(created, q, rng, QUERIES // blocks)
        one += query_times_ms(created[:1], q, rng, QUERIES // blocks)
    return float(np.median(spread)), float(np.median(one))


def many_indexes(n_indexes: int, n_items: int) -> dict[str, float]:
    service = footprint.start({})
    out: dict[str, float] = {}
    try:
        with Client(service.url, service.api_key, timeout=600) as client:
            footprint.settle(5)
            idle = pss(service)
            ids, x, meta = items(n_items, 128, seed=0)
            q = x[:50] + 0.01
            first = client.create_index("many-0", generate_key(), dimension=128)
            first.upsert(ids, x, meta, binary=True)
            query_p50_ms([first], q, np.random.default_rng(0))  # warm
            out["query p50, 1 index (ms)"] = query_p50_ms([first], q, np.random.default_rng(1))
            created, creates = [first], []
            for n in range(1, n_indexes):
                key = generate_key()
                t0 = time.perf_counter()
                index = client.create_index(f"many-{n}", key, dimension=128)
                creates.append((time.perf_counter() - t0) * 1e3)
                index.upsert(ids, clustered(n_items, 128, n_clusters=20, seed=n), meta, binary=True)
                created.append(index)
                if n % 100 == 0:
                    print(f"  {n:,} indexes created and filled", flush=True)
            out["create p50 (ms)"] = float(np.median(creates))
            out["create p99 (ms)"] = float(np.percentile(creates, 99))
            for index in created:  # each queried once: resident
                index.query(q[0], top_k=10)
            out[f"query p50, {n_indexes:,} indexes (ms)"] = query_p50_ms(
                created, q, np.random.default_rng(2)
            )
            spread, one = interleaved_p50_ms(created, q, np.random.default_rng(4))
            out["interleaved: random index p50 (ms)"] = spread
            out["interleaved: the first index p50 (ms)"] = one
            footprint.settle(5)
            total = pss(service)
            raw = n_indexes * raw_bytes(x, meta)
            out["raw vectors + metadata (MB)"] = raw / MB
            out["service PSS idle (MB)"] = idle / MB
            out["service PSS with the indexes (MB)"] = total / MB
            out["shard pool PSS (MB)"] = pss(service, "vaultvec: shards") / MB
            out["(PSS - idle) / raw"] = (total - idle) / raw
            # The server holding 1 index again, minutes later: the machine's speed drifts over
            # the build, so the 1-index figure brackets the 1,000-index one.
            for index in created[1:]:
                client.delete_index(index.name, index.key)
            footprint.settle(5)
            query_p50_ms([first], q, np.random.default_rng(0))  # warm
            out["query p50, 1 index again (ms)"] = query_p50_ms(
                [first], q, np.random.default_rng(3)
            )
    finally:
        footprint.stop(service)
    return out


def churn(n_items: int, rounds: int) -> dict[str, float]:
    service = footprint.start({})
    out: dict[str, float] = {}
    try:
        with Client(service.url, service.api_key, timeout=600) as client:
            index = client.create_index("churn", generate_key(), dimension=64)
            ids, base_x, meta = items(n_items, 64, seed=0)
            index.upsert(ids[:1], base_x[:1], meta[:1], binary=True)
            footprint.settle(3)
            base = shard_anon(service)
            per_item = []
            rng = np.random.default_rng(1)
            for r in range(rounds + 1):  # the first fill, then every item replaced each round
                # new vectors for every item, from the same distribution
                x = (base_x + 0.05 * rng.standard_normal(base_x.shape)).astype(np.float32)
                for start in range(0, n_items, 5000):
                    stop = start + 5000
                    index.upsert(ids[start:stop], x[start:stop], meta[start:stop], binary=True)
                footprint.settle(4)  # writes paused: the shards tidy and compact
                if r == 0:
                    continue
                per_item.append((shard_anon(service) - base) / n_items)
                held = index.describe()["memory"]["resident_bytes"] / n_items
                print(
                    f"  round {r}: {per_item[-1]:,.0f} B per live item "
                    f"(the partitions' arrays: {held:,.0f})",
                    flush=True,
                )
            out["bytes per live item, round 1"] = per_item[0]
            out[f"bytes per live item, round {rounds}"] = per_item[-1]
            out[f"round {rounds} / round 1"] = per_item[-1] / per_item[0]
    finally:
        footprint.stop(service)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--indexes", type=int, default=1000)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--churn-items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--check", action="store_true", help="exit 1 if a bar is missed")
    parser.add_argument("--churn-only", action="store_true", help="skip the many-index run")
    args = parser.parse_args()
    churned = churn(args.churn_items, args.rounds)
    if args.churn_only:
        for label, value in churned.items():
            print(f"  {label:<42}{value:>12,.2f}")
        return 0
    many = many_indexes(args.indexes, args.items)
    print(f"\n{args.indexes:,} indexes x {args.items:,} items (dim 128) on one default server")
    for label, value in many.items():
        print(f"  {label:<42}{value:>12,.2f}")
    print(f"\nchurn: {args.churn_items:,} items (dim 64) replaced {args.rounds} times")
    for label, value in churned.items():
        print(f"  {label:<42}{value:>12,.2f}")
    # the 1-index figure: the mean of the one before the build and the one after the deletes
    one = (many["query p50, 1 index (ms)"] + many["query p50, 1 index again (ms)"]) / 2
    lots = many[f"query p50, {args.indexes:,} indexes (ms)"]
    bars = {
        "memory <= 3x raw + 2 GB": many["service PSS with the indexes (MB)"]
        <= 3 * many["raw vectors + metadata (MB)"] + 2000,
        f"query p50 {lots / one:.2f}x of 1 index <= 1.2x": lots <= 1.2 * one,
        f"churn {churned[f'round {args.rounds} / round 1']:.2f}x <= 1.1x": churned[
            f"round {args.rounds} / round 1"
        ]
        <= 1.1,
    }
    print("\nbars")
    for label, met in bars.items():
        print(f"  {'ok  ' if met else 'MISS'} {label}")
    return 1 if args.check and not all(bars.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
