"""A real `vaultvec serve` in a process tree of its own, as a user starts it, for the tests that
need what the in-process session service cannot show: its own Ray started with the service's
defaults, its own runtime directory, TLS, command-line options.

Its TMPDIR is a fresh short directory of its own (the runtime directory, Ray's session files and
HAProxy's sockets lie under it: Unix socket paths are limited to 97-107 bytes), removed with
every process that still uses it when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cluster import fastpath
from tests.helpers import free_port


@dataclass
class Served:
    proc: subprocess.Popen[str]
    port: int
    storage: Path
    tmpdir: Path
    url: str
    output: list[str] = field(default_factory=list)

    @property
    def api_key(self) -> str:
        return (self.storage / "api-key").read_text().strip()


def short_private_dir() -> Path:
    for _ in range(100):
        path = Path(f"/tmp/v{secrets.token_hex(2)}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path
    raise AssertionError("no free short directory name in /tmp")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would make the server join or reuse
    the test session's Ray, its runtime directory or its keys."""
    env = fastpath.without(dict(os.environ))
    for name in (
        "RAY_TMPDIR",
        "RAY_ADDRESS",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_AUTH_MODE",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        "VAULTVEC_API_KEY",
        "VAULTVEC_API_KEY_FILE",
    ):
        env.pop(name, None)
    env.update(extra)
    return env


@contextlib.contextmanager
def serve(
    storage: Path | str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 180
) -> Iterator[Served]:
    """`vaultvec serve --storage <storage> --port <free> <args>` until the block ends: a
    directory, or a store URL (then ``Served.storage`` is no directory)."""
    tmpdir = short_private_dir()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "serve", "--storage",
         storage if isinstance(storage, str) else f"file://{storage}",
         "--port", str(port), *args],
        env=clean_env(TMPDIR=str(tmpdir), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    output: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    url = ""
    for line in proc.stdout:
        output.append(line)
        if "vaultvec serving at" in line:
            url = line.split("vaultvec serving at ", 1)[1].split()[0]
            break
        if time.monotonic() > deadline:
            break
    threading.Thread(target=output.extend, args=(proc.stdout,), daemon=True).start()
    try:
        assert url, "vaultvec serve did not start:\n" + "".join(output[-40:])
        yield Served(proc, port, Path(storage), tmpdir, url, output)
    finally:
        stop(proc, tmpdir)


def stop(proc: subprocess.Popen[str], tmpdir: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # Ray's daemons may have left the process group: whatever still uses this tmpdir goes.
    subprocess.run(["pkill", "-9", "-f", str(tmpdir)], check=False)
    time.sleep(1)
    shutil.rmtree(tmpdir, ignore_errors=True)
