"""Installing the pinned SDK releases and running the driver against a server.

Each ``cyborgdb`` release is installed once, with ``pip install --no-deps --target``, into
``$VAULTVEC_COMPAT_CACHE`` (default ``~/.cache/vaultvec-compat``); the SDKs' own dependencies
come from the project's ``dev`` extra. Without network access the tests skip, except in CI
(``CI`` or ``VAULTVEC_COMPAT_REQUIRED`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT_S = 240


def cache_dir() -> Path:
    return Path(os.environ.get("VAULTVEC_COMPAT_CACHE", "~/.cache/vaultvec-compat")).expanduser()


def required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("VAULTVEC_COMPAT_REQUIRED"))


def sdk_release_path(release: str) -> Path:
    """The directory holding ``cyborgdb==release`` (installed on first use), for PYTHONPATH."""
    target = cache_dir() / f"cyborgdb-{release}"
    if (target / "cyborgdb" / "__init__.py").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".cyborgdb-{release}-", dir=target.parent))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
        str(staging),
        f"cyborgdb=={release}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = "pip timed out" if proc is None else (proc.stderr or proc.stdout).strip()
        message = f"cannot install cyborgdb=={release} from the package index: {output[-800:]}"
        if required():
            pytest.fail(message)
        pytest.skip(message + " (set CI or VAULTVEC_COMPAT_REQUIRED to make this an error)")
    try:
        staging.rename(target)  # atomic: a half-done install is never taken for a cached one
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run_driver(
    release: str, url: str, api_key: str, report_path: Path, only: str = ""
) -> dict[str, Any]:
    """Run ``tests.compat.driver`` for one release in a subprocess; its JSON report.

    The subprocess sees that release alone on PYTHONPATH (releases never meet in one
    interpreter); everything else comes from the project's environment.
    """
    env = dict(os.environ, PYTHONPATH=str(sdk_release_path(release)), PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "tests.compat.driver",
        "--url",
        url,
        "--api-key",
        api_key,
        "--release",
        release,
        "--report",
        str(report_path),
    ]
    if only:
        cmd += ["--only", only]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        partial = json.loads(report_path.read_text()) if report_path.exists() else {"checks": []}
        last = partial["checks"][-1]["name"] if partial["checks"] else "(none)"
        pytest.fail(
            f"cyborgdb {release} driver timed out after {DRIVER_TIMEOUT_S}s; last finished "
            f"check {last}; stderr tail:\n{(exc.stderr or b'')[-2000:]!r}"
        )
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(
            f"cyborgdb {release} driver exited {proc.returncode}; stderr tail:\n"
            f"{proc.stderr[-3000:]}"
        )
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
