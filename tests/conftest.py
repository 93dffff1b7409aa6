"""Shared test helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.pg_server import PostgresServer, find_bindir

SIFT_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "sift-5k.tsv"


def load_sift() -> np.ndarray:
    """The 5,000 real SIFT descriptors from ../shared/data, or skip with a clear message."""
    if not SIFT_PATH.exists():
        pytest.skip(f"SIFT sample not found at {SIFT_PATH} (it lives in the shared data directory)")
    data = np.loadtxt(SIFT_PATH, dtype=np.float32, delimiter="\t")
    return np.ascontiguousarray(data[:, :128])


def clustered(
    n: int, d: int, n_clusters: int = 100, seed: int = 0, spread: float = 0.15
) -> np.ndarray:
    """Synthetic clustered vectors: Gaussian blobs around random centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    labels = rng.integers(0, n_clusters, size=n)
    return (centres[labels] + spread * rng.normal(size=(n, d))).astype(np.float32)


def random_key() -> str:
    return np.random.default_rng().bytes(32).hex()


@contextlib.contextmanager
def ray_tmpdir(prefix: str, **env: str) -> Iterator[str]:
    """A RAY_TMPDIR of its own for a Ray started in this block, plus ``env``; afterwards the
    variables are restored and the directory (sockets, session logs) removed. The path stays
    short: Unix socket paths under it are limited to 108 bytes."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    values = {"RAY_TMPDIR": path, **env}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(path, ignore_errors=True)


def run_threads(target: Callable[[int], object], n: int) -> None:
    """Run ``target(0), ..., target(n - 1)`` on ``n`` threads at once; fail on any error."""
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# -- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the session (skips only if PostgreSQL is not installed)."""
    pytest.importorskip("psycopg", reason='psycopg not installed: pip install -e ".[postgres]"')
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install PostgreSQL "
            "or set VAULTVEC_PG_BINDIR"
        )
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """URL of the session's database ``vaultvec_test``."""
    return postgres_server.create_database("vaultvec_test")


@pytest.fixture()
def fresh_postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """URL of a new empty database for one test, dropped afterwards."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url.rsplit("/", 1)[1])
