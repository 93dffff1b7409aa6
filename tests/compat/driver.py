"""Drive one release of the real ``cyborgdb`` SDK against a running vaultvec server.

Run in a subprocess whose ``PYTHONPATH`` holds that release only (``test_sdk.py`` does this)::

    PYTHONPATH=~/.cache/vaultvec-compat/cyborgdb-0.18.0 \\
        .venv/bin/python -m tests.compat.driver --url http://127.0.0.1:8000 --api-key KEY \\
        --release 0.18.0

Every public method of the release is exercised on every index type it can create, and the
results are checked against an oracle computed here (stored vectors, brute-force distances,
metadata predicates). Each check ends ``passed``, ``failed`` (with the exception and the last
HTTP exchanges the SDK made) or ``n/a`` (with the reason); the JSON report goes to stdout, and
after every check to ``--report`` if given (so a hung run still leaves a partial report).

Check names are ``<scenario>/<check>``: scenarios are the index kinds (``ivfflat``, ``ivf``,
``ivfsq``, ``ivfpq`` through the config classes of 0.11-0.16; ``float32``, ``float16``,
``tq*`` through ``storage_precision`` in 0.17+), ``cosine``, ``text`` (server-side embeddings),
``client`` (index-independent calls), ``contract``, ``rbac``, ``bm25`` (whose answers the
report also carries, for test_sdk.py to check against the reference BM25), ``schema`` and the
out-of-scope ``kms`` (0.17+/0.18).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DIM = 16
N = 300
N_LISTS = 8
PQ_DIM = 8
PQ_BITS = 8
TEXT_MODEL = "all-MiniLM-L6-v2"
TEXT_DIM = 384
TRAIN_TIMEOUT_S = 90.0
HTTP_TIMEOUT_S = 120.0
SAMPLE = ("v3", "v160", "v250")  # one id from each upsert form (dicts, numpy, binary)

# Distance tolerance of a stored vector queried against itself, and of reported distances
# against brute force, per kind. Exact kinds are also compared id for id with brute force.
# Untrained indexes search exactly; once trained, the self-distances measured were about
# 0.002 (float16), 0.035 (ivf/ivfsq, 8-bit SQ) and 0.25 (ivfpq, 8 x 8 bits) at DIM 16.
EXACT_KINDS = {"ivfflat", "float32", "cosine"}
TOLERANCE = {
    "ivfflat": 1e-3,
    "float32": 1e-3,
    "cosine": 1e-4,
    "float16": 1e-2,
    "ivf": 0.15,
    "ivfsq": 0.15,
    "ivfpq": 0.8,
}

FILTERS: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], bool]]] = [
    ("eq", {"category": "a"}, lambda m: m["category"] == "a"),
    ("range", {"score": {"$gte": 20, "$lt": 40}}, lambda m: 20 <= m["score"] < 40),
    ("in", {"category": {"$in": ["b", "c"]}}, lambda m: m["category"] in ("b", "c")),
    ("list_element", {"tags": "t3"}, lambda m: "t3" in m["tags"]),
    (
        "and_or_dot_path",
        {"$and": [{"loc.city": "oslo"}, {"$or": [{"flag": True}, {"score": {"$lt": 10}}]}]},
        lambda m: m["loc"]["city"] == "oslo" and (m["flag"] or m["score"] < 10),
    ),
]

TEXT_DOCS = {
    "gzip": ("gzip is a command-line tool that compresses files to save disk space", "computing"),
    "git": ("git records every change to source code so developers can undo mistakes", "computing"),
    "bread": ("knead the dough, let it rise for an hour, then bake the loaf in a hot oven", "food"),
    "sushi": ("sushi combines vinegared rice with raw fish and seaweed", "food"),
    "whale": ("blue whales are the largest animals that have ever lived in the ocean", "animals"),
    "rain": ("heavy rain and strong winds are forecast for tomorrow afternoon", "weather"),
}
TEXT_QUERIES = {
    "bread": "how do I bake my own bread at home",
    "git": "version control for programmers' source code",
    "whale": "the biggest creature in the sea",
}


class NotApplicable(Exception):
    """Raised inside a check: the check does not apply (the reason is the message)."""


class CheckFailed(AssertionError):
    pass


def expect(cond: object, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


# -- HTTP capture -------------------------------------------------------------------------------


def _shorten(value: Any) -> Any:
    """A JSON body made readable: long arrays and base64 blobs summarised, the key hidden."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "index_key" and isinstance(v, str):
                out[k] = "<index_key>"
            elif k == "vectors_b64" and isinstance(v, str):
                out[k] = f"<{len(v)} base64 chars>"
            else:
                out[k] = _shorten(v)
        return out
    if isinstance(value, list):
        if len(value) > 4 and all(isinstance(x, (int, float)) for x in value):
            return [*value[:3], f"... {len(value)} numbers"]
        if len(value) > 6:
            return [*(_shorten(x) for x in value[:4]), f"... {len(value)} items"]
        return [_shorten(x) for x in value]
    return value


def _render(raw: Any, limit: int = 900) -> str:
    if raw is None:
        return ""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        text = json.dumps(_shorten(json.loads(raw)))
    except (TypeError, ValueError):
        text = str(raw)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class HttpLog:
    """Wraps urllib3 (the SDKs' generated client uses it) to keep the recent exchanges."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []

    def install(self) -> None:
        import urllib3

        original = urllib3.PoolManager.request
        log = self

        def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = urllib3.Timeout(connect=10.0, read=HTTP_TIMEOUT_S)
            entry: dict[str, Any] = {
                "request": f"{method} {url.split('//', 1)[-1].split('/', 1)[-1]}",
                "body": _render(kwargs.get("body")),
            }
            log.exchanges.append(entry)
            resp = original(self, method, url, *args, **kwargs)
            try:
                entry["status"] = resp.status
                entry["response"] = _render(resp.data)  # .data caches the body for the SDK
            except Exception as exc:  # pragma: no cover - reported, never raised
                entry["response"] = f"<unreadable: {exc}>"
            return resp

        urllib3.PoolManager.request = request  # type: ignore[method-assign]

    def mark(self) -> int:
        return len(self.exchanges)

    def since(self, mark: int, keep: int = 3) -> list[dict[str, Any]]:
        return self.exchanges[mark:][-keep:]


# -- the report ---------------------------------------------------------------------------------


@dataclass
class Report:
    release: str
    report_path: str | None
    checks: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        self.checks.append(record)
        if self.report_path:
            tmp = f"{self.report_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.as_dict(), f, indent=1)
            os.replace(tmp, self.report_path)

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for c in self.checks:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        return {
            "release": self.release,
            **self.info,
            "duration_s": round(time.monotonic() - self.started, 1),
            "counts": counts,
            "checks": self.checks,
        }


# -- the oracle ---------------------------------------------------------------------------------


@dataclass
class Item:
    id: str
    vector: np.ndarray
    metadata: dict[str, Any] | None
    contents: str | None


def make_metadata(i: int) -> dict[str, Any]:
    return {
        "category": "abc"[i % 3],
        "score": i % 100,
        "tags": ["even" if i % 2 == 0 else "odd", f"t{i % 5}"],
        "loc": {"city": "paris" if i % 2 == 0 else "oslo"},
        "flag": i % 4 == 0,
    }


def make_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(12, DIM))
    labels = rng.integers(0, len(centres), size=n)
    return (centres[labels] + rng.normal(size=(n, DIM))).astype(np.float32)


BM25_WORDS = [
    "whale",
    "ocean",
    "sea",
    "bread",
    "bake",
    "oven",
    "dough",
    "rocket",
    "moon",
    "star",
    "song",
    "piano",
    "drum",
]
BM25_CASES: list[dict[str, Any]] = [
    {"text": "whales ocean"},
    {"text": "baking bread", "text_fields": ["body"], "top_k": 5},
    {"text": "moon star", "text_fields": ["body", "title"], "text_field_weights": [1.0, 2.5]},
    {"text": "piano drum song", "require_all_terms": True},
    {"text": "sea bread", "filters": {"topic": {"$in": ["food", "animals"]}}},
]


def bm25_docs() -> dict[str, dict[str, Any]]:
    """The bm25 scenario's items: TEXT_DOCS and 60 generated ones (body, title, topic)."""
    rng = np.random.default_rng(5)
    docs = {k: {"body": text, "topic": topic} for k, (text, topic) in TEXT_DOCS.items()}
    for i in range(60):
        words = rng.choice(BM25_WORDS, size=int(rng.integers(2, 9)))
        docs[f"b{i:02d}"] = {
            "body": " ".join(words),
            "title": " ".join(rng.choice(BM25_WORDS, size=2)),
            "topic": ["food", "animals", "space", "music"][i % 4],
        }
    return docs


def distances(metric: str, query: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    if metric == "cosine":
        q = query / np.linalg.norm(query)
        m = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
        return (1.0 - m @ q).astype(np.float64)
    d = np.linalg.norm(matrix - query, axis=1).astype(np.float64)
    return d * d if metric == "squared_euclidean" else d


class Oracle:
    def __init__(self, metric: str = "euclidean") -> None:
        self.metric = metric
        self.items: dict[str, Item] = {}

    def put(self, item: Item) -> None:
        self.items[item.id] = item

    def drop(self, ids: list[str]) -> None:
        for i in ids:
            self.items.pop(i, None)

    def brute_force(self, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        ids = list(self.items)
        matrix = np.stack([self.items[i].vector for i in ids])
        d = distances(self.metric, query, matrix)
        order = np.argsort(d, kind="stable")[:k]
        return [(ids[j], float(d[j])) for j in order]

    def matching(self, pred: Callable[[dict[str, Any]], bool]) -> set[str]:
        return {i for i, it in self.items.items() if it.metadata is not None and pred(it.metadata)}


# -- the driver ---------------------------------------------------------------------------------


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


class Driver:
    def __init__(self, url: str, api_key: str, release: str, report: Report, only: set[str]):
        self.url = url
        self.api_key = api_key
        self.release = release
        self.v = version_tuple(release)
        self.report = report
        self.only = only
        self.http = HttpLog()
        self.http.install()
        self.cyborgdb = importlib.import_module("cyborgdb")
        self.client: Any = None
        self.run_id = uuid.uuid4().hex[:6]

    # ---- checks

    def at_least(self, version: str) -> bool:
        return self.v >= version_tuple(version)

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[None]:
        mark = self.http.mark()
        t0 = time.monotonic()
        record: dict[str, Any] = {"name": name, "status": "passed"}
        try:
            yield
        except NotApplicable as exc:
            record.update(status="n/a", detail=str(exc))
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, CheckFailed):
                frames = traceback.extract_tb(exc.__traceback__)
                here = [f for f in frames if f.filename.endswith("driver.py")]
                if here:
                    detail += f" (driver line {here[-1].lineno})"
            record.update(status="failed", detail=detail[:2000], http=self.http.since(mark, keep=3))
        record["seconds"] = round(time.monotonic() - t0, 2)
        self.report.add(record)

    def na(self, name: str, reason: str) -> None:
        self.report.add({"name": name, "status": "n/a", "detail": reason})

    def passed(self, name: str) -> bool:
        return any(c["name"] == name and c["status"] == "passed" for c in self.report.checks)

    def blocked(self, name: str, cause: str) -> None:
        self.report.add({"name": name, "status": "failed", "detail": f"not run: {cause} failed"})

    def name(self, scenario: str) -> str:
        return f"compat-{self.release.replace('.', '')}-{scenario}-{self.run_id}"

    # ---- SDK adapters (what differs between releases)

    def generate_key(self) -> bytes:
        if self.at_least("0.12.0"):
            return bytes(self.cyborgdb.Client.generate_key())
        return bytes(self.cyborgdb.generate_key())

    def kinds(self) -> list[str]:
        if self.at_least("0.17.0"):
            return ["float32", "float16"]
        if self.at_least("0.15.0"):
            return ["ivfflat", "ivfsq", "ivfpq"]
        return ["ivfflat", "ivf", "ivfpq"]

    def create(
        self,
        name: str,
        key: bytes,
        kind: str,
        metric: str | None = None,
        embedding_model: str | None = None,
        dimension: int | None = DIM,
    ) -> Any:
        c = self.client
        if self.at_least("0.17.0"):
            kwargs: dict[str, Any] = {"index_key": key}
            if dimension is not None:
                kwargs["dimension"] = dimension
            if metric is not None:
                kwargs["metric"] = metric
            if embedding_model is not None:
                kwargs["embedding_model"] = embedding_model
            if kind != "default":  # float32, float16, tq*
                kwargs["storage_precision"] = kind
            return c.create_index(name, **kwargs)
        classes = {
            "ivfflat": "IndexIVFFlat",
            "ivf": "IndexIVF",
            "ivfsq": "IndexIVFSQ",
            "ivfpq": "IndexIVFPQ",
        }
        cls = getattr(self.cyborgdb, classes[kind])
        cfg: dict[str, Any] = {}
        if dimension is not None:
            cfg["dimension"] = dimension
        if kind == "ivfpq":
            cfg.update(pq_dim=PQ_DIM, pq_bits=PQ_BITS)
        if not self.at_least("0.12.0"):
            cfg["n_lists"] = N_LISTS
            if metric is not None:
                cfg["metric"] = metric
            return c.create_index(name, key, cls(**cfg), embedding_model)
        return c.create_index(name, key, cls(**cfg), embedding_model=embedding_model, metric=metric)

    def contents(self, text: str) -> Any:
        """Item contents as this release's upsert takes them: before 0.13 the SDK passed them
        to its generated ``VectorItem`` unwrapped, which accepts only a ``Contents`` model."""
        if self.at_least("0.13.0"):
            return text
        from cyborgdb.openapi_client.models import Contents

        return Contents(text)

    def binary_contents(self, texts: list[str]) -> list[Any]:
        """upsert_binary contents: 0.15-0.17 hand them to the generated ``BinaryVectorBatch``
        unwrapped, which takes only its anyOf model; 0.18 wraps them itself."""
        if self.at_least("0.18.0"):
            return texts
        from cyborgdb.openapi_client.models.binary_vector_batch_contents_inner import (
            BinaryVectorBatchContentsInner,
        )

        return [BinaryVectorBatchContentsInner(t) for t in texts]

    def expect_load_rejected(self, name: str, key: bytes, status: int) -> None:
        """load_index must fail with ``status``. 0.12-0.16 never raise: they probe describe
        through ``index_type``, which logs the error and answers "unknown"; there the status
        is read from the HTTP exchange."""
        mark = self.http.mark()
        try:
            handle = self.client.load_index(name, key)
        except Exception as exc:
            expect(str(status) in str(exc), f"expected a {status}, got {exc}")
            if self.at_least("0.18.0"):
                want = {401: "AuthenticationError", 404: "NotFoundError"}[status]
                expect(type(exc).__name__ == want, f"0.18 raised {type(exc).__name__}")
            return
        expect(not self.at_least("0.17.0"), "load_index succeeded")
        codes = [e.get("status") for e in self.http.exchanges[mark:]]
        expect(status in codes, f"describe answered {codes}, expected {status}")
        expect(handle.index_type == "unknown", f"index_type {handle.index_type!r}")

    def query_single(self, index: Any, vector: Any, **kwargs: Any) -> Any:
        if self.at_least("0.12.0"):
            return index.query(query_vectors=vector, **kwargs)
        return index.query(query_vector=vector, **kwargs)

    def flat(self, raw: Any) -> list[dict[str, Any]]:
        """One query's results: 0.11 and 0.12 wrap a single query's list in another list."""
        expect(isinstance(raw, list), f"query returned {type(raw).__name__}, not a list")
        if raw and isinstance(raw[0], list):
            expect(len(raw) == 1, f"single query returned {len(raw)} result lists")
            return list(raw[0])
        return list(raw)

    def train(self, index: Any) -> None:
        if self.at_least("0.12.0"):
            index.train(n_lists=N_LISTS)
        else:
            index.train()

    def wait_trained(self, index: Any) -> float:
        t0 = time.monotonic()
        while not index.is_trained():
            expect(
                time.monotonic() - t0 < TRAIN_TIMEOUT_S,
                f"index not trained {TRAIN_TIMEOUT_S:.0f}s after train()",
            )
            time.sleep(0.25)
        return time.monotonic() - t0

    def raw_num_vectors(self, index: Any) -> int:
        from cyborgdb.openapi_client.models.index_operation_request import (
            IndexOperationRequest,
        )

        request = IndexOperationRequest(index_key=index._key_to_hex(), index_name=index.index_name)
        resp = index._api.get_index_size_v1_vectors_num_vectors_post_without_preload_content(
            index_operation_request=request
        )
        expect(resp.status == 200, f"num_vectors answered {resp.status}: {resp.data[:300]!r}")
        body = json.loads(resp.data)
        # The generated model keeps only status/message: parse it too, as the SDK would.
        index._api.get_index_size_v1_vectors_num_vectors_post(index_operation_request=request)
        expect("result" in body, f"num_vectors body has no 'result': {body}")
        return int(body["result"])

    def drop_quietly(self, index: Any) -> None:
        with contextlib.suppress(Exception):
            index.delete_index()

    # ---- run

    def run(self) -> None:
        self.report.info["sdk_version"] = importlib.metadata.version("cyborgdb")
        self.report.info["sdk_path"] = os.path.dirname(self.cyborgdb.__file__)
        self.client_checks()
        if self.client is None:
            return
        scenarios: list[tuple[str, Callable[[], None]]] = []
        for i, kind in enumerate(self.kinds()):
            scenarios.append((kind, lambda k=kind, full=(i == 0): self.vector_scenario(k, full)))
        scenarios.append(("cosine", self.cosine_scenario))
        scenarios.append(("contract", self.contract_scenario))
        scenarios.append(("text", self.text_scenario))
        if self.at_least("0.17.0"):
            scenarios.append(("kms", self.kms_scenario))
        if self.at_least("0.18.0"):
            scenarios.append(("tq", self.tq_scenario))
            scenarios.append(("bm25", self.bm25_scenario))
            scenarios.append(("schema", self.schema_scenario))
        for name, fn in scenarios:
            if self.only and name not in self.only:
                continue
            try:
                fn()
            except Exception as exc:  # a bug in a scenario must not hide the others
                self.report.add(
                    {
                        "name": f"{name}/scenario",
                        "status": "failed",
                        "detail": f"scenario aborted: {type(exc).__name__}: {exc}",
                    }
                )

    def client_checks(self) -> None:
        s = "client"
        with self.check(f"{s}/import"):
            expect(
                self.report.info["sdk_version"] == self.release,
                f"imported cyborgdb {self.report.info['sdk_version']}, expected {self.release}",
            )
        with self.check(f"{s}/construct"):
            self.client = self.cyborgdb.Client(self.url, self.api_key)
        if self.client is None:
            return
        with self.check(f"{s}/generate_key"):
            key = self.generate_key()
            expect(len(key) == 32 and key != self.generate_key(), "generate_key: 32 random bytes")
        with self.check(f"{s}/get_health"):
            if self.at_least("0.12.0"):
                health = self.client.get_health()
            else:
                health = self.client.api.health_check_v1_health_get()
            health = dict(health)
            expect(health.get("status") == "healthy", f"health: {health}")
        with self.check(f"{s}/list_indexes"):
            names = self.client.list_indexes()
            expect(isinstance(names, list), f"list_indexes returned {names!r}")
        with self.check(f"{s}/wrong_api_key_rejected"):
            bad = self.cyborgdb.Client(self.url, "not-the-api-key")
            try:
                bad.list_indexes()
            except Exception as exc:
                expect("401" in str(exc), f"expected a 401, got {exc}")
            else:
                raise CheckFailed("list_indexes with a wrong API key succeeded")
        with self.check(f"{s}/load_index.unknown_rejected"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("0.11 has no Client.load_index")
            self.expect_load_rejected(self.name("missing"), self.generate_key(), 404)
        self.na(
            f"{s}/get_demo_api_key",
            "calls CyborgDB's hosted demo-key service, not the index server",
        )
        self.na(
            f"{s}/CyborgVectorStore",
            "LangChain wrapper over the methods checked here; needs langchain-core",
        )
        if self.at_least("0.18.0"):
            self.na(f"{s}/load_sample_dataset", "downloads CyborgDB's sample data sets")

    # ---- the main scenario: one index kind

    def vector_scenario(self, kind: str, full: bool) -> None:
        s = kind
        tol = TOLERANCE[kind]
        exact = kind in EXACT_KINDS
        name = self.name(kind)
        key = self.generate_key()
        oracle = Oracle()
        vectors = make_vectors(N, seed=7)
        index: Any = None

        # float16 is created without a dimension: it is fixed by the first upsert.
        auto_dim = kind == "float16"
        with self.check(f"{s}/create"):
            index = self.create(name, key, kind, dimension=None if auto_dim else DIM)
        if index is None:
            self.blocked(f"{s}/scenario", "create")
            return
        try:
            self._vector_scenario(s, kind, full, tol, exact, name, key, index, oracle, vectors)
        finally:
            if not self.passed(f"{s}/delete_index"):
                self.drop_quietly(index)

    def _vector_scenario(
        self,
        s: str,
        kind: str,
        full: bool,
        tol: float,
        exact: bool,
        name: str,
        key: bytes,
        index: Any,
        oracle: Oracle,
        vectors: np.ndarray,
    ) -> None:
        with self.check(f"{s}/create.duplicate_rejected"):
            try:
                self.create(name, self.generate_key(), kind)
            except Exception as exc:
                expect("409" in str(exc), f"expected a 409, got {exc}")
                if self.at_least("0.18.0"):
                    expect(type(exc).__name__ == "ConflictError", type(exc).__name__)
            else:
                raise CheckFailed("a second create_index with the same name succeeded")

        with self.check(f"{s}/list_indexes"):
            names = self.client.list_indexes()
            expect(name in names, f"{name} not in list_indexes: {names}")

        with self.check(f"{s}/load_index"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("0.11 has no Client.load_index")
            loaded = self.client.load_index(name, key)
            expect(loaded.index_name == name, f"loaded index_name {loaded.index_name}")
            if self.at_least("0.17.0"):
                want = 0 if kind == "float16" else DIM
                expect(loaded.dimension == want, f"loaded dimension {loaded.dimension} != {want}")
            else:
                expect(loaded.index_type != "unknown", "loaded index_type is 'unknown'")

        with self.check(f"{s}/load_index.wrong_key_rejected"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("0.11 has no Client.load_index")
            self.expect_load_rejected(name, self.generate_key(), 401)

        self.check_properties(s, kind, index, trained=False)

        # ---- upserts: dicts (0-149), ids + numpy (150-229), upsert_binary / dicts (230-299)
        dict_items = []
        for i in range(150):
            meta, text = make_metadata(i), f"doc {i}"
            dict_items.append(
                {
                    "id": f"v{i}",
                    "vector": vectors[i].tolist(),
                    "metadata": meta,
                    "contents": self.contents(text),
                }
            )
        with self.check(f"{s}/upsert.dicts"):
            index.upsert(dict_items)
            for i in range(150):
                oracle.put(Item(f"v{i}", vectors[i], make_metadata(i), f"doc {i}"))

        with self.check(f"{s}/upsert.ids_numpy"):
            ids = [f"v{i}" for i in range(150, 230)]
            index.upsert(ids, vectors[150:230])
            for i in range(150, 230):
                oracle.put(Item(f"v{i}", vectors[i], None, None))

        ids = [f"v{i}" for i in range(230, N)]
        metas = [make_metadata(i) for i in range(230, N)]
        if self.at_least("0.15.0"):
            with self.check(f"{s}/upsert_binary"):
                contents = [f"doc {i}" for i in range(230, N)]
                index.upsert_binary(
                    ids, vectors[230:N], metadata=metas, contents=self.binary_contents(contents)
                )
                for j, i in enumerate(range(230, N)):
                    oracle.put(Item(f"v{i}", vectors[i], metas[j], contents[j]))
        else:
            self.na(f"{s}/upsert_binary", "upsert_binary arrived in 0.15")
            with self.check(f"{s}/upsert.dicts_metadata_only"):
                index.upsert(
                    [
                        {"id": ids[j], "vector": vectors[i].tolist(), "metadata": metas[j]}
                        for j, i in enumerate(range(230, N))
                    ]
                )
                for j, i in enumerate(range(230, N)):
                    oracle.put(Item(f"v{i}", vectors[i], metas[j], None))

        if kind == "float16":  # created without a dimension: the first upsert fixes it
            with self.check(f"{s}/properties.dimension_after_upsert"):
                # A fresh handle: 0.17 caches the 0 read before the first upsert.
                dim = self.client.load_index(name, key).dimension
                expect(dim == DIM, f"dimension {dim} != {DIM}")

        upserts = [c for c in self.report.checks if c["name"].startswith(f"{s}/upsert")]
        if any(c["status"] == "failed" for c in upserts):
            self.blocked(f"{s}/scenario", "an upsert")
            return
        self.check_counts(s, index, oracle)
        self.check_get(s, kind, index, oracle, full)
        self.check_queries(s, kind, index, oracle, tol, exact, full, trained=False)
        if full:
            self.check_filters(s, index, oracle)
        if full and self.at_least("0.18.0"):
            self.check_query_metadata(s, index, oracle)

        # ---- training
        with self.check(f"{s}/train"):
            self.train(index)
            if self.at_least("0.12.0"):
                busy = index.is_training()
                expect(isinstance(busy, bool), f"is_training returned {busy!r}")
            waited = self.wait_trained(index)
            self.report.info.setdefault("train_seconds", {})[s] = round(waited, 2)
        with self.check(f"{s}/is_training.after_train"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("is_training arrived in 0.12")
            expect(index.is_training() is False, "is_training() still True after training")
        with self.check(f"{s}/api.training_status"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("the training-status route arrived in 0.12")
            status = self.client.api.get_training_status_v1_indexes_training_status_get()
            expect(isinstance(status.training_indexes, list), f"training status {status}")
            expect(name not in status.training_indexes, f"{name} still listed as training")
        if self.passed(f"{s}/train"):
            self.check_properties(s, kind, index, trained=True)
            self.check_queries(s, kind, index, oracle, tol, exact, full, trained=True)
            with self.check(f"{s}/query.after_train.filter"):
                pred = FILTERS[0][2]
                want = oracle.matching(pred)
                res = self.flat(
                    self.query_single(
                        index,
                        vectors[3].tolist(),
                        top_k=N,
                        n_probes=N_LISTS,
                        filters=FILTERS[0][1],
                        include=["distance", "metadata"],
                    )
                )
                got = {r["id"] for r in res}
                expect(got == want, f"filter after training: {len(got)} ids, {len(want)} match")

        # ---- overwrite, delete
        with self.check(f"{s}/upsert.overwrite"):
            new_vec = (vectors[20] + 40.0).astype(np.float32)
            index.upsert([{"id": "v20", "vector": new_vec.tolist(), "metadata": {"category": "z"}}])
            oracle.put(Item("v20", new_vec, {"category": "z"}, None))
            got = index.get(["v20"], include=["metadata"])
            expect(len(got) == 1 and got[0]["metadata"] == {"category": "z"}, f"get: {got}")
            res = self.flat(self.query_single(index, new_vec.tolist(), top_k=1, n_probes=N_LISTS))
            expect(res and res[0]["id"] == "v20", f"query of the new vector: {res}")

        doomed = [f"v{i}" for i in range(10)]
        with self.check(f"{s}/delete"):
            index.delete([*doomed, "v0"])  # a repeated id is deleted once
            oracle.drop(doomed)
            got = index.get(doomed)
            expect(got == [], f"get of deleted ids returned {[g['id'] for g in got]}")
            res = self.flat(
                self.query_single(index, vectors[0].tolist(), top_k=5, n_probes=N_LISTS)
            )
            expect(all(r["id"] not in doomed for r in res), f"deleted ids in query: {res}")
        with self.check(f"{s}/delete.empty"):
            index.delete([])
        self.check_counts(s, index, oracle, suffix=".after_delete")

        if self.at_least("0.17.0") and full:
            self.rbac_checks(index)

        with self.check(f"{s}/delete_index"):
            index.delete_index()
            names = self.client.list_indexes()
            expect(name not in names, f"{name} still listed after delete_index")
            if self.at_least("0.12.0"):
                self.expect_load_rejected(name, key, 404)

    # ---- pieces of the vector scenario

    def check_properties(self, s: str, kind: str, index: Any, trained: bool) -> None:
        suffix = ".after_train" if trained else ""
        with self.check(f"{s}/properties{suffix}"):
            expect(index.index_name.startswith("compat-"), f"index_name {index.index_name}")
            expect(index.is_trained() is trained, f"is_trained() is not {trained}")
            if self.at_least("0.17.0"):
                want_dim = 0 if (kind == "float16" and not trained) else DIM
                dim = self.client.load_index(index.index_name, index._index_key).dimension
                expect(dim == want_dim, f"dimension {dim} != {want_dim}")
                expect(index.metric == "euclidean", f"metric {index.metric!r}")
                n_lists = index.n_lists
                expect(isinstance(n_lists, int) and n_lists >= 1, f"n_lists {n_lists!r}")
                if trained:
                    expect(n_lists == N_LISTS, f"n_lists after train {n_lists} != {N_LISTS}")
            else:
                fresh = (
                    self.client.load_index(index.index_name, index._index_key)
                    if (self.at_least("0.12.0"))
                    else type(index)(
                        index.index_name, index._index_key, index._api, index._api_client
                    )
                )
                itype = fresh.index_type
                accepted = {"ivfsq", "ivf"} if kind == "ivfsq" else {kind}
                expect(itype in accepted, f"index_type {itype!r}, expected {sorted(accepted)}")
                cfg = fresh.index_config
                expect(isinstance(cfg, dict) and cfg, f"index_config {cfg!r}")
                expect(cfg.get("dimension") == DIM, f"index_config dimension: {cfg}")
                ctype = cfg.get("type", cfg.get("index_type"))
                expect(ctype in accepted, f"index_config type: {cfg}")
                if kind == "ivfpq":
                    expect(
                        cfg.get("pq_dim") == PQ_DIM and cfg.get("pq_bits") == PQ_BITS,
                        f"index_config pq fields: {cfg}",
                    )
        if self.at_least("0.18.0") and not trained:
            with self.check(f"{s}/properties.metadata_schema"):
                expect(index.metadata_schema == {}, f"metadata_schema {index.metadata_schema}")
            with self.check(f"{s}/properties.bm25"):
                expect(index.bm25 is None, f"bm25 {index.bm25}")

    def check_counts(self, s: str, index: Any, oracle: Oracle, suffix: str = "") -> None:
        with self.check(f"{s}/list_ids{suffix}"):
            if not self.at_least("0.12.0"):
                raise NotApplicable("list_ids arrived in 0.12")
            ids = index.list_ids()
            expect(len(ids) == len(set(ids)), "list_ids has duplicates")
            missing, extra = set(oracle.items) - set(ids), set(ids) - set(oracle.items)
            expect(not missing and not extra, f"list_ids: missing {missing}, extra {extra}")
        with self.check(f"{s}/api.num_vectors{suffix}"):
            n = self.raw_num_vectors(index)
            expect(n == len(oracle.items), f"num_vectors {n} != {len(oracle.items)}")

    def check_get(self, s: str, kind: str, index: Any, oracle: Oracle, full: bool) -> None:
        exact = kind in EXACT_KINDS

        def same_metadata(got: Any, want: dict[str, Any] | None) -> bool:
            return got == (want if want is not None else {})  # a dict always, as CyborgDB

        with self.check(f"{s}/get.default_include"):
            got = {g["id"]: g for g in index.get(list(SAMPLE))}
            expect(set(got) == set(SAMPLE), f"get returned ids {sorted(got)}")
            for i in SAMPLE:
                want = oracle.items[i]
                expect(same_metadata(got[i].get("metadata"), want.metadata), f"{i}: {got[i]}")
                expect(
                    got[i].get("contents") == want.contents
                    or (want.contents is None and got[i].get("contents") in ("", b"")),
                    f"{i} contents {got[i].get('contents')!r} != {want.contents!r}",
                )
                vec = got[i].get("vector")
                if exact:
                    expect(vec is not None, f"{i}: no vector from an {kind} index")
                    expect(np.allclose(vec, want.vector, atol=1e-5), f"{i}: vector differs")
                elif vec:
                    expect(np.allclose(vec, want.vector, atol=0.1), f"{i}: vector far off")

        with self.check(f"{s}/get.include_vector"):
            got = index.get(["v3"], include=["vector"])
            expect(len(got) == 1, f"get returned {got}")
            vec = got[0].get("vector")
            if not vec and not exact:
                raise NotApplicable(
                    f"{kind} keeps quantised codes only: vector left out (DESIGN §3)"
                )
            expect(
                vec is not None and np.allclose(vec, oracle.items["v3"].vector, atol=2e-2),
                f"vector {vec}",
            )
        if not full:
            return
        with self.check(f"{s}/get.include_metadata"):
            got = index.get(["v3", "v4"], include=["metadata"])
            by_id = {g["id"]: g for g in got}
            expect(set(by_id) == {"v3", "v4"}, f"ids {sorted(by_id)}")
            for i in ("v3", "v4"):
                expect(by_id[i]["metadata"] == oracle.items[i].metadata, f"{i}: {by_id[i]}")
                expect("vector" not in by_id[i], f"{i}: vector not asked for")
        with self.check(f"{s}/get.include_contents"):
            got = index.get(["v7"], include=["contents"])
            expect(len(got) == 1 and got[0].get("contents") == "doc 7", f"get: {got}")
        with self.check(f"{s}/get.unknown_ids_omitted"):
            got = index.get(["v5", "no-such-id"], include=["metadata"])
            expect([g["id"] for g in got] == ["v5"], f"get returned {got}")
        with self.check(f"{s}/get.empty_ids"):
            expect(index.get([]) == [], "get([]) is not []")
        with self.check(f"{s}/get.repeated_id"):
            got = index.get(["v6", "v6"], include=["metadata"])
            expect([g["id"] for g in got] == ["v6"], f"get returned {got}")
        with self.check(f"{s}/get.wrong_key_rejected"):
            # A handle built with another key (load_index would refuse it in 0.17+).
            stranger = type(index)(
                index.index_name, self.generate_key(), index._api, index._api_client
            )
            try:
                stranger.get(["v3"])
            except Exception as exc:
                expect("401" in str(exc), f"expected a 401, got {exc}")
            else:
                raise CheckFailed("get with a wrong index_key succeeded")
        with self.check(f"{s}/upsert.wrong_dimension_rejected"):
            try:
                index.upsert([{"id": "bad", "vector": [1.0] * (DIM + 1)}])
            except Exception as exc:
                expect("422" in str(exc), f"expected a 422, got {exc}")
                if self.at_least("0.18.0"):
                    expect(type(exc).__name__ == "ValidationError", type(exc).__name__)
            else:
                raise CheckFailed(f"upsert of a {DIM + 1}-d vector into a {DIM}-d index succeeded")
            expect(index.get(["bad"]) == [], "the rejected item was stored")

    def check_queries(
        self,
        s: str,
        kind: str,
        index: Any,
        oracle: Oracle,
        tol: float,
        exact: bool,
        full: bool,
        trained: bool,
    ) -> None:
        p = f"{s}/query.after_train" if trained else f"{s}/query"
        # Trained product quantisation ranks a stored vector only approximately among its
        # neighbours: require it in the top 3 there, first everywhere else.
        rank = 3 if (trained and kind == "ivfpq") else 1

        def self_nearest(res: list[dict[str, Any]], i: str) -> None:
            ids = [r["id"] for r in res]
            expect(i in ids[:rank], f"{i} not in the top {rank}: {ids[:5]}")
            d = next(r for r in res if r["id"] == i).get("distance")
            expect(d is not None, f"no distance in {res[:2]}")
            expect(abs(d) <= tol, f"distance of {i} to itself {d} > {tol}")

        with self.check(f"{p}.single.self_nearest"):
            for i in SAMPLE:
                res = self.flat(self.query_single(index, oracle.items[i].vector.tolist(), top_k=5))
                expect(len(res) == 5, f"top_k=5 returned {len(res)}")
                self_nearest(res, i)
                d = [r["distance"] for r in res]
                expect(d == sorted(d), f"distances not ascending: {d}")

        if exact:
            with self.check(f"{p}.brute_force"):
                for i in ("v11", "v170", "v260"):
                    q = oracle.items[i].vector + 0.5
                    res = self.flat(
                        self.query_single(index, q.tolist(), top_k=10, n_probes=N_LISTS)
                    )
                    want = oracle.brute_force(q, 10)
                    got_ids = [r["id"] for r in res]
                    expect(got_ids == [w[0] for w in want], f"ids {got_ids} != {want}")
                    for r, (_, wd) in zip(res, want):
                        expect(abs(r["distance"] - wd) <= tol, f"distance {r} vs {wd}")

        if trained:
            with self.check(f"{p}.greedy"):
                res = self.flat(
                    self.query_single(
                        index, oracle.items["v42"].vector.tolist(), top_k=5, greedy=True
                    )
                )
                self_nearest(res, "v42")
            return

        with self.check(f"{p}.single.shape"):
            raw = self.query_single(index, oracle.items["v3"].vector.tolist(), top_k=2)
            if self.at_least("0.13.0"):
                expect(
                    isinstance(raw, list) and all(isinstance(r, dict) for r in raw),
                    f"0.13+ returns a flat list for one query: {raw!r}"[:300],
                )
            else:
                expect(
                    isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], list),
                    f"0.11/0.12 wrap one query's results in a list: {raw!r}"[:300],
                )

        with self.check(f"{p}.numpy_1d"):
            res = self.flat(self.query_single(index, oracle.items["v160"].vector, top_k=5))
            self_nearest(res, "v160")

        batch_ids = ["v1", "v151", "v299"]
        batch = np.stack([oracle.items[i].vector for i in batch_ids])
        with self.check(f"{p}.batch.lists"):
            res = index.query(query_vectors=batch.tolist(), top_k=4)
            expect(isinstance(res, list) and len(res) == 3, f"batch of 3 returned {len(res)}")
            for i, r in zip(batch_ids, res):
                expect(isinstance(r, list) and len(r) == 4, f"per-query results: {r}")
                self_nearest(r, i)
        with self.check(f"{p}.batch.numpy"):
            res = index.query(query_vectors=batch, top_k=4)
            expect(isinstance(res, list) and len(res) == 3, f"batch of 3 returned {len(res)}")
            for i, r in zip(batch_ids, res):
                self_nearest(r, i)
        with self.check(f"{p}.batch.one_row"):
            res = index.query(query_vectors=batch[:1], top_k=3)
            expect(
                isinstance(res, list) and len(res) == 1 and isinstance(res[0], list),
                f"a 1-row batch must give one list: {res!r}"[:300],
            )
            self_nearest(res[0], "v1")
        if not full:
            return

        with self.check(f"{p}.top_k_default"):
            res = self.flat(self.query_single(index, oracle.items["v3"].vector.tolist()))
            expect(len(res) == 100, f"default top_k gave {len(res)} results, expected 100")

        v3 = oracle.items["v3"]
        for label, include in (
            ("distance_metadata", ["distance", "metadata"]),
            ("metadata", ["metadata"]),
            ("distance", ["distance"]),
            ("default", None),
        ):
            with self.check(f"{p}.include.{label}"):
                kwargs = {"top_k": 3} if include is None else {"top_k": 3, "include": include}
                res = self.flat(self.query_single(index, v3.vector.tolist(), **kwargs))
                expect(res and res[0]["id"] == "v3", f"top hit {res[:1]}")
                wants_meta = include is None or "metadata" in include
                if wants_meta:
                    expect(res[0].get("metadata") == v3.metadata, f"metadata {res[0]}")
                else:
                    expect("metadata" not in res[0], f"metadata not asked for: {res[0]}")
                # 0.13+ keep a distance whenever the server sends one (CyborgDB always does);
                # 0.11/0.12 keep it only when asked for.
                wants_dist = include is None or "distance" in include or self.at_least("0.13.0")
                if wants_dist:
                    expect(res[0].get("distance") is not None, f"no distance: {res[0]}")
                    expect(abs(res[0]["distance"]) <= tol, f"distance {res[0]['distance']}")

        if not self.at_least("0.15.0"):
            self.na(f"{p}.binary.include_vector", "numpy queries use query_binary from 0.15")
            self.na(f"{p}.binary.include_distance", "numpy queries use query_binary from 0.15")
            return
        with self.check(f"{p}.binary.include_vector"):
            res = index.query_binary(v3.vector, top_k=2, include=["distance", "vector"])
            expect(res and res[0]["id"] == "v3", f"top hit {res[:1]}")
            vec = res[0].get("vector")
            if not vec and not exact:
                raise NotApplicable(f"{kind} keeps quantised codes only: no vector to return")
            expect(vec is not None and np.allclose(vec, v3.vector, atol=1e-4), f"vector {vec}")
        with self.check(f"{p}.binary.include_distance"):
            res = index.query_binary(np.stack([v3.vector]), top_k=2, include=["distance"])
            expect(len(res) == 1 and res[0][0]["id"] == "v3", f"results {res}")
            expect(res[0][0].get("metadata") is None, f"metadata not asked for: {res[0][0]}")
            expect(res[0][0].get("distance") is not None, f"no distance: {res[0][0]}")
        if self.at_least("0.17.0"):
            with self.check(f"{p}.rerank_mult"):
                res = self.flat(
                    index.query(query_vectors=v3.vector.tolist(), top_k=3, rerank_mult=4)
                )
                self_nearest(res, "v3")

    def check_filters(self, s: str, index: Any, oracle: Oracle) -> None:
        q = oracle.items["v3"].vector
        for label, flt, pred in FILTERS:
            with self.check(f"{s}/query.filter.{label}"):
                want = oracle.matching(pred)
                expect(want, f"filter {label} matches nothing: test data bug")
                res = self.flat(
                    self.query_single(
                        index, q.tolist(), top_k=N, filters=flt, include=["distance", "metadata"]
                    )
                )
                got = [r["id"] for r in res]
                expect(len(got) == len(set(got)), "duplicate ids")
                expect(
                    set(got) == want,
                    f"{len(got)} ids, {len(want)} match; extra "
                    f"{sorted(set(got) - want)[:5]}, missing {sorted(want - set(got))[:5]}",
                )
                for r in res:
                    expect(pred(r["metadata"]), f"{r['id']} metadata {r['metadata']} fails")
        with self.check(f"{s}/query.filter.top_k_cut"):
            # top_k below the number of matches: the top_k nearest matches, not fewer.
            want = oracle.matching(FILTERS[0][2])
            res = self.flat(self.query_single(index, q.tolist(), top_k=7, filters=FILTERS[0][1]))
            expect(len(res) == 7 and {r["id"] for r in res} <= want, f"results {res}")
            ranked = [i for i, _ in oracle.brute_force(q, N) if i in want][:7]
            expect([r["id"] for r in res] == ranked, f"{[r['id'] for r in res]} != {ranked}")
        with self.check(f"{s}/query.filter.batch"):
            batch = np.stack([oracle.items[i].vector for i in ("v3", "v4")])
            res = index.query(query_vectors=batch.tolist(), top_k=N, filters=FILTERS[1][1])
            want = oracle.matching(FILTERS[1][2])
            expect(len(res) == 2, f"batch results {len(res)}")
            for r in res:
                expect({x["id"] for x in r} == want, f"{len(r)} results, {len(want)} match")
        with self.check(f"{s}/query.filter.binary"):
            if not self.at_least("0.15.0"):
                raise NotApplicable("numpy queries use query_binary from 0.15")
            res = index.query(query_vectors=q, top_k=N, filters=FILTERS[2][1])
            want = oracle.matching(FILTERS[2][2])
            expect({r["id"] for r in res} == want, f"{len(res)} results, {len(want)} match")

    def check_query_metadata(self, s: str, index: Any, oracle: Oracle) -> None:
        p = f"{s}/query_metadata"
        with self.check(f"{p}.filter"):
            rows = index.query_metadata(filters=FILTERS[0][1])
            want = oracle.matching(FILTERS[0][2])
            expect(all(set(r) == {"id"} for r in rows), f"rows {rows[:3]}")
            expect({r["id"] for r in rows} == want, f"{len(rows)} rows, {len(want)} match")
        with self.check(f"{p}.compound_filter"):
            rows = index.query_metadata(filters=FILTERS[4][1])
            want = oracle.matching(FILTERS[4][2])
            expect({r["id"] for r in rows} == want, f"{len(rows)} rows, {len(want)} match")
        with self.check(f"{p}.all"):
            rows = index.query_metadata()
            expect({r["id"] for r in rows} == set(oracle.items), f"{len(rows)} rows")
        with self.check(f"{p}.top_k"):
            rows = index.query_metadata(filters=FILTERS[0][1], top_k=5)
            want = oracle.matching(FILTERS[0][2])
            expect(len(rows) == 5 and {r["id"] for r in rows} <= want, f"rows {rows}")
        with self.check(f"{p}.order_by"):
            rows = index.query_metadata(
                filters={"category": "b"}, order_by="score", ascending=False
            )
            scores = [oracle.items[r["id"]].metadata["score"] for r in rows]  # type: ignore[index]
            expect(len(rows) == len(oracle.matching(lambda m: m["category"] == "b")), "count")
            expect(scores == sorted(scores, reverse=True), f"not descending: {scores[:10]}")
        with self.check(f"{p}.order_by_dict_top_k"):
            rows = index.query_metadata(filters={"category": "c"}, order_by={"score": 1}, top_k=6)
            scores = [oracle.items[r["id"]].metadata["score"] for r in rows]  # type: ignore[index]
            every = sorted(
                m["score"]
                for m in (oracle.items[i].metadata for i in oracle.items)
                if m and m["category"] == "c"
            )
            expect(scores == every[:6], f"scores {scores} != {every[:6]}")

    def rbac_checks(self, index: Any) -> None:
        """Per-index users (0.17): minted by the index key's holder, each authenticating with
        its own key alone; read-only users cannot write; a revoked key stops at once."""
        name = index.index_name
        probe = [float(x) for x in make_vectors(1, 7)[0]]

        def as_user(api_key: str) -> Any:
            return self.cyborgdb.Client(self.url, api_key).load_index(name)

        reader: dict[str, str] = {}
        with self.check("rbac/create_user"):
            reader = index.create_user(["read"])
            expect(reader.get("api_key", "").startswith("cdbk_"), f"user {reader}")
            expect(len(reader.get("user_id", "")) > 0, f"user {reader}")
        with self.check("rbac/read_only_user_queries"):
            expect(reader, "no user was created")
            got = self.flat(self.query_single(as_user(reader["api_key"]), probe, top_k=3))
            expect(len(got) == 3, f"read-only user's query answered {got}")
        with self.check("rbac/read_only_user_cannot_write"):
            expect(reader, "no user was created")
            try:
                as_user(reader["api_key"]).upsert([{"id": "rbac-w", "vector": probe}])
            except Exception as exc:  # the SDK's error for the service's 403
                expect(
                    "403" in str(exc) or "ermission" in str(exc) or "orbidden" in str(exc),
                    f"refused with {exc!r}",
                )
            else:
                raise CheckFailed("a read-only user's upsert was accepted")
        writer: dict[str, str] = {}
        with self.check("rbac/read_write_user"):
            writer = index.create_user(["read", "write"])
            mine = as_user(writer["api_key"])
            mine.upsert([{"id": "rbac-w", "vector": probe}])
            got = mine.get(["rbac-w"], include=["vector"])
            expect([g["id"] for g in got] == ["rbac-w"], f"get after a user's upsert: {got}")
            mine.delete(["rbac-w"])
        with self.check("rbac/list_users"):
            users = {u["user_id"]: sorted(u["permissions"]) for u in index.list_users()}
            expect(users.get(reader.get("user_id")) == ["read"], f"users {users}")
            expect(users.get(writer.get("user_id")) == ["read", "write"], f"users {users}")
        with self.check("rbac/delete_user"):
            expect(reader, "no user was created")
            index.delete_user(reader["user_id"])
            left = {u["user_id"] for u in index.list_users()}
            expect(reader["user_id"] not in left, f"deleted user still listed: {left}")
            try:
                self.query_single(as_user(reader["api_key"]), probe, top_k=1)
            except Exception:
                pass
            else:
                raise CheckFailed("a deleted user's key still opens the index")
            if writer:
                index.delete_user(writer["user_id"])

    # ---- other scenarios

    def contract_scenario(self) -> None:
        """What the SDK's own API contract test (tests/test_api_contract.py of cyborgdb-py)
        checks beyond the other scenarios: an ivfpq index created without a dimension is
        described with its pq_dim and pq_bits as created (and dimension 0), and every query
        result carries a metadata dict, {} for an item stored without metadata."""
        s = "contract"
        name, key = self.name(s), self.generate_key()
        index: Any = None
        with self.check(f"{s}/ivfpq_without_dimension"):
            if not hasattr(self.cyborgdb, "IndexIVFPQ"):
                raise NotApplicable("this release creates indexes by storage_precision only")
            try:
                config = self.cyborgdb.IndexIVFPQ(pq_dim=PQ_DIM, pq_bits=PQ_BITS)
            except Exception as exc:
                raise NotApplicable(f"this release's IndexIVFPQ needs a dimension: {exc}") from None
            index = self.client.create_index(name, key, config)
            cfg = index.index_config
            expect(cfg.get("pq_dim") == PQ_DIM and cfg.get("pq_bits") == PQ_BITS, f"{cfg}")
            expect(cfg.get("dimension") in (0, None), f"dimension before any upsert: {cfg}")
        if index is None:
            index = self.create(name, key, "default" if self.at_least("0.17.0") else "ivfflat")
        try:
            with self.check(f"{s}/metadata_dict_on_every_result"):
                vectors = make_vectors(40, seed=11)
                items = [{"id": f"c{i}", "vector": v.tolist()} for i, v in enumerate(vectors)]
                for item in items[::2]:
                    item["metadata"] = {"even": True}
                index.upsert(items)
                res = self.flat(
                    self.query_single(index, vectors[0].tolist(), top_k=10, include=["metadata"])
                )
                expect(len(res) == 10, f"{len(res)} results")
                expect(all(isinstance(r.get("metadata"), dict) for r in res), f"{res}")
                got = index.get([f"c{i}" for i in range(4)], include=["metadata"])
                expect(all(isinstance(g.get("metadata"), dict) for g in got), f"{got}")
        finally:
            self.drop_quietly(index)

    def cosine_scenario(self) -> None:
        s = "cosine"
        kind = "default" if self.at_least("0.17.0") else "ivfflat"
        name, key = self.name(s), self.generate_key()
        oracle = Oracle(metric="cosine")
        vectors = make_vectors(60, seed=11)
        index: Any = None
        with self.check(f"{s}/create"):
            index = self.create(name, key, kind, metric="cosine")
        if index is None:
            self.blocked(f"{s}/scenario", "create")
            return
        try:
            with self.check(f"{s}/properties.metric"):
                if self.at_least("0.17.0"):
                    expect(index.metric == "cosine", f"metric {index.metric!r}")
                else:
                    cfg = index.index_config
                    expect(cfg.get("metric") == "cosine", f"index_config {cfg}")
            # 0.18 turns datetimes in metadata and filters into epoch milliseconds.
            dated = self.at_least("0.18.0")
            base = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)

            def meta(i: int) -> dict[str, Any]:
                return {"when": base + dt.timedelta(days=i)} if dated else {"day": i}

            with self.check(f"{s}/upsert"):
                index.upsert(
                    [
                        {"id": f"c{i}", "vector": v.tolist(), "metadata": meta(i)}
                        for i, v in enumerate(vectors)
                    ]
                )
                for i, v in enumerate(vectors):
                    oracle.put(Item(f"c{i}", v, meta(i), None))
            with self.check(f"{s}/query.filter"):
                flt = (
                    {"when": {"$gte": base + dt.timedelta(days=50)}}
                    if dated
                    else {"day": {"$gte": 50}}
                )
                res = self.flat(
                    self.query_single(index, vectors[0].tolist(), top_k=60, filters=flt)
                )
                got = {r["id"] for r in res}
                expect(got == {f"c{i}" for i in range(50, 60)}, f"filtered ids {sorted(got)}")
                if dated:
                    stored = index.get(["c50"], include=["metadata"])[0]["metadata"]
                    want_ms = int((base + dt.timedelta(days=50)).timestamp() * 1000)
                    expect(stored == {"when": want_ms}, f"metadata {stored}, expected epoch ms")
            with self.check(f"{s}/query.self_and_brute_force"):
                for i in (0, 17, 59):
                    q = vectors[i]
                    res = self.flat(self.query_single(index, q.tolist(), top_k=5))
                    expect(res and res[0]["id"] == f"c{i}", f"top hit {res[:1]}")
                    expect(abs(res[0]["distance"]) <= 1e-4, f"self distance {res[0]}")
                    q2 = q * 3.0 + 0.2  # scale must not matter to cosine
                    res = self.flat(self.query_single(index, q2.tolist(), top_k=5))
                    want = oracle.brute_force(q2, 5)
                    expect([r["id"] for r in res] == [w[0] for w in want], f"{res} vs {want}")
                    for r, (_, wd) in zip(res, want):
                        expect(abs(r["distance"] - wd) <= 1e-4, f"distance {r} vs {wd}")
            with self.check(f"{s}/train.too_many_lists_rejected"):
                if not self.at_least("0.12.0"):
                    raise NotApplicable("0.11 takes n_lists from the index config only")
                try:
                    index.train(n_lists=1000)
                except Exception as exc:
                    expect("422" in str(exc), f"expected a 422, got {exc}")
                else:
                    raise CheckFailed("train(n_lists=1000) on 60 vectors succeeded")
                expect(index.is_trained() is False, "index trained anyway")
            with self.check(f"{s}/train.default_n_lists"):
                index.train()
                self.wait_trained(index)
                for i in (5, 33):
                    res = self.flat(self.query_single(index, vectors[i].tolist(), top_k=3))
                    expect(res and res[0]["id"] == f"c{i}", f"top hit after training {res[:1]}")
                    expect(abs(res[0]["distance"]) <= 1e-4, f"self distance {res[0]}")
                if self.at_least("0.17.0"):
                    expect(index.n_lists >= 1, f"n_lists {index.n_lists}")
            with self.check(f"{s}/delete_index"):
                index.delete_index()
        finally:
            if not self.passed(f"{s}/delete_index"):
                self.drop_quietly(index)

    def text_scenario(self) -> None:
        s = "text"
        kind = "default" if self.at_least("0.17.0") else "ivfflat"
        name, key = self.name(s), self.generate_key()
        index: Any = None
        with self.check(f"{s}/create"):
            index = self.create(name, key, kind, embedding_model=TEXT_MODEL, dimension=None)
        if index is None:
            self.blocked(f"{s}/scenario", "create")
            return
        try:
            with self.check(f"{s}/properties"):
                if self.at_least("0.17.0"):
                    expect(index.dimension == TEXT_DIM, f"dimension {index.dimension}")
                else:
                    cfg = index.index_config
                    expect(cfg.get("dimension") in (TEXT_DIM, None, 0), f"index_config {cfg}")
            with self.check(f"{s}/upsert.contents_only"):
                index.upsert(
                    [
                        {"id": k, "contents": self.contents(text), "metadata": {"topic": topic}}
                        for k, (text, topic) in TEXT_DOCS.items()
                    ]
                )
            with self.check(f"{s}/get.contents"):
                got = {g["id"]: g for g in index.get(list(TEXT_DOCS), include=["contents"])}
                for k, (text, _) in TEXT_DOCS.items():
                    expect(got.get(k, {}).get("contents") == text, f"{k}: {got.get(k)}")
            with self.check(f"{s}/get.vector_is_embedding"):
                got = index.get(["gzip"], include=["vector"])
                vec = np.asarray(got[0].get("vector") or [], dtype=np.float32)
                expect(vec.shape == (TEXT_DIM,), f"vector shape {vec.shape}")
                expect(abs(float(np.linalg.norm(vec)) - 1.0) < 1e-3, "embedding not unit-norm")
            with self.check(f"{s}/query_contents"):
                for want, text in TEXT_QUERIES.items():
                    res = self.flat(index.query(query_contents=text, top_k=3))
                    expect(res and res[0]["id"] == want, f"{text!r}: {[r['id'] for r in res]}")
                    d = [r["distance"] for r in res]
                    expect(d == sorted(d), f"distances not ascending: {d}")
            with self.check(f"{s}/query_contents.filter"):
                res = self.flat(
                    index.query(
                        query_contents=TEXT_QUERIES["whale"],
                        top_k=5,
                        filters={"topic": "food"},
                        include=["distance", "metadata"],
                    )
                )
                ids = {r["id"] for r in res}
                expect(ids == {"bread", "sushi"}, f"filtered text query: {ids}")
            with self.check(f"{s}/upsert.contents_and_vector"):
                rng = np.random.default_rng(3)
                own = rng.normal(size=TEXT_DIM).astype(np.float32)
                index.upsert(
                    [{"id": "own", "vector": own.tolist(), "contents": self.contents("own vector")}]
                )
                res = self.flat(self.query_single(index, own.tolist(), top_k=1))
                expect(res and res[0]["id"] == "own", f"query of the given vector: {res}")
            with self.check(f"{s}/delete_index"):
                index.delete_index()
        finally:
            if not self.passed(f"{s}/delete_index"):
                self.drop_quietly(index)

    def kms_scenario(self) -> None:
        name = self.name("kms")
        index: Any = None
        with self.check("kms/create"):
            index = self.client.create_index(name, kms_name="default", dimension=DIM)
        with self.check("kms/load_index_without_key"):
            loaded = self.client.load_index(name)
            expect(loaded.dimension == DIM, f"dimension {loaded.dimension}")
        if index is not None:
            self.drop_quietly(index)

    def tq_scenario(self) -> None:
        """The TurboQuant storage precisions: exact search before training, then the
        compressed codes (12/8/6/4 bits a dimension) after it still find a stored vector."""
        vectors = make_vectors(400, seed=5)
        for precision in ("tq12", "tq8", "tq6", "tq4"):
            s = precision
            index: Any = None
            with self.check(f"{s}/create"):
                index = self.create(self.name(s), self.generate_key(), precision)
            if index is None:
                continue
            try:
                with self.check(f"{s}/upsert_query"):
                    index.upsert([f"t{i}" for i in range(len(vectors))], vectors)
                    res = index.query(query_vectors=vectors[7], top_k=3)
                    expect(res and res[0]["id"] == "t7", f"results {res}")
                with self.check(f"{s}/train_query"):
                    self.train(index)
                    self.wait_trained(index)
                    res = index.query(query_vectors=vectors[7], top_k=3, n_probes=N_LISTS)
                    expect(res and res[0]["id"] == "t7", f"results after training {res}")
            finally:
                self.drop_quietly(index)

    def bm25_scenario(self) -> None:
        """BM25 and hybrid search through the SDK's own calls. The answers are recorded in the
        report (``bm25``) for test_sdk.py to compare with the reference BM25 and the fusion of
        an exact vector leg, which need the server's analyser (not importable here)."""
        s = "bm25"
        docs = bm25_docs()
        vectors = make_vectors(len(docs), seed=9)
        index: Any = None
        observed: dict[str, Any] = {"query_metadata": [], "hybrid": []}
        self.report.info["bm25"] = observed
        with self.check(f"{s}/create"):
            index = self.client.create_index(
                self.name(s),
                self.generate_key(),
                dimension=DIM,
                text_fields=["body"],
                metadata_schema={"title": {"full_text": True}},
                bm25_k1=1.2,
                bm25_b=0.75,
            )
            bm25 = index.bm25
            expect(bm25 and bm25.get("k1") == 1.2 and bm25.get("b") == 0.75, f"bm25 {bm25}")
            schema = index.metadata_schema
            for name in ("body", "title"):
                expect(schema.get(name, {}).get("full_text"), f"{name} not full_text: {schema}")
        if index is None:
            return
        try:
            with self.check(f"{s}/upsert"):
                index.upsert(
                    [
                        {"id": k, "vector": vectors[j].tolist(), "metadata": meta}
                        for j, (k, meta) in enumerate(docs.items())
                    ]
                )
            with self.check(f"{s}/query_metadata_text"):
                for args in BM25_CASES:
                    rows = index.query_metadata(**args)
                    expect(all(set(r) == {"id", "score"} for r in rows), f"rows {rows[:3]}")
                    observed["query_metadata"].append({"args": args, "rows": rows})
                rows = index.query_metadata(text="blue whales", top_k=1)
                expect([r["id"] for r in rows] == ["whale"], f"rows {rows}")
            with self.check(f"{s}/query_hybrid"):
                for j, (alpha, top_k) in enumerate(((None, 5), (0.3, 4), (1.0, 3), (0.0, 3))):
                    q = vectors[j * 7]
                    kwargs: dict[str, Any] = {"text": "bake bread oven", "top_k": top_k}
                    if alpha is not None:
                        kwargs["alpha"] = alpha
                    res = self.flat(index.query(query_vectors=q.tolist(), greedy=True, **kwargs))
                    expect(res and all("score" in r for r in res), f"results {res}")
                    observed["hybrid"].append({"row": j * 7, "kwargs": kwargs, "results": res})
            with self.check(f"{s}/query_hybrid_binary_batch"):
                # numpy queries go through the binary route; a batch fuses each row
                res = index.query(query_vectors=vectors[:2], text="whale sea", top_k=3, greedy=True)
                expect(len(res) == 2 and all(len(r) == 3 for r in res), f"results {res}")
                for j, row in enumerate(res):
                    kwargs = {"text": "whale sea", "top_k": 3}
                    observed["hybrid"].append({"row": j, "kwargs": kwargs, "results": row})
            with self.check(f"{s}/query_metadata_text_errors"):
                try:
                    index.query_metadata(text="bread", text_fields=["topic"])
                except Exception as exc:
                    expect("full_text" in str(exc), f"error {exc}")
                else:
                    raise CheckFailed("text_fields naming a non-full_text field was accepted")
        finally:
            self.drop_quietly(index)

    def schema_scenario(self) -> None:
        s = "schema"
        schema = {"title": {"filterable": True, "pattern": True}, "blob": {"filterable": False}}
        vectors = make_vectors(4, seed=13)
        index: Any = None
        with self.check(f"{s}/create"):
            index = self.client.create_index(
                self.name(s), self.generate_key(), dimension=DIM, metadata_schema=schema
            )
        if index is None:
            return
        try:
            with self.check(f"{s}/metadata_schema_reported"):
                got = index.metadata_schema
                expect(got.get("title", {}).get("pattern") is True, f"metadata_schema {got}")
                expect(got.get("blob", {}).get("filterable") is False, f"metadata_schema {got}")
            with self.check(f"{s}/query_metadata_regex"):
                titles = ["alpha", "alps", "beta", "gamma"]
                index.upsert(
                    [
                        {"id": t, "vector": vectors[j].tolist(), "metadata": {"title": t}}
                        for j, t in enumerate(titles)
                    ]
                )
                rows = index.query_metadata(filters={"title": {"$regex": "^al"}})
                expect({r["id"] for r in rows} == {"alpha", "alps"}, f"rows {rows}")
        finally:
            self.drop_quietly(index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--report", help="also write the report here after every check")
    parser.add_argument(
        "--only", default="", help="comma-separated scenarios to run (default: all)"
    )
    args = parser.parse_args(argv)

    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # keep stdout for the JSON report alone
    report = Report(args.release, args.report)
    try:
        driver = Driver(
            args.url, args.api_key, args.release, report, {x for x in args.only.split(",") if x}
        )
        driver.run()
    except Exception as exc:
        report.add(
            {
                "name": "client/driver",
                "status": "failed",
                "detail": f"driver crashed: {type(exc).__name__}: {exc}",
            }
        )
    finally:
        sys.stdout = real_stdout
    json.dump(report.as_dict(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
