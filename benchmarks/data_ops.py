"""Data management at scale: a cursor's scan, backup, restore and export, then count, update
and delete by filter, on a live vaultvec.

One default server, one index of N clustered vectors (128 dims) with metadata
``{cat: i % 100, grp: i % 10, flag: i % 2}`` upserted through the Python client, trained; then,
each timed once: every id through list_ids pages of 10,000; `vaultvec backup` of the index to a
file and `vaultvec restore` of it under another name (MB/s of the file); `vaultvec export` to
.npy; count by a 10% filter, update by a 10% filter ($set of a field, vectors untouched), count
of the updated field, delete by a 1% filter and by a 10% filter; and the shard processes'
private memory (RssAnon) before and after each.

Usage: .venv/bin/python benchmarks/data_ops.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import common

from cluster.bulk import backup as tool
from cluster.bulk.export import export
from cluster.client.calls import Call
from tests.helpers import clustered


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args(argv)
    n = args.n
    x = clustered(n, args.dim, seed=0)
    ids = [f"v{i}" for i in range(n)]
    rows: list[list[str]] = []
    with common.running_service() as svc:
        client = common.connect(svc.url)
        idx = client.create_index("ops", common.secrets.token_hex(32), dimension=args.dim)
        t0 = time.perf_counter()
        batch = 20_000
        for s in range(0, n, batch):
            e = min(n, s + batch)
            meta = [{"cat": i % 100, "grp": i % 10, "flag": i % 2} for i in range(s, e)]
            idx.upsert(ids[s:e], x[s:e], metadata=meta)
        print(f"upserted {n:,} in {time.perf_counter() - t0:.1f}s", flush=True)
        common.train_and_wait(client, idx)
        mib = 2**20

        def timed(label: str, fn, expect: int) -> None:
            before = common.shard_resident_bytes() or 0
            t = time.perf_counter()
            got = fn()
            el = time.perf_counter() - t
            after = common.shard_resident_bytes() or 0
            assert got == expect, (label, got, expect)
            rows.append(
                [
                    label,
                    f"{got:,}",
                    f"{el:.2f}",
                    f"{got / el:,.0f}",
                    f"{(after - before) / mib:+.0f}",
                ]
            )
            print(rows[-1], flush=True)

        def scan() -> int:
            got, cursor = 0, None
            while True:
                extra = {"cursor": cursor} if cursor else {}
                body = {"index_name": "ops", "index_key": idx.key, "limit": 10_000, **extra}
                page = client.call(Call("/v1/vectors/list_ids", body))
                got += page["count"]
                cursor = page["next_cursor"]
                if cursor is None:
                    return got

        timed("list_ids by cursor, pages of 10,000", scan, n)
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            out = Path(tmp) / "ops.vvb"

            def backup() -> int:
                tool.backup(client, "ops", idx.key, out)
                return n

            timed("backup", backup, n)
            size = out.stat().st_size
            backup_s = float(rows[-1][2])
            timed("restore", lambda: tool.restore(client, out, idx.key, name="ops-copy"), n)
            restore_s = float(rows[-1][2])
            copy = client.index("ops-copy", idx.key)
            assert copy.get(["v7"], include=["vector"])[0]["vector"].tolist() == x[7].tolist()
            copy.drop()
            timed("export .npy", lambda: export(idx, Path(tmp) / "ops.npy", page_size=5000), n)
            print(
                f"backup file {size / 1e6:,.0f} MB ({size / n:.0f} B an item): backup "
                f"{size / 1e6 / backup_s:,.0f} MB/s, restore {size / 1e6 / restore_s:,.0f} MB/s",
                flush=True,
            )
        timed("count {grp: 3} (10%)", lambda: idx.count({"grp": 3}), n // 10)
        timed(
            "update {grp: 3} $set (10%)",
            lambda: idx.update(filters={"grp": 3}, set={"seen": True}),
            n // 10,
        )
        timed("count {seen: true}", lambda: idx.count({"seen": True}), n // 10)
        timed("delete {cat: 7} (1%)", lambda: idx.delete(filters={"cat": 7}), n // 100)
        timed("delete {grp: 4} (10%)", lambda: idx.delete(filters={"grp": 4}), n // 10)
        q = idx.query(x[:1], top_k=5)
        assert len(q.ids[0]) == 5
        print(
            f"shard processes' RssAnon at the end: {(common.shard_resident_bytes() or 0) / mib:,.0f} MiB"
        )
        idx.drop()
    common.print_table(["operation", "items", "seconds", "items/s", "shard RssAnon Δ MiB"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
