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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from common import (
    JSON_OPTS,
    QUERY,
    connect,
    environment,
    health,
    median,
    pct,
    post,
    print_environment,
    print_table,
    running_service,
)

from cluster.client import Client, generate_key
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
    post(client, path, body)
    return time.perf_counter() - t0


def model_stats(handle: Any) -> dict[str, int]:
    return dict(handle.stats.remote().result())


@dataclass
class Upserts:
    text_s: list[float]  # per request of text items (the server embeds them)
    vector_s: list[float]  # the same items with their vectors given
    model_calls: int  # model calls the text upserts took


@dataclass
class Singles:
    text_s: list[float]
    vector_s: list[float]
    noop_s: list[float]
    embed_s: list[float]  # the Embedder alone, through its handle
    same_top: int  # queries whose text and vector answers had the same ids
    model_calls: int
    texts: int


@dataclass
class Concurrent:
    seconds: float
    clients: int
    model_calls: int
    texts: int


def warm_up(idx: Any, queries: list[str]) -> None:
    """The model loads at replica start: make sure it is in and hot."""
    t0 = time.perf_counter()
    idx.query(contents="warm up", top_k=1)
    print(f"first text query (model warm-up): {time.perf_counter() - t0:.2f}s")
    texts = queries[:32]
    ids = [f"w{i}" for i in range(len(texts))]
    idx.upsert(ids, contents=texts)
    idx.delete(ids)


def measure_upserts(client: Client, idx: Any, handle: Any, corpus: list[str], bs: int) -> Upserts:
    """Batches of ``bs`` text items (embedded on the server), then the very same items with
    their vectors given (the upsert path without the model)."""
    base = {"index_name": idx.name, "index_key": idx.key}
    nb = len(corpus) // bs
    stats0 = model_stats(handle)
    text_times = []
    for b in range(nb):
        items = [{"id": f"d{i}", "contents": corpus[i]} for i in range(b * bs, (b + 1) * bs)]
        text_times.append(
            post_timed(client, "/v1/vectors/upsert", orjson.dumps({**base, "items": items}))
        )
        done = (b + 1) * bs
        print(f"  text upsert {done:>6,}/{len(corpus):,}  {bs / text_times[-1]:6.1f} sentences/s")
    model_calls = model_stats(handle)["batch_calls"] - stats0["batch_calls"]
    got = idx.get([f"d{i}" for i in range(len(corpus))], include=["vector"])
    vec_of = {r["id"]: r["vector"] for r in got}
    vector_times = []
    for b in range(nb):
        items = [
            {"id": f"d{i}", "vector": vec_of[f"d{i}"], "contents": corpus[i]}
            for i in range(b * bs, (b + 1) * bs)
        ]
        body = orjson.dumps({**base, "items": items}, option=JSON_OPTS)
        vector_times.append(post_timed(client, "/v1/vectors/upsert", body))
    return Upserts(text_times, vector_times, model_calls)


def query_bodies(
    idx: Any, handle: Any, queries: list[str], k: int
) -> tuple[list[bytes], list[bytes]]:
    """Text query bodies, and vector query bodies carrying the server's embedding of the same
    sentences (so that the only difference is the embedding)."""
    base = {"index_name": idx.name, "index_key": idx.key}
    qvecs = np.asarray(handle.embed_batch.remote(DEFAULT_MODEL, queries).result())
    text = [
        orjson.dumps({**base, "query_contents": s, "top_k": k, "include": ["distance"]})
        for s in queries
    ]
    vec = [
        orjson.dumps({**base, "query_vectors": v.tolist(), "top_k": k, "include": ["distance"]})
        for v in qvecs
    ]
    return text, vec


def measure_singles(
    client: Client,
    handle: Any,
    queries: list[str],
    text_bodies: list[bytes],
    vec_bodies: list[bytes],
) -> Singles:
    """Sequential single queries, interleaved: no-op, text, vector, the Embedder alone."""
    for i in range(min(20, len(queries))):  # warm-up
        post(client, QUERY, text_bodies[i])
        post(client, QUERY, vec_bodies[i])
    r = Singles([], [], [], [], 0, 0, 0)
    stats0 = model_stats(handle)
    for i in range(len(queries)):
        t0 = time.perf_counter()
        health(client)
        t1 = time.perf_counter()
        r_text = post(client, QUERY, text_bodies[i])["results"]
        t2 = time.perf_counter()
        r_vec = post(client, QUERY, vec_bodies[i])["results"]
        t3 = time.perf_counter()
        handle.embed_query.remote(DEFAULT_MODEL, queries[i]).result()
        t4 = time.perf_counter()
        r.noop_s.append(t1 - t0)
        r.text_s.append(t2 - t1)
        r.vector_s.append(t3 - t2)
        r.embed_s.append(t4 - t3)
        r.same_top += [h["id"] for h in r_text] == [h["id"] for h in r_vec]
    stats1 = model_stats(handle)
    r.model_calls = stats1["query_calls"] - stats0["query_calls"]
    r.texts = stats1["query_texts"] - stats0["query_texts"]
    return r


def measure_concurrent(client: Client, handle: Any, text_bodies: list[bytes], c: int) -> Concurrent:
    """The text queries from ``c`` threads at once: the Embedder coalesces them."""
    stats0 = model_stats(handle)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        list(pool.map(lambda b: post(client, QUERY, b), text_bodies))
    t_conc = time.perf_counter() - t0
    stats1 = model_stats(handle)
    return Concurrent(
        t_conc,
        c,
        stats1["query_calls"] - stats0["query_calls"],
        stats1["query_texts"] - stats0["query_texts"],
    )


def measure_raw_model(corpus: list[str], bs: int, threads: int) -> list[float]:
    """The raw model in this process, the same batches."""
    reg = ModelRegistry(threads=threads)
    reg.encode(DEFAULT_MODEL, corpus[:32])  # load + warm
    times = []
    for b in range(len(corpus) // bs):
        t0 = time.perf_counter()
        reg.encode(DEFAULT_MODEL, corpus[b * bs : (b + 1) * bs])
        times.append(time.perf_counter() - t0)
    return times


def print_upserts(u: Upserts, raw_times: list[float], n: int) -> None:
    nb = len(u.text_s)
    text_sps, vec_sps = n / sum(u.text_s), n / sum(u.vector_s)
    rows: list[list[Any]] = [
        ["upsert 256 as text (server embeds)", f"{text_sps:,.1f} sentences/s",
         f"median batch {median(u.text_s):.2f}s", f"{u.model_calls} model calls / {nb} requests"],
        ["upsert 256 with vectors (no model)", f"{vec_sps:,.1f} items/s",
         f"median batch {median(u.vector_s):.3f}s", f"text/vector time {sum(u.text_s) / sum(u.vector_s):.1f}x"],
    ]  # fmt: skip
    if raw_times:
        raw_sps = n / sum(raw_times)
        rows.append(
            ["raw model encode, 256/batch (in-process)", f"{raw_sps:,.1f} sentences/s",
             f"median batch {median(raw_times):.2f}s", f"service/raw {text_sps / raw_sps:.2f}x"]
        )  # fmt: skip
    print_table(["upsert", "throughput", "time", "note"], rows, title="Embedding throughput")


def print_queries(sq: Singles, cq: Concurrent, k: int) -> None:
    nq = len(sq.text_s)
    p = {"text": pct(sq.text_s, 50) * 1e3, "vec": pct(sq.vector_s, 50) * 1e3}
    p99 = {"text": pct(sq.text_s, 99) * 1e3, "vec": pct(sq.vector_s, 99) * 1e3}
    noop50, embed50 = pct(sq.noop_s, 50) * 1e3, pct(sq.embed_s, 50) * 1e3
    qrows = [
        ["text query (query_contents)", f"{p['text']:.1f}", f"{p99['text']:.1f}",
         f"{p['text'] / p['vec']:.2f}x vector"],
        ["vector query (same sentence's vector)", f"{p['vec']:.1f}", f"{p99['vec']:.1f}", "1.00x"],
        ["Embedder alone (handle, 1 text)", f"{embed50:.1f}", f"{pct(sq.embed_s, 99) * 1e3:.1f}", ""],
        ["no-op GET /v1/health", f"{noop50:.1f}", f"{pct(sq.noop_s, 99) * 1e3:.1f}", ""],
    ]  # fmt: skip
    print_table(
        [f"single query, top_k={k}, {nq} each", "p50 ms", "p99 ms", "ratio"],
        qrows,
        title="Text vs vector query latency (sequential, interleaved, same index)",
    )
    seq = ["sequential (1 client)", f"{1.0 / median(sq.text_s):.1f}", f"{sq.model_calls}",
           f"{sq.texts / max(sq.model_calls, 1):.1f}"]  # fmt: skip
    conc = [f"concurrent ({cq.clients} clients)", f"{nq / cq.seconds:.1f}", f"{cq.model_calls}",
            f"{cq.texts / max(cq.model_calls, 1):.1f}"]  # fmt: skip
    print_table(
        ["text queries", "QPS", "model calls", "texts / call"],
        [seq, conc],
        title="Concurrent text queries (Embedder batching)",
    )
    print(f"text and vector queries returned identical top-{k} ids for {sq.same_top}/{nq} queries")


def figures(
    u: Upserts, raw_times: list[float], sq: Singles, cq: Concurrent, n: int
) -> dict[str, Any]:
    """The machine-readable results."""
    nq = len(sq.text_s)
    return {
        "upsert_text_sentences_per_s": n / sum(u.text_s),
        "upsert_vector_items_per_s": n / sum(u.vector_s),
        "raw_model_sentences_per_s": (n / sum(raw_times)) if raw_times else None,
        "upsert_model_calls": u.model_calls,
        "text_query_p50_ms": pct(sq.text_s, 50) * 1e3,
        "vector_query_p50_ms": pct(sq.vector_s, 50) * 1e3,
        "text_query_p99_ms": pct(sq.text_s, 99) * 1e3,
        "vector_query_p99_ms": pct(sq.vector_s, 99) * 1e3,
        "embedder_p50_ms": pct(sq.embed_s, 50) * 1e3,
        "noop_p50_ms": pct(sq.noop_s, 50) * 1e3,
        "concurrent_qps": nq / cq.seconds,
        "concurrent_model_calls": cq.model_calls,
        "concurrent_texts": cq.texts,
        "same_top": sq.same_top,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    threads = args.threads or env["cores"] or 1
    env["torch_threads"] = threads
    print_environment(env)
    bs, nb, nq, k = args.batch_size, args.batches, args.queries, args.top_k
    texts = sentences(bs * nb + nq, args.seed)
    corpus, queries = texts[: bs * nb], texts[bs * nb :]
    print(f"data: {bs * nb:,} generated sentences in {nb} upserts of {bs}; {nq} query sentences")
    with running_service(embedder_threads=threads) as svc, connect(svc.url) as client:
        idx = client.create_index(INDEX, generate_key(), embedding_model=DEFAULT_MODEL)
        handle = embedder_handle()
        warm_up(idx, queries)
        upserts = measure_upserts(client, idx, handle, corpus, bs)
        text_bodies, vec_bodies = query_bodies(idx, handle, queries, k)
        singles = measure_singles(client, handle, queries, text_bodies, vec_bodies)
        concurrent = measure_concurrent(client, handle, text_bodies, args.concurrency)
    raw_times = [] if args.no_raw else measure_raw_model(corpus, bs, threads)
    print_upserts(upserts, raw_times, len(corpus))
    print_queries(singles, concurrent, k)
    results = {"env": env, "params": vars(args)} | figures(
        upserts, raw_times, singles, concurrent, len(corpus)
    )
    if args.json_out:
        Path(args.json_out).write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
