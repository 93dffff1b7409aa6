"""Session fixtures shared by every test directory (plain helpers live in tests/helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster import fastpath
from serve_app.settings import Settings
from tests.pg_server import PostgresServer, find_bindir

# Every Ray the tests start runs Serve as `vaultvec serve` does by default (VAULTVEC_SERVE_FAST_PATH,
# cluster/fastpath.py): Serve reads these variables at import, before any test module imports it.
fastpath.apply(Settings(**{}).serve_fast_path)

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
