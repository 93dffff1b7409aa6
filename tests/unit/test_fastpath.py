"""Serve's fast path (cluster/fastpath.py): what `vaultvec serve` sets, and the guard that ties
HAProxy's life to the proxy actor that starts it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cluster import constants, fastpath


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*fastpath.ENV, *fastpath.PORTS, fastpath.BINARY):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_applied_it_sets_every_switch(clean_env: pytest.MonkeyPatch) -> None:
    assert fastpath.apply() == fastpath.ENV


def test_a_start_tidies_the_haproxy_directory_it_is_given(clean_env: pytest.MonkeyPatch) -> None:
    swept: list[str] = []
    for name in fastpath.HAPROXY_PATHS:
        clean_env.delenv(name, raising=False)
    clean_env.setattr(fastpath, "remove_stale_nodes", swept.append)
    fastpath.apply()
    config = os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]
    assert swept == [os.path.dirname(config)]


def test_each_service_gets_its_own_haproxy_ports(clean_env: pytest.MonkeyPatch) -> None:
    fastpath.apply()
    ports = {os.environ[name] for name in fastpath.PORTS}
    assert len(ports) == 4 and not ports & {"8404", "9101", "8500", "9500"}
    assert not set(fastpath.without_ports(dict(os.environ))) & set(fastpath.PORTS)


def test_a_switch_set_in_the_environment_is_kept(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    used = fastpath.apply()
    assert used["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert used["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_turned_off_it_leaves_serve_stock(clean_env: pytest.MonkeyPatch) -> None:
    assert set(fastpath.apply(enabled=False).values()) == {"0"}


def test_haproxy_runs_through_the_guard(clean_env: pytest.MonkeyPatch) -> None:
    real = fastpath.haproxy_binary()
    assert real is not None, "ray[serve] bundles HAProxy"
    fastpath.apply()
    path = os.environ[fastpath.BINARY]
    assert path != real and os.access(path, os.X_OK) and repr(real) in Path(path).read_text()


def test_an_explicit_haproxy_binary_is_kept(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(fastpath.BINARY, "/opt/haproxy")
    fastpath.apply()
    assert os.environ[fastpath.BINARY] == "/opt/haproxy"


def test_the_guard_becomes_the_program_with_its_arguments(tmp_path: Path) -> None:
    guarded = fastpath.guard("/bin/sh", str(tmp_path / "bin"))
    out = subprocess.run([guarded, "-c", 'echo "$0 $1"', "a", "b c"], capture_output=True)
    assert out.stdout == b"a b c\n"


def test_the_guarded_program_dies_with_its_parent(tmp_path: Path) -> None:
    """What a killed `vaultvec serve` needs: HAProxy must not outlive the proxy actor that
    started it, or it keeps the HTTP port and the restart cannot bind it."""
    guarded = fastpath.guard("/bin/sleep", str(tmp_path / "bin"))
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"child = subprocess.Popen([{guarded!r}, '600'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the guard has become sleep
    assert Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"/bin/sleep\x00600")
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_directory_others_can_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    guarded = fastpath.guard("/bin/sh", str(shared))
    assert not guarded.startswith(str(shared))
    assert os.stat(os.path.dirname(guarded)).st_mode & 0o077 == 0


def _alive(pid: int) -> bool:
    """Running and not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_service_started_from_here_gets_none_of_its_settings(
    clean_env: pytest.MonkeyPatch,
) -> None:
    fastpath.apply()
    env = fastpath.without(dict(os.environ))
    assert not set(env) & {*fastpath.ENV, *fastpath.PORTS, fastpath.BINARY}
    assert env["PATH"] == os.environ["PATH"]


def test_ports_picked_for_the_service_lie_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port free when picked but in the ephemeral range could be taken by any process's
    outgoing connection before the service binds it (HAProxy then exits: address in use)."""
    low, _ = fastpath.ephemeral_ports()
    for _ in range(50):
        port = fastpath.free_port()
        assert constants.PORTS_FROM <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # and free
    monkeypatch.setattr(fastpath, "ephemeral_ports", lambda: (1024, 60999))
    assert 0 < fastpath.free_port() < 65536  # no room below it: any free port


def test_a_killed_services_haproxy_files_go_at_the_next_start() -> None:
    """A node's directory is removed once it is old and no HAProxy answers on its admin
    socket; a live HAProxy's, a fresh one's (HAProxy still starting) and anything not named by
    a node id stay."""
    base = Path(tempfile.mkdtemp(prefix="vvh-t", dir="/tmp"))  # sockets need a short path
    try:
        nodes = {
            kind: base / (f"{i:x}" * 56)
            for i, kind in enumerate(("killed", "refused", "live", "starting"), start=1)
        }
        for path in nodes.values():
            path.mkdir()
            (path / "haproxy.cfg").write_text("global\n")
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(nodes["refused"] / "admin.sock"))  # its process is gone: refused
        dead.close()
        live = socket.socket(socket.AF_UNIX)
        live.bind(str(nodes["live"] / "admin.sock"))
        live.listen()
        other = base / "not-a-node"
        other.mkdir()
        old = time.time() - fastpath.STALE_NODE_S - 60
        for path in (*nodes.values(), other):
            if path != nodes["starting"]:
                os.utime(path, (old, old))
        removed = fastpath.remove_stale_nodes(str(base))
        assert sorted(removed) == sorted(str(nodes[k]) for k in ("killed", "refused"))
        assert {p.name for p in base.iterdir()} == {
            nodes["live"].name,
            nodes["starting"].name,
            other.name,
        }
        live.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
