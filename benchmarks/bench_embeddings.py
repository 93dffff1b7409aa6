"""Text search with the real embedding model, side by side in one run.

Starts vaultvec in-process, creates an index with ``embedding_model`` (all-MiniLM-L6-v2) and
measures, on the same index:

* embedding throughput of upserts: batches of 256 sentences as text-only items (the server
  embeds them, one model call per request) -> sentences/s, next to upserting the very same
  items with their vectors given (no model) and to the raw model in this process
  (sentence-transformers ``encode`` of the same batches, same thread count);
* text-query p50 vs vector-query p50: sequential single queries, interleaved, where the
  vector query carries the server's embedding of the same sentence (so the only difference
  is the embedding), next to the no-op endpoint GET /v1/health and the Embedder alone;
* concurrent text queries: QPS with several clients and the model calls they took (the
  Embedder coalesces concurrent queries into batched model calls).

Sentences are generated from word lists (no downloads). Usage:
  .venv/bin/python benchmarks/bench_embeddings.py [--batches 8] [--queries 200] [--json-out F]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from common import (
    Client,
    environment,
    median,
    pct,
    print_environment,
    print_table,
    random_key,
    running_service,
)

from serve_app.embedder import DEFAULT_MODEL, ModelRegistry

INDEX = "bench-text"

SUBJECTS = """the engineer|my neighbour|a small startup|the city council|our team|the old farmer|
a young student|the hospital|the orchestra|a journalist|the bakery|my grandmother|the museum|
a delivery driver|the research group|the football club|a software company|the mayor|the nurse|
a tourist|the pilot|the chef|the library|a climate scientist""".replace("\n", "").split("|")
VERBS = """repaired|discussed|photographed|sold|studied|painted|cleaned|ignored|planned|measured|
celebrated|inspected|rebuilt|described|borrowed|designed|tested|recorded|moved|translated|
delivered|cancelled|reviewed|found""".replace("\n", "").split("|")
OBJECTS = """the broken bicycle|a new database server|the river bridge|an ancient map|
the quarterly budget|a vegetable garden|the concert hall|a leaking roof|the football stadium|
a rare orchid|the train timetable|a wedding cake|the encrypted backup|a mountain trail|
the school library|a vintage camera|the wind turbine|a children's book|the hospital wing|
a fishing boat|the tax report|a jazz record|the city tram|a compressed archive""".replace(
    "\n", ""
).split("|")
TAILS = """before the storm arrived|during the summer holidays|with great care|
for the local newspaper|late on Friday night|using open-source software|after a long debate|
in the early morning fog|without asking anyone|for the third time this year|
despite the heavy rain|to everyone's surprise|on a very tight budget|next to the harbour|
while the kids were asleep|as part of a charity event""".replace("\n", "").split("|")


def sentences(n: int, seed: int) -> list[str]:
    """``n`` distinct real-ish sentences from the word lists above (about 220k combinations)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
        out[s[0].upper() + s[1:]] = None
    return list(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batches", type=int, default=8, help="upsert requests of --batch-size")
    p.add_argument("--batch-size", type=int, default=256, help="sentences per upsert request")
    p.add_argument("--queries", type=int, default=200, help="sequential queries of each kind")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=8, help="clients for the concurrent run")
    p.add_argument("--threads", type=int, default=0, help="torch threads (service and raw)")
    p.add_argument("--no-raw", action="store_true", help="skip the in-process raw model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", help="write machine-readable results here")
    return p.parse_args(argv)


def embedder_handle() -> Any:
    from ray import serve

    return serve.get_deployment_handle("Embedder", app_name="vaultvec")


def post_timed(client: Client, path: str, body: bytes) -> float:
    t0 = time.perf_counter()
    client.post(path, body)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    threads = args.threads or env["cores"] or 1
    env["torch_threads"] = threads
    print_environment(env)
    bs, nb, nq, k = args.batch_size, args.batches, args.queries, args.top_k
    corpus_n = bs * nb
    texts = sentences(corpus_n + nq, args.seed)
    corpus, queries = texts[:corpus_n], texts[corpus_n:]
    print(f"data: {corpus_n:,} generated sentences in {nb} upserts of {bs}; {nq} query sentences")
    key = random_key()
    results: dict[str, Any] = {"env": env, "params": vars(args)}

    with running_service(embedder_threads=threads) as svc:
        client = Client(svc.url)
        client.post(
            "/v1/indexes/create",
            {"index_name": INDEX, "index_key": key, "embedding_model": DEFAULT_MODEL},
        )
        base = {"index_name": INDEX, "index_key": key}
        handle = embedder_handle()
        # Warm-up (the model loads at replica start; make sure it is in and hot).
        t0 = time.perf_counter()
        client.post("/v1/vectors/query", {**base, "query_contents": "warm up", "top_k": 1})
        print(f"first text query (model warm-up): {time.perf_counter() - t0:.2f}s")
        client.post(
            "/v1/vectors/upsert",
            {**base, "items": [{"id": f"w{i}", "contents": s} for i, s in enumerate(queries[:32])]},
        )
        client.post("/v1/vectors/delete", {**base, "ids": [f"w{i}" for i in range(32)]})

        # -- upsert throughput: text items (embedded on the server) ---------------------------
        stats0 = handle.stats.remote().result()
        text_times = []
        for b in range(nb):
            items = [{"id": f"d{i}", "contents": corpus[i]} for i in range(b * bs, (b + 1) * bs)]
            text_times.append(
                post_timed(client, "/v1/vectors/upsert", orjson.dumps({**base, "items": items}))
            )
            done = (b + 1) * bs
            print(f"  text upsert {done:>6,}/{corpus_n:,}  {bs / text_times[-1]:6.1f} sentences/s")
        stats1 = handle.stats.remote().result()
        model_calls = stats1["batch_calls"] - stats0["batch_calls"]

        # The same items with their vectors given: the upsert path without the model.
        ids = [f"d{i}" for i in range(corpus_n)]
        got = client.post("/v1/vectors/get", {**base, "ids": ids, "include": ["vector"]})
        vec_of = {r["id"]: r["vector"] for r in got["results"]}
        vector_times = []
        for b in range(nb):
            items = [
                {"id": f"d{i}", "vector": vec_of[f"d{i}"], "contents": corpus[i]}
                for i in range(b * bs, (b + 1) * bs)
            ]
            vector_times.append(
                post_timed(client, "/v1/vectors/upsert", orjson.dumps({**base, "items": items}))
            )

        # -- single-query latency: text vs vector (same sentence), interleaved ----------------
        qvecs = np.asarray(handle.embed_batch.remote(DEFAULT_MODEL, queries).result())
        text_bodies = [
            orjson.dumps({**base, "query_contents": s, "top_k": k, "include": ["distance"]})
            for s in queries
        ]
        vec_bodies = [
            orjson.dumps(
                {**base, "query_vectors": qvecs[i].tolist(), "top_k": k, "include": ["distance"]}
            )
            for i in range(nq)
        ]
        for i in range(min(20, nq)):  # warm-up
            client.post("/v1/vectors/query", text_bodies[i])
            client.post("/v1/vectors/query", vec_bodies[i])
        t_text, t_vec, t_noop, t_embed = [], [], [], []
        same_top = 0
        stats_seq0 = handle.stats.remote().result()
        for i in range(nq):
            t0 = time.perf_counter()
            client.health()
            t1 = time.perf_counter()
            r_text = client.post("/v1/vectors/query", text_bodies[i])["results"]
            t2 = time.perf_counter()
            r_vec = client.post("/v1/vectors/query", vec_bodies[i])["results"]
            t3 = time.perf_counter()
            handle.embed_query.remote(DEFAULT_MODEL, queries[i]).result()
            t4 = time.perf_counter()
            t_noop.append(t1 - t0)
            t_text.append(t2 - t1)
            t_vec.append(t3 - t2)
            t_embed.append(t4 - t3)
            same_top += [r["id"] for r in r_text] == [r["id"] for r in r_vec]

        # -- concurrent text queries: coalesced model calls ---------------------------------
        stats2 = handle.stats.remote().result()
        seq_calls = stats2["query_calls"] - stats_seq0["query_calls"]
        seq_texts = stats2["query_texts"] - stats_seq0["query_texts"]
        c = args.concurrency
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            list(pool.map(lambda b: client.post("/v1/vectors/query", b), text_bodies))
        t_conc = time.perf_counter() - t0
        stats3 = handle.stats.remote().result()
        conc_calls = stats3["query_calls"] - stats2["query_calls"]
        conc_texts = stats3["query_texts"] - stats2["query_texts"]
        client.close()

    # -- raw model in this process, same batches --------------------------------------------
    raw_times: list[float] = []
    if not args.no_raw:
        reg = ModelRegistry(threads=threads)
        reg.encode(DEFAULT_MODEL, corpus[:32])  # load + warm
        for b in range(nb):
            t0 = time.perf_counter()
            reg.encode(DEFAULT_MODEL, corpus[b * bs : (b + 1) * bs])
            raw_times.append(time.perf_counter() - t0)

    text_sps = corpus_n / sum(text_times)
    vec_sps = corpus_n / sum(vector_times)
    p = {name: pct(v, 50) * 1e3 for name, v in [("text", t_text), ("vec", t_vec)]}
    p99 = {name: pct(v, 99) * 1e3 for name, v in [("text", t_text), ("vec", t_vec)]}
    noop50, embed50 = pct(t_noop, 50) * 1e3, pct(t_embed, 50) * 1e3
    rows: list[list[Any]] = [
        ["upsert 256 as text (server embeds)", f"{text_sps:,.1f} sentences/s",
         f"median batch {median(text_times):.2f}s", f"{model_calls} model calls / {nb} requests"],
        ["upsert 256 with vectors (no model)", f"{vec_sps:,.1f} items/s",
         f"median batch {median(vector_times):.3f}s", f"text/vector time {sum(text_times) / sum(vector_times):.1f}x"],
    ]  # fmt: skip
    if raw_times:
        raw_sps = corpus_n / sum(raw_times)
        rows.append(
            ["raw model encode, 256/batch (in-process)", f"{raw_sps:,.1f} sentences/s",
             f"median batch {median(raw_times):.2f}s", f"service/raw {text_sps / raw_sps:.2f}x"]
        )  # fmt: skip
    print_table(["upsert", "throughput", "time", "note"], rows, title="Embedding throughput")
    qrows = [
        ["text query (query_contents)", f"{p['text']:.1f}", f"{p99['text']:.1f}",
         f"{p['text'] / p['vec']:.2f}x vector"],
        ["vector query (same sentence's vector)", f"{p['vec']:.1f}", f"{p99['vec']:.1f}", "1.00x"],
        ["Embedder alone (handle, 1 text)", f"{embed50:.1f}", f"{pct(t_embed, 99) * 1e3:.1f}", ""],
        ["no-op GET /v1/health", f"{noop50:.1f}", f"{pct(t_noop, 99) * 1e3:.1f}", ""],
    ]  # fmt: skip
    print_table(
        [f"single query, top_k={k}, {nq} each", "p50 ms", "p99 ms", "ratio"],
        qrows,
        title="Text vs vector query latency (sequential, interleaved, same index)",
    )
    seq_qps = 1.0 / median(t_text)
    print_table(
        ["text queries", "QPS", "model calls", "texts / call"],
        [
            [
                "sequential (1 client)",
                f"{seq_qps:.1f}",
                f"{seq_calls}",
                f"{seq_texts / max(seq_calls, 1):.1f}",
            ],
            [
                f"concurrent ({c} clients)",
                f"{nq / t_conc:.1f}",
                f"{conc_calls}",
                f"{conc_texts / max(conc_calls, 1):.1f}",
            ],
        ],
        title="Concurrent text queries (Embedder batching)",
    )
    print(f"text and vector queries returned identical top-{k} ids for {same_top}/{nq} queries")
    results.update(
        upsert_text_sentences_per_s=text_sps,
        upsert_vector_items_per_s=vec_sps,
        raw_model_sentences_per_s=(corpus_n / sum(raw_times)) if raw_times else None,
        upsert_model_calls=model_calls,
        text_query_p50_ms=p["text"],
        vector_query_p50_ms=p["vec"],
        text_query_p99_ms=p99["text"],
        vector_query_p99_ms=p99["vec"],
        embedder_p50_ms=embed50,
        noop_p50_ms=noop50,
        concurrent_qps=nq / t_conc,
        concurrent_model_calls=conc_calls,
        concurrent_texts=conc_texts,
        same_top=same_top,
    )
    if args.json_out:
        Path(args.json_out).write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
