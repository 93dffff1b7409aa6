"""PostgresStore specifics on a throwaway server: concurrency, ordering, prefix escaping, errors,
restarts, URL parameters. The shared contract runs in test_store.py against both backends."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.storage import LocalStore, StoreError, open_store
from tests.helpers import free_port, run_threads
from tests.pg_server import PostgresServer

psycopg = pytest.importorskip(
    "psycopg", reason='psycopg not installed: pip install -e ".[postgres]"'
)

from actors.storage import postgres, postgres_vacuum  # noqa: E402
from actors.storage.postgres import PostgresStore  # noqa: E402


@pytest.fixture
def pg(fresh_postgres_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(fresh_postgres_url)
    yield s
    s.close()


def _rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def test_concurrent_appenders_from_two_stores_keep_every_record_in_order(
    fresh_postgres_url: str,
) -> None:
    """16 writers on two stores (as if two processes) append to one log: none lost, per-writer
    order kept, and the sequence numbers are gapless."""
    stores = [PostgresStore(fresh_postgres_url, pool_max=4) for _ in range(2)]
    writers, per_writer = 16, 40
    barrier = threading.Barrier(writers)

    def writer(w: int) -> None:
        barrier.wait()
        for i in range(per_writer):
            stores[w % 2].append("idx/wal", f"{w}:{i}".encode())

    try:
        run_threads(writer, writers)
        got = stores[0].read_log("idx/wal")
    finally:
        for s in stores:
            s.close()
    assert len(got) == writers * per_writer
    seen: dict[int, list[int]] = {w: [] for w in range(writers)}
    for record in got:
        w, i = map(int, record.split(b":"))
        seen[w].append(i)
    assert all(seen[w] == list(range(per_writer)) for w in range(writers))
    seqs = [r[0] for r in _rows(fresh_postgres_url, "SELECT seq FROM vaultvec_log ORDER BY seq")]
    assert seqs == list(range(1, writers * per_writer + 1))


def test_concurrent_put_get_never_see_partial_data(pg: PostgresStore) -> None:
    values = [bytes([n]) * (300_000 + 70_000 * n) for n in range(3)]
    pg.put("blob", values[0])
    stop = threading.Event()
    reads = [0]

    def worker(i: int) -> None:
        if i == 0:
            for n in range(60):
                pg.put("blob", values[n % 3])
            stop.set()
            return
        while not stop.is_set():
            assert pg.get("blob") in values
            reads[0] += 1

    run_threads(worker, 4)
    assert reads[0] > 0


KEYS = [
    "a", "a-b", "a.b", "b/c", "a0", "a9", "aA", "aZ", "a_b", "ab", "A", "Z", "_", "-", ".x",
    "0", "9", "a_", "a__", "a-", "a--", "idx_1/x", "idx-1/x", "idx.1/x", "idx1/x", "idxA/x",
]  # fmt: skip


def test_list_order_matches_local_store(pg: PostgresStore, tmp_path: Path) -> None:
    with LocalStore(tmp_path / "local") as local:
        for n, key in enumerate(KEYS):
            for s in (pg, local):
                if n % 3:
                    s.put(key, b"v")
                else:
                    s.append(key, b"r")
        for prefix in ["", "a", "a_", "a-", "a.", "idx", "idx_", "idx_1/", "_", "Z"]:
            assert pg.list(prefix) == local.list(prefix), prefix
        assert pg.list("") == sorted(KEYS)  # plain code-point order


def test_delete_prefix_treats_underscore_literally(pg: PostgresStore, tmp_path: Path) -> None:
    keys = ["idx_1/a", "idxA1/a", "idx-1/a", "idx_1x", "idxx/b", "i_x", "ia_b"]
    with LocalStore(tmp_path / "local") as local:
        for s in (pg, local):
            for key in keys:
                s.put(key, b"v")
            s.append("idxZ1/wal", b"r")
        for prefix in ["idx_1/", "idx_", "i_"]:
            assert pg.delete_prefix(prefix) == local.delete_prefix(prefix), prefix
            assert pg.list("") == local.list(""), prefix
    assert pg.list("") == ["ia_b", "idx-1/a", "idxA1/a", "idxZ1/wal", "idxx/b"]


def test_unreachable_server_fails_fast_without_the_password() -> None:
    port = free_port()  # nobody listens here
    url = f"postgresql://vaultvec:Pa55-w0rd-xyz@127.0.0.1:{port}/vaultvec"
    for opener in (open_store, PostgresStore):
        start = time.monotonic()
        with pytest.raises(StoreError) as info:
            opener(url)
        assert time.monotonic() - start < 5
        message = str(info.value)
        assert f"127.0.0.1:{port}/vaultvec" in message and "cannot connect" in message
        assert "Pa55-w0rd-xyz" not in message
        assert "Pa55-w0rd-xyz" not in repr(info.value.__cause__)


def test_errors_and_repr_never_show_the_password(postgres_server: PostgresServer) -> None:
    url = postgres_server.url("no_such_database", password="Pa55-w0rd-xyz")
    with pytest.raises(StoreError, match="no_such_database") as info:
        PostgresStore(url)
    assert "Pa55-w0rd-xyz" not in str(info.value)
    with PostgresStore(postgres_server.url("postgres", password="Pa55-w0rd-xyz")) as s:
        assert "Pa55-w0rd-xyz" not in repr(s)
        where = f"127.0.0.1:{postgres_server.port}/postgres"
        assert repr(s) == f"PostgresStore({where!r}, table_prefix='vaultvec_')"


def test_blobs_and_records_are_byte_identical(pg: PostgresStore, fresh_postgres_url: str) -> None:
    data = bytes(range(256)) * 64 + b"\x00" * 1000 + os.urandom(100_000) + b"\\x00'\""
    pg.put("k", data)
    pg.append("k", data)
    pg.append("k", b"\x00")
    got = pg.get("k")
    assert got == data and type(got) is bytes
    assert pg.read_log("k") == [data, b"\x00"]
    # Stored as given: no framing or encoding added by the store.
    assert _rows(fresh_postgres_url, "SELECT data FROM vaultvec_blobs") == [(data,)]


def test_too_large_value_is_refused(pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "MAX_VALUE", 10)
    with pytest.raises(StoreError, match="'big'"):
        pg.put("big", b"x" * 11)
    with pytest.raises(StoreError, match="'big'"):
        pg.append("big", b"x" * 11)
    assert pg.get("big") is None and pg.read_log("big") == []


def test_closed_store_refuses(pg: PostgresStore) -> None:
    pg.put("k", b"v")
    pg.close()
    with pytest.raises(StoreError, match="closed"):
        pg.get("k")
    pg.close()  # idempotent


def test_many_stores_create_the_schema_at_once(fresh_postgres_url: str) -> None:
    stores: list = [None] * 8
    barrier = threading.Barrier(8)

    def opener(i: int) -> None:
        barrier.wait()
        stores[i] = PostgresStore(fresh_postgres_url, pool_min=0)

    run_threads(opener, 8)
    stores[0].put("k", b"v")
    assert all(s.get("k") == b"v" for s in stores)
    for s in stores:
        s.close()
    tables = _rows(
        fresh_postgres_url,
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    assert tables == [("vaultvec_blobs",), ("vaultvec_log",)]


def test_url_parameters(fresh_postgres_url: str) -> None:
    url = fresh_postgres_url + "?table_prefix=other_&pool_min=0&pool_max=2&pool_timeout=3"
    with PostgresStore(url + "&connect_timeout=3&application_name=vv-test") as a:
        a.put("k", b"a")
        assert a.table_prefix == "other_"
        assert a._pool.min_size == 0 and a._pool.max_size == 2 and a._pool.timeout == 3
        with a._pool.connection() as conn:
            assert conn.execute("SHOW application_name").fetchone() == ("vv-test",)
        with PostgresStore(fresh_postgres_url) as b:  # separate tables
            assert b.get("k") is None and b.list("") == []
            b.put("k", b"b")
        assert a.get("k") == b"a"
    for bad in ["table_prefix=Bad-Name", "pool_max=0", "pool_min=x", "pool_timeout=0"]:
        with pytest.raises(ValueError):
            PostgresStore(f"{fresh_postgres_url}?{bad}")


def test_commits_are_durable_even_if_the_database_default_is_not(
    postgres_server: PostgresServer, fresh_postgres_url: str
) -> None:
    name = fresh_postgres_url.rsplit("/", 1)[1]
    postgres_server.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
    with PostgresStore(fresh_postgres_url) as s:
        s.put("k", b"v")
        with s._pool.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


def _vacuum_options(url: str, table: str) -> set[str]:
    (row,) = _rows(
        url,
        "SELECT c.reloptions, t.reloptions FROM pg_class c JOIN pg_class t "
        f"ON t.oid = c.reltoastrelid WHERE c.relname = '{table}'",
    )
    return {*(row[0] or ()), *(f"toast.{o}" for o in row[1] or ())}


def test_snapshot_churn_is_vacuumed_without_the_default_delay(
    postgres_server: PostgresServer, fresh_postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Snapshots replace gigabytes of chunks at a time: both tables and their TOAST tables are
    vacuumed unthrottled, set when they are made and on open where missing; a role that does
    not own them still opens the store, told why the tuning is missing."""
    tuned = {f"{k}={v}" for k, v in postgres_vacuum.VACUUM_TUNING.items()}
    tables = ("vaultvec_blobs", "vaultvec_log")
    PostgresStore(fresh_postgres_url).close()
    for table in tables:
        assert tuned <= _vacuum_options(fresh_postgres_url, table)
    name = fresh_postgres_url.rsplit("/", 1)[1]
    reset = ", ".join(postgres_vacuum.VACUUM_TUNING)
    for table in tables:
        postgres_server.execute(f"ALTER TABLE {table} RESET ({reset})", name)
    role = f"other_{name}"
    postgres_server.execute(f"CREATE ROLE {role} LOGIN")
    try:
        postgres_server.execute(f"GRANT ALL ON vaultvec_blobs, vaultvec_log TO {role}", name)
        other = fresh_postgres_url.replace("postgres@", f"{role}@", 1)
        with caplog.at_level("WARNING", logger="vaultvec.store"), PostgresStore(other) as s:
            s.put("k", b"v")  # not the owner: no tuning, but a working store
        assert "not its owner" in caplog.text
        assert not tuned & _vacuum_options(fresh_postgres_url, "vaultvec_blobs")
        PostgresStore(fresh_postgres_url).close()  # the owner opens it again: tuned
        for table in tables:
            assert tuned <= _vacuum_options(fresh_postgres_url, table)
    finally:
        postgres_server.execute(f"DROP OWNED BY {role}", name)
        postgres_server.execute(f"DROP ROLE {role}")


def test_server_restart_is_survived(postgres_server: PostgresServer) -> None:
    """Stop and start the server under an open store: calls while it is down fail fast with a
    clear error; the same store object works again once it is back."""
    with PostgresServer(postgres_server.bindir) as server:
        url = server.create_database("restart")
        store = PostgresStore(url + "?pool_max=3")
        try:
            store.put("k", b"v1")
            store.append("wal", b"r1")
            run_threads(lambda i: store.get("k"), 3)  # several pooled connections
            server.stop()
            for call in (lambda: store.get("k"), lambda: store.append("wal", b"lost")):
                start = time.monotonic()
                with pytest.raises(StoreError, match=f"127.0.0.1:{server.port}/restart"):
                    call()
                assert time.monotonic() - start < 5
            server.start()
            assert store.get("k") == b"v1"
            store.append("wal", b"r2")
            assert store.read_log("wal") == [b"r1", b"r2"]
            server.restart()  # no call in between: every pooled connection is stale
            run_threads(lambda i: store.append("wal", f"r{3 + i}".encode()), 3)
            assert sorted(store.read_log("wal")) == [b"r1", b"r2", b"r3", b"r4", b"r5"]
            store.put("k", b"v2")
            assert store.get("k") == b"v2"
        finally:
            store.close()


def test_split_url_keeps_libpq_parameters_verbatim() -> None:
    url = (
        "postgresql+psycopg://u:p%40ss@db:5433/vv"
        "?options=-c%20a%3Db&table_prefix=x_&sslmode=require&pool_max=3"
    )
    conninfo, ours = postgres.split_url(url)
    assert conninfo == (
        "postgresql://u:p%40ss@db:5433/vv?options=-c%20a%3Db&sslmode=require"
        "&connect_timeout=5&application_name=vaultvec"
    )
    assert ours == {"table_prefix": "x_", "pool_max": "3"}
    assert postgres.split_url("postgres://db/x?connect_timeout=2&application_name=a")[0] == (
        "postgres://db/x?connect_timeout=2&application_name=a"
    )
    with pytest.raises(ValueError, match="postgresql://"):
        postgres.split_url("mysql://db/x")


def test_bad_url_error_hides_the_password() -> None:
    with pytest.raises(ValueError, match="invalid PostgreSQL store URL") as info:
        PostgresStore("postgresql://u:Secret%zzWord@db/x?bogus=1")
    assert "Secret" not in str(info.value)
