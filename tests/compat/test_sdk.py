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

import pytest

from tests.compat.releases import RELEASES, known_unsupported
from tests.compat.support import run_driver
from tests.integration.conftest import API_KEY, Service

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
