"""One shard growing on the PostgreSQL store past what a single stored value holds.

An in-process shard (no Ray) on a throwaway PostgreSQL server (tests/pg_server.py, fsync off):
N clustered 128-dimensional items upserted in batches of 20,000 with the service's default
WAL and snapshot settings, then a fresh shard loads the store and answers. Prints the upsert
rate, the largest value in the store against PostgreSQL's 1 GiB limit, the snapshot's chunks,
and the time from an empty process to the first answer.

Usage: .venv/bin/python benchmarks/store_growth.py [--n 2500000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import common  # noqa: F401 - puts the repository on sys.path, for tests.*
import numpy as np
import psycopg

from actors.engine.shard import Shard
from actors.types import SearchRequest, UpsertBatch
from tests.helpers import clustered
from tests.pg_server import PostgresServer, find_bindir

KEY = os.urandom(32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2_500_000)
    ap.add_argument("--batch", type=int, default=20_000)
    args = ap.parse_args(argv)
    bindir = find_bindir()
    if bindir is None:
        print("SKIP: PostgreSQL is not installed")
        return 0
    with PostgresServer(bindir) as pg:
        url = pg.create_database()
        shard = Shard(url, "growth", "g0", 0)
        t0 = time.perf_counter()
        for lo in range(0, args.n, args.batch):
            hi = min(args.n, lo + args.batch)
            x = clustered(hi - lo, 128, seed=lo)
            ids = [f"v{i}" for i in range(lo, hi)]
            shard.upsert(KEY, UpsertBatch(ids, x, None, [None] * len(ids), [None] * len(ids)))
            if (hi // args.batch) % 25 == 0:
                print(f"  {hi:,} items, {hi / (time.perf_counter() - t0):,.0f}/s", flush=True)
        shard.snapshot(KEY)
        elapsed = time.perf_counter() - t0
        shard.store.close()
        del shard  # the process that wrote it is gone: its memory is not held beside the load
        with psycopg.connect(url) as conn:
            biggest, total = conn.execute(
                "SELECT max(octet_length(data)), sum(octet_length(data)) FROM vaultvec_blobs"
            ).fetchone()
            chunks = conn.execute(
                "SELECT count(*) FROM vaultvec_blobs WHERE key LIKE '%/snap/%'"
            ).fetchone()[0]
        t1 = time.perf_counter()
        fresh = Shard(url, "growth", "g0", 0)
        q = clustered(1, 128, seed=1)
        plan = np.zeros((1, 1), dtype=np.int64)  # untrained: the one list, an exact search
        got = fresh.search(KEY, SearchRequest(q, 10, 0, plan, np.zeros((1, 1), np.float32)))
        first_answer = time.perf_counter() - t1
        count = fresh.stats(KEY).count
        fresh.store.close()
    print(f"items upserted:        {args.n:,} in {elapsed:.0f} s ({args.n / elapsed:,.0f}/s)")
    print(f"largest stored value:  {biggest / 2**20:,.1f} MiB (PostgreSQL's limit: 1,024 MiB)")
    print(f"stored in all:         {total / 2**30:,.2f} GiB; the snapshot in {chunks} chunks")
    print(
        f"fresh shard: {count:,} items, first answer after {first_answer:.1f} s ({got.ids.shape})"
    )
    return 0 if count == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
