"""The real ``cyborgdb`` SDK, release by release, against a real vaultvec server.

For each pinned release the driver (``driver.py``) runs in its own interpreter with only that
release importable, exercises every public method on every index type the release can create,
and reports each check. Every check must pass, except those matching an entry of
``releases.KNOWN_UNSUPPORTED`` (server features vaultvec leaves out, each with its reason).

Set ``VAULTVEC_COMPAT_REPORTS=<dir>`` to keep each release's JSON report there, and
``VAULTVEC_COMPAT_ONLY=<scenario,...>`` to run some scenarios only (while debugging).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serve_app.gateway.fulltext import fuse
from tests.compat.driver import BM25_CASES, DIM, bm25_docs, make_vectors
from tests.compat.releases import RELEASES, known_unsupported
from tests.compat.support import run_driver
from tests.integration.conftest import API_KEY, Service
from tests.unit.bm25_oracle import oracle
from tests.unit.filter_oracle import matches

MIN_PASSED = 40  # a driver that silently ran nothing must not pass


def describe(check: dict[str, Any]) -> str:
    lines = [f"- {check['name']}: {check.get('detail', '')}"]
    for ex in check.get("http", []):
        lines.append(
            f"    {ex['request']} {ex.get('body', '')[:300]} -> {ex.get('status')} "
            f"{ex.get('response', '')[:300]}"
        )
    return "\n".join(lines)


@pytest.mark.parametrize("release", RELEASES)
def test_sdk_release(release: str, service: Service, tmp_path: Path) -> None:
    only = os.environ.get("VAULTVEC_COMPAT_ONLY", "")
    report = run_driver(release, service.url, API_KEY, tmp_path / f"{release}.json", only)
    if out := os.environ.get("VAULTVEC_COMPAT_REPORTS"):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{release}.json").write_text(json.dumps(report, indent=1))

    checks = report["checks"]
    unexpected = [
        c for c in checks if c["status"] == "failed" and known_unsupported(c["name"]) is None
    ]
    passed = [c for c in checks if c["status"] == "passed"]
    assert not unexpected, (
        f"cyborgdb {release}: {len(unexpected)} of {len(checks)} checks failed "
        f"({len(passed)} passed):\n" + "\n".join(describe(c) for c in unexpected)
    )
    assert only or len(passed) >= MIN_PASSED, (
        f"only {len(passed)} checks passed: {report['counts']}"
    )
    names = [c["name"] for c in checks]
    assert len(names) == len(set(names)), "duplicate check names"
    if report.get("bm25", {}).get("query_metadata"):
        check_bm25(report["bm25"])


def check_bm25(observed: dict[str, Any]) -> None:
    """The SDK's BM25 and hybrid answers against the reference BM25 (rank-bm25 on the server's
    analyser) and the weighted reciprocal rank fusion of an exact vector leg."""
    docs = bm25_docs()
    full_text = ["body", "title"]
    assert len(observed["query_metadata"]) == len(BM25_CASES)
    for case in observed["query_metadata"]:
        args = case["args"]
        fields = args.get("text_fields", full_text)
        allowed = None
        if "filters" in args:
            allowed = {i for i, m in docs.items() if matches(m, args["filters"])}
        want = oracle(
            docs,
            fields,
            args.get("text_field_weights", [1.0] * len(fields)),
            args["text"],
            args.get("require_all_terms", False),
            allowed,
        )
        order = sorted(want, key=lambda i: (-want[i], i))[: args.get("top_k")]
        got = case["rows"]
        assert [r["id"] for r in got] == order, args
        assert all(r["score"] == pytest.approx(want[r["id"]], rel=1e-6) for r in got), args
    vectors = make_vectors(len(docs), seed=9)
    assert vectors.shape[1] == DIM
    ids = list(docs)
    assert observed["hybrid"], "no hybrid answers recorded"
    for case in observed["hybrid"]:
        kw = case["kwargs"]
        k, alpha = kw["top_k"], kw.get("alpha", 0.5)
        d = np.linalg.norm(vectors - vectors[case["row"]], axis=1)
        vector_leg = [ids[j] for j in np.lexsort((ids, d))[: 3 * k]]
        bm25 = oracle(docs, full_text, [1.0, 1.0], kw["text"])
        text_leg = sorted(bm25, key=lambda i: (-bm25[i], i))[: 3 * k]
        want = fuse(vector_leg, text_leg, alpha, 60.0, k)
        got = [(r["id"], r["score"]) for r in case["results"]]
        assert [i for i, _ in got] == [i for i, _ in want], kw
        assert all(g == pytest.approx(w) for (_, g), (_, w) in zip(got, want, strict=True)), kw
