"""Kill the whole real server with SIGKILL under write load; every acknowledged item survives.

Runs `vaultvec serve` as a separate process tree (its own Ray, its own RAY_TMPDIR) so the kill
takes out the gateway, the shards, the control plane and Ray itself, as a power cut would. The
same test covers the generated API key (printed once, kept with mode 0600, reused on restart)
and a clean exit on SIGTERM, which leaves none of HAProxy's files behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from actors.process import private
from cluster import fastpath
from cluster.client import generate_key
from tests.helpers import free_port

pytestmark = pytest.mark.slow


def start_server(storage: Path, ray_tmp: str, port: int) -> tuple[subprocess.Popen[str], list[str]]:
    env = dict(fastpath.without_ports(dict(os.environ)), RAY_TMPDIR=ray_tmp)
    env["VAULTVEC_WAL_MAX_RECORDS"] = "8"
    env.pop("RAY_ADDRESS", None)
    env.pop("VAULTVEC_API_KEY", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "serve",
            "--storage",
            f"file://{storage}",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "vaultvec serving at" in line:
            # Keep the pipe drained and remember what was said.
            threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True).start()
            return proc, lines
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines[-40:]))


def kill_tree(proc: subprocess.Popen[str], ray_tmp: str) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # Ray daemons may have left the process group: kill whatever still uses this Ray's tmp dir.
    subprocess.run(["pkill", "-9", "-f", ray_tmp], check=False)
    time.sleep(1)


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    ray_tmp = tempfile.mkdtemp(prefix="vv", dir="/tmp")
    port = free_port()
    key = generate_key()
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4000, 16)).astype(np.float32)
    acked: set[int] = set()
    proc, lines = start_server(storage, ray_tmp, port)
    try:
        key_file = storage / "api-key"
        api_key = key_file.read_text().strip()
        assert (key_file.stat().st_mode & 0o777) == 0o600
        assert any(api_key in line for line in lines), "the generated key is printed once"
        url = f"http://127.0.0.1:{port}"
        headers = {"X-API-Key": api_key}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            assert (
                c.post("/v1/indexes/create", json={"index_name": "d", "index_key": key}).status_code
                == 200
            )

            def writer(start: int, stop: int) -> None:
                with httpx.Client(base_url=url, headers=headers, timeout=60) as w:
                    for i in range(start, stop, 20):
                        items = [
                            {
                                "id": f"k{j}",
                                "vector": vectors[j].tolist(),
                                "metadata": {"j": j},
                                "contents": f"c{j}",
                            }
                            for j in range(i, min(i + 20, stop))
                        ]
                        try:
                            r = w.post(
                                "/v1/vectors/upsert",
                                json={"index_name": "d", "index_key": key, "items": items},
                            )
                        except httpx.HTTPError:
                            return  # the server died mid-request: not acknowledged
                        if r.status_code == 200:
                            acked.update(range(i, min(i + 20, stop)))

            threads = [
                threading.Thread(target=writer, args=(s, s + 1000)) for s in range(0, 4000, 1000)
            ]
            for t in threads:
                t.start()
            while len(acked) < 1500:
                time.sleep(0.05)
            kill_tree(proc, ray_tmp)
            for t in threads:
                t.join(timeout=60)
        assert len(acked) >= 1500

        runtime = Path(private.runtime_directory() or "/nonexistent")
        hap = runtime / fastpath.HAPROXY_DIR

        def entries() -> set[Path]:
            return {*runtime.iterdir(), *(hap.iterdir() if hap.is_dir() else ())}

        before = entries()
        proc, lines = start_server(storage, ray_tmp, port)
        assert not any(api_key in line for line in lines), "a kept key is not printed again"
        assert set(hap.iterdir()) - before, "HAProxy keeps its node's files in the runtime dir"
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            ids = [f"k{j}" for j in sorted(acked)]
            got = c.post("/v1/vectors/get", json={"index_name": "d", "index_key": key, "ids": ids})
            assert got.status_code == 200
            results = got.json()["results"]
            assert [r["id"] for r in results] == ids
            for r in results[:: max(1, len(results) // 200)]:
                j = int(r["id"][1:])
                np.testing.assert_array_equal(np.asarray(r["vector"], np.float32), vectors[j])
                assert r["metadata"] == {"j": j} and r["contents"] == f"c{j}"
            # A wrong key after the restart unlocks nothing.
            bad = c.post(
                "/v1/vectors/num_vectors", json={"index_name": "d", "index_key": generate_key()}
            )
            assert bad.status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        assert any("shutting down" in line for line in lines)
        # A clean exit leaves none of its files behind: HAProxy's, its pool actors' sockets,
        # its Ray's address (a killed one's stay: nothing ran; the next start removes the
        # sockets of pool actors that are gone).
        assert entries() <= before
    finally:
        if proc.poll() is None:
            kill_tree(proc, ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
