"""Shard memory under churn: replacing every item round after round, with and without compaction.

An in-process Shard (local file store in a temp dir) takes ``--n`` items (default 20,000 x 64,
small metadata and contents), is trained on ``--lists`` lists (0: stays untrained), then every
item is replaced ``--rounds`` times (default 10). After each round the shard's idle tidy runs
(Shard._tidy: compaction, list layout, heap trim) and this prints, per live item:

* RSS: the growth of this process's private resident memory (RssAnon) since before the shard;
* arrays: the shard's own accounting, the nbytes of its per-label arrays, id map, filter
  columns and inverted lists, plus the metadata and contents objects its arrays reference.

Each mode runs in a fresh interpreter: "compaction" as the shard runs, "none" with
actors.engine.compaction.prepare switched off (how shards behaved before). The summary gives round 10
over round 1 (bar: <= 1.1 with compaction) and the time compaction took (copy of the item
table under the read lock, relabelling of the lists under the write lock).

A second table times the three ways to relabel a 100k x 128 ivfflat partition with half its
labels dead: rewriting the lists' ids in place (PartitionIndex.relabel, what compaction does,
under the write lock), copying the lists with rewritten ids, and adding the vectors again into
fresh lists; then the item table's copy at that size (under the read lock).

Usage: .venv/bin/python benchmarks/churn.py [--n 20000] [--dim 64] [--rounds 10] [--check]
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import faiss
import numpy as np
import orjson
from common import print_table

from actors.control.training import TrainParams, train_template
from actors.engine import compaction
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex, serialize
from actors.engine.shard import Shard
from actors.process import heap
from actors.types import UpsertBatch
from tests.helpers import clustered

KEY = bytes(range(32))
BAR = 1.1


# -- one mode, in its own interpreter ----------------------------------------------------------
def make_batch(ids: list[str], x: np.ndarray, round_no: int) -> UpsertBatch:
    """A batch as a shard receives it: pickled across processes. (Straight from orjson, each
    metadata blob would keep orjson's 4 KB write buffer: 4,089 bytes each by tracemalloc.)"""
    meta = tuple(orjson.dumps({"round": round_no, "group": i % 10}) for i in range(len(ids)))
    contents = tuple(f"item {i} round {round_no}" for i in ids)
    batch = UpsertBatch(tuple(ids), x, None, meta, contents)
    return pickle.loads(pickle.dumps(batch, protocol=5))


def round_vectors(n: int, dim: int, round_no: int, shift: bool) -> np.ndarray:
    """Every item's vector for one round: fresh points around the same 100 cluster centres
    (the items change, the collection's distribution does not); with ``shift`` around new
    centres each round, which the trained lists fit worse and worse."""
    centres = np.random.default_rng(1000 + round_no if shift else 0).normal(size=(100, dim))
    rng = np.random.default_rng(round_no)
    x = centres[rng.integers(0, len(centres), n)] + 0.15 * rng.normal(size=(n, dim))
    return x.astype(np.float32)


def shard_bytes(shard: Shard) -> int:
    """The shard's arrays (numpy nbytes, the lists' ids and codes) and the objects its
    metadata and contents arrays reference."""
    items, part = shard.items, shard.partition
    objects = [o for col in (items.metadata, items.contents) for o in col.tolist() if o]
    size = items.nbytes() + sum(sys.getsizeof(o) for o in objects)
    if part is not None:
        size += part.list_of.nbytes + part.radii.nbytes
        size += part.ntotal * (part.index.code_size + 8)
    return size


def wait_for_tidy(shard: Shard) -> None:
    """Join the shard's idle tidy (it starts after every write and runs once writes pause)."""
    name = f"vaultvec-tidy-{id(shard):x}"
    for thread in [t for t in threading.enumerate() if t.name == name]:
        thread.join()


class CompactionTimer:
    """Wall time of each compaction the shard runs: its copy (Compaction.seconds) and its
    relabelling; with ``enabled`` False no compaction is ever due."""

    def __init__(self, enabled: bool) -> None:
        self.seconds: list[float] = []
        apply = compaction.Compaction.apply

        def timed(plan: compaction.Compaction, part: PartitionIndex | None) -> Any:
            start = time.perf_counter()
            out = apply(plan, part)
            self.seconds.append(plan.seconds + time.perf_counter() - start)
            return out

        compaction.Compaction.apply = timed  # type: ignore[method-assign,assignment]
        if not enabled:
            compaction.prepare = lambda *args, **kw: None


def train(shard: Shard, n_lists: int, dim: int) -> None:
    if n_lists <= 0:
        return
    x = shard.sample(KEY, 40 * n_lists)
    template = train_template(x, "ivfflat", n_lists, None, None, TrainParams(max_iters=10))
    shard.rebuild(KEY, 1, serialize(template))


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    heap.configure()  # as the pool actor that hosts shards does
    timer = CompactionTimer(args.mode == "compaction")
    ids = [f"item-{i:06d}" for i in range(args.n)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        before = heap.resident_anon_bytes() or 0
        shard = Shard(f"file://{tmp}", "churn", "churn0", 0)
        for round_no in range(args.rounds + 1):
            x = round_vectors(args.n, args.dim, round_no, args.shift)
            for start in range(0, args.n, args.batch):
                end = start + args.batch
                shard.upsert(KEY, make_batch(ids[start:end], x[start:end], round_no))
            del x
            if round_no == 0:
                train(shard, args.lists, args.dim)
            wait_for_tidy(shard)
            live = len(shard.items)
            rss = (heap.resident_anon_bytes() or 0) - before
            rows.append(
                [round_no, live, shard.items.next_label, rss / live, shard_bytes(shard) / live]
            )
    return {"rows": rows, "compaction_s": timer.seconds}


# -- relabelling a partition: three ways ----------------------------------------------------------
def relabel_in_place(part: PartitionIndex, new_of: np.ndarray) -> None:
    part.relabel(new_of)


def relabel_by_copy(part: PartitionIndex, new_of: np.ndarray) -> None:
    """Copy every list with its ids rewritten (what a copy-then-swap of the lists costs)."""
    invlists = part.index.invlists
    fresh = faiss.ArrayInvertedLists(part.nlist, part.index.code_size)
    for list_no in range(part.nlist):
        n = invlists.list_size(list_no)
        if n:
            ids = np.ascontiguousarray(new_of[part._ids(list_no)])
            fresh.add_entries(list_no, n, faiss.swig_ptr(ids), invlists.get_codes(list_no))
    part.use_lists(fresh)


def relabel_by_adding(part: PartitionIndex, new_of: np.ndarray) -> None:
    """Decode every vector and fill fresh lists under the new labels (a rebuild's way)."""
    live = np.flatnonzero(part.list_of >= 0)
    vectors = part.reconstruct(live)
    index = faiss.IndexIVFFlat(part.index.quantizer, part.dimension, part.nlist, faiss.METRIC_L2)
    PartitionIndex(index).fill(new_of[live], vectors)


def time_relabels(n: int, dim: int, n_lists: int, repeats: int) -> list[list[Any]]:
    x = clustered(n, dim, seed=7)
    template = train_template(x[:20000], "ivfflat", n_lists, None, None, TrainParams(max_iters=8))
    base = PartitionIndex(template)
    base.add(np.arange(n, dtype=np.int64) * 2 + 1, x)  # every even label dead
    new_of = np.full(2 * n + 1, -1, dtype=np.int64)
    new_of[1::2] = np.arange(n)
    frame = serialize(base.index)
    out: list[tuple[str, float]] = []
    ways = (relabel_in_place, relabel_by_copy, relabel_by_adding)
    for way in ways:
        times = []
        for _ in range(repeats):
            part = PartitionIndex.from_template(frame, dim)
            start = time.perf_counter()
            way(part, new_of)
            times.append(time.perf_counter() - start)
        out.append((way.__name__.removeprefix("relabel_"), sorted(times)[repeats // 2] * 1e3))
    fastest = min(ms for _, ms in out)
    return [[name, f"{ms:.1f}", f"{ms / fastest:.1f}x"] for name, ms in out]


def churned_table(n: int) -> ItemTable:
    """``n`` items with small metadata and contents, each written twice: 2n rows."""
    ids = [f"item-{i:06d}" for i in range(n)]
    table = ItemTable()
    for round_no in range(2):
        batch = make_batch(ids, np.zeros((n, 1), dtype=np.float32), round_no)
        table.insert(batch.ids, batch.metadata, batch.contents, None)
    return table


def time_table_copy(n: int, repeats: int) -> float:
    """Milliseconds of ItemTable.relabelled (compaction's copy, under the read lock) for
    ``n`` live items among 2n rows, each time on a table fresh from its writes."""
    times = []
    for _ in range(repeats):
        table = churned_table(n)
        start = time.perf_counter()
        table.relabelled()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


# -- driver ---------------------------------------------------------------------------------------
def spawn(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--mode", mode, "--n", str(args.n), "--dim", str(args.dim)]
    cmd += ["--rounds", str(args.rounds), "--batch", str(args.batch), "--lists", str(args.lists)]
    cmd += ["--shift"] if args.shift else []
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(results: dict[str, dict[str, Any]], rounds: int) -> float:
    table = []
    for mode, res in results.items():
        for round_no, live, labels, rss, arrays in res["rows"]:
            table.append([mode, round_no, live, labels, f"{rss:,.0f}", f"{arrays:,.0f}"])
    headers = ["mode", "round", "live", "labels", "RSS B/item", "arrays B/item"]
    print_table(headers, table, "Per round (round 0: the first upsert, then training)")
    summary, ratio = [], 0.0
    for mode, res in results.items():
        first, last = res["rows"][1], res["rows"][rounds]
        secs = res["compaction_s"]
        took = f"{np.median(secs) * 1e3:.1f} (max {max(secs) * 1e3:.1f})" if secs else "-"
        rss_ratio, arr_ratio = last[3] / first[3], last[4] / first[4]
        summary.append([mode, f"{rss_ratio:.2f}", f"{arr_ratio:.2f}", len(secs), took])
        if mode == "compaction":
            ratio = max(rss_ratio, arr_ratio)
    headers = ["mode", f"RSS r{rounds}/r1", f"arrays r{rounds}/r1", "compactions", "ms each"]
    print_table(
        headers, summary, f"Bytes per live item, round {rounds} over round 1 (bar <= {BAR})"
    )
    return ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--lists", type=int, default=128, help="train on this many lists (0: never)")
    p.add_argument("--shift", action="store_true", help="new cluster centres every round")
    p.add_argument("--relabel-n", type=int, default=100000)
    p.add_argument("--relabel-dim", type=int, default=128)
    p.add_argument("--check", action="store_true", help=f"exit 1 if round 10 / round 1 > {BAR}")
    p.add_argument("--mode", choices=["compaction", "none"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    results = {mode: spawn(args, mode) for mode in ("compaction", "none")}
    ratio = report(results, args.rounds)
    rows = time_relabels(args.relabel_n, args.relabel_dim, 316, repeats=3)
    title = f"Relabelling {args.relabel_n:,} x {args.relabel_dim} ivfflat, half its labels dead"
    print_table(["way", "ms (median of 3)", "vs fastest"], rows, title)
    copy_ms = time_table_copy(args.relabel_n, repeats=3)
    print(
        f"ItemTable.relabelled, {args.relabel_n:,} live of {2 * args.relabel_n:,} rows: {copy_ms:.1f} ms"
    )
    if args.check and ratio > BAR:
        sys.exit(1)


if __name__ == "__main__":
    main()
