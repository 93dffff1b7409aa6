"""A throwaway PostgreSQL server for tests: initdb in a temp dir, start on a free port, remove all.

PostgreSQL refuses to run as root, so under root ``initdb`` and ``pg_ctl`` run as the
``postgres`` OS user (``runuser``, else ``su``) in a temp directory that user owns.
The server trusts local connections, listens on 127.0.0.1 only and runs with ``fsync=off``:
it holds test data, and a clean stop (as in :meth:`PostgresServer.restart`) still keeps it.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.helpers import free_port

SERVER_USER = "postgres"
_BINARIES = ("initdb", "pg_ctl", "postgres")
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None if PostgreSQL is missing.

    Looks at ``$VAULTVEC_PG_BINDIR``, ``pg_config --bindir``, /usr/lib/postgresql/*/bin
    (newest first), /usr/pgsql-*/bin, then ``initdb`` on the PATH.
    """
    candidates: list[Path] = []
    if os.environ.get("VAULTVEC_PG_BINDIR"):
        candidates.append(Path(os.environ["VAULTVEC_PG_BINDIR"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))

    def version(bindir: Path) -> int:
        name = bindir.parent.name.removeprefix("pgsql-")
        return int(name) if name.isdigit() else -1

    for base, stem in ((Path("/usr/lib/postgresql"), ""), (Path("/usr"), "pgsql-")):
        found = [d / "bin" for d in base.glob(stem + "*")] if base.is_dir() else []
        candidates += sorted(found, key=version, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for directory in candidates:
        if all((directory / name).is_file() for name in _BINARIES):
            return directory
    return None


class PostgresServer:
    """One PostgreSQL cluster in a private temp dir. Use as a context manager or start/cleanup."""

    def __init__(self, bindir: Path, *, user: str = "postgres") -> None:
        self.bindir = bindir
        self.user = user  # the database superuser
        self.port = 0
        self._as_root = os.geteuid() == 0
        self._counter = itertools.count()
        self.root = self._make_root()
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self._running = False
        self._owner = os.getpid()  # a forked child must not tear the server down at exit
        atexit.register(self.cleanup)
        self._initdb()

    # -- set-up ----------------------------------------------------------------------------

    def _make_root(self) -> Path:
        base = Path(tempfile.gettempdir())
        if self._as_root:
            try:
                owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(
                    f"running as root, but there is no {SERVER_USER!r} OS user to run "
                    "PostgreSQL as (PostgreSQL refuses to run as root)"
                ) from None
            if not all(os.stat(p).st_mode & 0o001 for p in [base, *base.parents]):
                base = Path("/tmp")  # $TMPDIR is not reachable for the server user
        root = Path(tempfile.mkdtemp(prefix="vaultvec-pg-", dir=base))
        (root / "sockets").mkdir()
        if self._as_root:
            for path in (root, root / "sockets"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        return root

    def _command(self, *args: str) -> list[str]:
        if not self._as_root:
            return list(args)
        if shutil.which("runuser"):
            return ["runuser", "-u", SERVER_USER, "--", *args]
        return ["su", SERVER_USER, "-s", "/bin/sh", "-c", shlex.join(args)]

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return subprocess.run(
            self._command(*args),
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _initdb(self) -> None:
        done = self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (on a new free port the first time, the same port afterwards)."""
        if self._running:
            return
        for attempt in range(3):
            if not self.port or attempt:
                self.port = free_port()
            options = " ".join(
                [
                    f"-p {self.port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-c unix_socket_directories={self.sockets}",
                    "-c fsync=off",
                    "-c full_page_writes=off",
                    "-c max_connections=100",
                    "-c shared_buffers=32MB",
                ]
            )
            done = self._run(
                str(self.bindir / "pg_ctl"),
                "start",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                options,
            )
            if done.returncode == 0:
                self._running = True
                return
        raise RuntimeError(
            f"PostgreSQL did not start ({done.returncode}): {done.stderr.strip()}\n{self.log_tail()}"
        )

    def stop(self, mode: str = "fast") -> None:
        if not self._running:
            return
        done = self._run(
            str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60"
        )
        if done.returncode != 0 and mode != "immediate":
            self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate")
        self._running = False

    def restart(self) -> None:
        """Stop (cleanly) and start the same data directory on the same port."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the server and delete its directory (idempotent)."""
        if os.getpid() != self._owner:
            return
        with contextlib.suppress(Exception):
            self.stop()
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():  # pg_ctl could not stop it: kill the postmaster
            with contextlib.suppress(Exception):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    # -- databases -------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", password: str | None = None) -> str:
        auth = f"{self.user}:{password}" if password else self.user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, statement: str, dbname: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE, ALTER ...)."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    def create_database(self, name: str | None = None) -> str:
        """Create a database (a fresh unique name by default); return its URL."""
        name = name or f"vaultvec_t{next(self._counter)}_{uuid.uuid4().hex[:8]}"
        if _DB_NAME.fullmatch(name) is None:
            raise ValueError(f"bad database name {name!r}")
        self.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        if _DB_NAME.fullmatch(name) is None:
            raise ValueError(f"bad database name {name!r}")
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
