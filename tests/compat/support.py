"""Installing the pinned SDK releases and running the driver against a server.

Each ``cyborgdb`` release is installed once, with ``pip install --no-deps --target``, into
``$VAULTVEC_COMPAT_CACHE`` (default ``~/.cache/vaultvec-compat``); the SDKs' own dependencies
come from the project's ``dev`` extra. CyborgDB's migration tool (``cyborgdb-migrate`` with
ChromaDB, ``MIGRATE_REQUIREMENTS``) has too many dependencies of its own to share the project's
environment: it gets a virtual environment of its own in the same cache. Without network access
the tests skip, except in CI (``CI`` or ``VAULTVEC_COMPAT_REQUIRED`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT_S = 240
# The migration tool and the two packages it drives here, pinned exactly (the tool runs only
# against a server of its own minor release, 0.18.*, read from GET /v1/health); their own
# dependencies float: about 530 MB with onnxruntime, no torch.
MIGRATE_RELEASE = "0.18.0"
MIGRATE_REQUIREMENTS = (
    f"cyborgdb-migrate[chromadb]=={MIGRATE_RELEASE}",
    "cyborgdb==0.18.0",
    "chromadb==1.5.9",
)
MIGRATE_INSTALL_TIMEOUT_S = 900


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
        install_failed(f"cyborgdb=={release}", proc)
    try:
        staging.rename(target)  # atomic: a half-done install is never taken for a cached one
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def install_failed(what: str, proc: subprocess.CompletedProcess[str] | None) -> NoReturn:
    """Skip (or, in CI, fail) the test: ``what`` could not be installed."""
    output = "pip timed out" if proc is None else (proc.stderr or proc.stdout).strip()
    message = f"cannot install {what} from the package index: {output[-800:]}"
    if required():
        pytest.fail(message)
    pytest.skip(message + " (set CI or VAULTVEC_COMPAT_REQUIRED to make this an error)")


def migrate_python() -> Path:
    """The interpreter of a virtual environment holding ``MIGRATE_REQUIREMENTS`` (made on first
    use). Run the tool through ``tests/compat/migrate_tool.py``: the environment is built under a
    staging name and renamed, so its console scripts' ``#!`` lines name the staging directory."""
    target = cache_dir() / f"cyborgdb-migrate-{MIGRATE_RELEASE}"
    marker = target / "vaultvec-requirements.txt"
    wanted = "\n".join(MIGRATE_REQUIREMENTS) + "\n"
    if marker.exists() and marker.read_text() == wanted:
        return target / "bin" / "python"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    python = staging / "bin" / "python"
    steps = (
        [sys.executable, "-m", "venv", str(staging)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *MIGRATE_REQUIREMENTS,
        ],
    )
    for cmd in steps:
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=MIGRATE_INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            proc = None
        if proc is None or proc.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            install_failed(" ".join(MIGRATE_REQUIREMENTS), proc)
    (staging / marker.name).write_text(wanted)
    shutil.rmtree(target, ignore_errors=True)  # an install of other requirements
    try:
        staging.rename(target)  # atomic: a half-done install is never taken for a cached one
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target / "bin" / "python"


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
