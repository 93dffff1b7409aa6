"""HAProxy's configuration as Serve writes it, made safe before HAProxy reads it
(cluster/haproxy_guard.py): the admin socket private, no listener but the client frontends on a
port, HTTPS when a certificate is configured, and a configuration it cannot place refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import haproxy_guard
from cluster.haproxy_guard import UnsafeConfig, check, harden

# The shape of what ray.serve._private.haproxy_templates renders (abridged).
SERVE_CONFIG = """global
    log 127.0.0.1:514 local0 info
    stats socket /run/hap/admin.sock mode 666 level admin expose-fd listeners
    stats timeout 30s
defaults
    mode http
frontend prometheus
    bind :9101
    mode http
    http-request use-service prometheus-exporter if { path /metrics }
frontend http_frontend
    bind 127.0.0.1:8000
    log global
backend http-vaultvec
    server SERVE_REPLICA_a 127.0.0.1:30000 check
listen stats
  bind *:8404
  stats enable
  stats uri /stats
"""


def test_the_admin_socket_becomes_private_and_side_listeners_leave_the_network() -> None:
    out = harden(SERVE_CONFIG, "/run/hap")
    assert "stats socket /run/hap/admin.sock mode 600 level admin expose-fd listeners" in out
    assert "mode 666" not in out
    assert "    bind unix@/run/hap/prome.sock mode 600\n" in out
    assert "  bind unix@/run/hap/stats.sock mode 600\n" in out
    assert "    bind 127.0.0.1:8000\n" in out  # the API, untouched
    assert "server SERVE_REPLICA_a 127.0.0.1:30000 check" in out  # backends are not listeners
    assert "defaults\n    mode http\n    option forwardfor\n" in out  # clients' addresses
    assert harden(out, "/run/hap") == out  # idempotent: reloads rewrite what was rewritten


def test_with_a_certificate_the_http_frontend_serves_https() -> None:
    out = harden(SERVE_CONFIG, "/run/hap", "/run/hap/tls.pem")
    assert "    bind 127.0.0.1:8000 ssl crt /run/hap/tls.pem alpn http/1.1\n" in out
    assert out.count(" ssl ") == 1


def test_a_socket_without_a_mode_gets_one() -> None:
    text = SERVE_CONFIG.replace(" mode 666", "")
    assert "admin.sock mode 600 level admin" in harden(text, "/run/hap")


@pytest.mark.parametrize(
    "bad",
    [
        "    stats socket /x/admin.sock mode 660 level admin\n",  # check alone: a group may use it
        "frontend other\n    bind *:1234\n",
    ],
)
def test_check_refuses_what_is_not_safe(bad: str) -> None:
    with pytest.raises(UnsafeConfig):
        check("global\n" + bad)


def test_a_listener_outside_any_section_is_refused() -> None:
    with pytest.raises(UnsafeConfig):
        harden("global\n    bind *:80\n", "/run/hap")


def test_the_guard_hardens_the_file_haproxy_is_given(tmp_path: Path) -> None:
    """The guard rewrites the file of ``-f`` in place (it is what HAProxy reads), writes the
    certificate and key joined for HAProxy, and runs the program with the same arguments."""
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(SERVE_CONFIG)
    (tmp_path / "c.pem").write_text("CERT\n")
    (tmp_path / "k.pem").write_text("KEY\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(haproxy_guard.__file__).parents[1]),
        haproxy_guard.CERT_ENV: str(tmp_path / "c.pem"),
        haproxy_guard.KEY_ENV: str(tmp_path / "k.pem"),
    }
    code = "import sys; from cluster.haproxy_guard import run; run('/bin/echo', sys.argv[1:])"
    out = subprocess.run(
        [sys.executable, "-c", code, "-f", str(cfg), "-db"], env=env, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == f"-f {cfg} -db\n"
    text = cfg.read_text()
    assert "mode 666" not in text and f"ssl crt {tmp_path}/tls.pem" in text
    pem = tmp_path / "tls.pem"
    assert pem.read_text() == "CERT\nKEY\n"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600


def test_a_configuration_it_cannot_make_safe_does_not_start(tmp_path: Path) -> None:
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("global\n    bind *:80\n")
    code = "import sys; from cluster.haproxy_guard import run; run('/bin/echo', sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": str(Path(haproxy_guard.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code, "-f", str(cfg)], env=env, capture_output=True)
    assert out.returncode != 0 and out.stdout == b""
    assert b"refusing to start HAProxy" in out.stderr


def test_idle_connections_to_the_replicas_are_purged_within_their_keep_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HAProxy closes half of its idle server connections every pool-purge-delay; all of its
    4096 are gone within 13 periods. The delay is set so that this is shorter than the
    replicas' keep-alive (the defaults' http-keep-alive), or Serve's own override of it."""
    monkeypatch.delenv("RAY_SERVE_HTTP_KEEP_ALIVE_TIMEOUT_S", raising=False)
    text = SERVE_CONFIG.replace(
        "defaults\n    mode http\n", "defaults\n    mode http\n    timeout http-keep-alive 75s\n"
    ).replace(
        "backend http-vaultvec\n",
        "backend http-vaultvec\n    default-server inter 5s check\n",
    )
    out = harden(text, "/run/hap")
    assert "    default-server inter 5s check pool-purge-delay 4687ms\n" in out
    assert 13 * 4687 < 75_000
    monkeypatch.setenv("RAY_SERVE_HTTP_KEEP_ALIVE_TIMEOUT_S", "5")
    assert "pool-purge-delay 312ms" in harden(text, "/run/hap")
    assert "pool-purge-delay" not in harden(SERVE_CONFIG, "/run/hap")  # no keep-alive known


def test_the_command_for_ray_nodes_started_by_hand_is_installed() -> None:
    """`vaultvec-haproxy` (RAY_SERVE_HAPROXY_BINARY_PATH on KubeRay and `ray start` nodes) is
    the same guard: it becomes the HAProxy it is given, with its arguments."""
    import shutil

    command = shutil.which("vaultvec-haproxy", path=os.path.dirname(sys.executable))
    if command is None:
        pytest.skip("the package is not installed (pip install -e .): no vaultvec-haproxy")
    env = {**os.environ, haproxy_guard.REAL_ENV: "/bin/echo"}
    out = subprocess.run([command, "-v", "x"], env=env, capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout == b"-v x\n", out.stderr
