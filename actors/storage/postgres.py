"""PostgreSQL store: blobs and append-only logs in two tables, through a small connection pool.

URL: ``postgresql://user:password@host:port/dbname?param=value`` (or ``postgres://``). Any libpq
parameter works (``sslmode``, ``options``, ...); ``connect_timeout`` defaults to 5 s. These
vaultvec parameters are removed before the URL reaches libpq:

* ``table_prefix`` (default ``vaultvec_``): tables are ``<prefix>blobs`` and ``<prefix>log``;
* ``pool_min`` / ``pool_max`` (defaults: actors.constants.POSTGRES_POOL_MIN / _MAX): pooled
  connections per process;
* ``pool_timeout`` (default: actors.constants.POSTGRES_POOL_TIMEOUT_S): seconds an operation
  waits for a pooled connection.

Schema (created on open when missing; an advisory lock serialises concurrent creators)::

    <prefix>blobs (key text COLLATE "C" PRIMARY KEY, data bytea NOT NULL)
    <prefix>log   (key text COLLATE "C", seq bigint, record bytea NOT NULL, PRIMARY KEY (key, seq))

Keys use the "C" collation so :meth:`PostgresStore.list` sorts by code point like the directory
store, and prefix scans are index range scans (``prefix <= key < prefix || U+007F``: every key
character sorts below U+007F, so ``_`` and ``%`` need no escaping). Values are at most 1 GiB
(PostgreSQL's limit for one ``bytea``). Every write is one transaction, committed durably before
it returns (a session with ``synchronous_commit=off`` is switched back on).

Both tables and their TOAST tables are vacuumed without the autovacuum's cost delay and at 2%
dead rows (actors.storage.postgres_vacuum says why): set when the tables are made, and on open
where a setting is missing and this user may set it.

Snapshot swaps need no multi-key transaction: a shard puts its new snapshot before it deletes
older snapshots and WAL generations, and loading takes the newest snapshot and skips the WAL
generations it covers, so a crash between those steps leaves only garbage for the next swap.

Errors are :class:`~actors.storage.base.StoreError` naming the operation, the key and
``host:port/dbname`` — never the password or the data. A connection broken by a server restart
is replaced and the operation retried once (see :meth:`PostgresStore._run`).
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import re
import threading
import zlib
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from actors import constants
from actors.storage.base import StoreError, validate_key, validate_prefix
from actors.storage.postgres_vacuum import tune_vacuum

T = TypeVar("T")

MAX_VALUE = (1 << 30) - 5  # bytea: 1 GiB including its 4-byte length header
_PREFIX_END = "\x7f"  # sorts after every key character ([A-Za-z0-9._/-])
_TABLE_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")
_SCHEMA_LOCK = 0x76766563  # 'vvec': first half of the advisory lock guarding schema creation
log = logging.getLogger("vaultvec.store")
_LOST_STATES = ("08", "57P01", "57P02", "57P03")  # connection exceptions, server shutdown/start
_DEFAULTS = {
    "table_prefix": "vaultvec_",
    "pool_min": constants.POSTGRES_POOL_MIN,
    "pool_max": constants.POSTGRES_POOL_MAX,
    "pool_timeout": constants.POSTGRES_POOL_TIMEOUT_S,
}


def _int_param(name: str, value: Any, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"PostgreSQL store URL: {name} must be an integer") from None
    if number < low:
        raise ValueError(f"PostgreSQL store URL: {name} must be >= {low}")
    return number


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """Split the vaultvec parameters off a PostgreSQL URL: (libpq URL, vaultvec params).

    libpq's own parameters pass through byte for byte (libpq decodes ``%XX`` but not ``+``).
    """
    scheme, netloc, path, query, fragment = urlsplit(url)
    if scheme.lower().startswith("postgresql+"):  # SQLAlchemy-style driver suffix
        scheme = "postgresql"
    if scheme.lower() not in ("postgresql", "postgres"):
        raise ValueError("PostgreSQL store URL must start with postgresql:// or postgres://")
    kept: list[str] = []
    ours: dict[str, str] = {}
    for piece in query.split("&") if query else []:
        name, _, value = piece.partition("=")
        if unquote(name) in _DEFAULTS:
            ours[unquote(name)] = unquote(value)
        else:
            kept.append(piece)
    names = {unquote(piece.partition("=")[0]) for piece in kept}
    for name, value in (("connect_timeout", "5"), ("application_name", "vaultvec")):
        if name not in names:
            kept.append(f"{name}={value}")
    return urlunsplit((scheme, netloc, path, "&".join(kept), fragment)), ours


def _location(url: str, conninfo: str) -> tuple[str, list[str]]:
    """(``host:port/dbname`` for messages, the password spellings to scrub from messages)."""
    raw = urlsplit(url).password
    secrets = [s for s in {raw, unquote(raw)} if s] if raw else []
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise ValueError("invalid PostgreSQL store URL: " + _scrub(_reason(exc), secrets)) from None
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "")
    if params.get("password"):
        secrets.append(str(params["password"]))
    return f"{host}:{port}/{dbname}", secrets


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:  # shorter ones would mangle the message more than they reveal
            text = text.replace(secret, "***")
    return text


def _reason(exc: BaseException) -> str:
    """The error's primary message on one line."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)  # never the DETAIL (it may quote values)
    text = primary or str(exc) or type(exc).__name__
    return " ".join(text.split())


def _lost(exc: psycopg.Error, conn: psycopg.Connection[Any]) -> bool:
    """Whether ``exc`` means the connection is gone (so the statement may be retried)."""
    if conn.broken:
        return True
    state = exc.sqlstate or ""
    return state.startswith(_LOST_STATES)


class Unreachable(StoreError):
    """The PostgreSQL server cannot be reached (``reason`` says why, without secrets)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PostgresStore:
    """:class:`~actors.storage.base.Store` on PostgreSQL. Thread-safe (one pool per instance)."""

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str | None = None,
        pool_min: int | None = None,
        pool_max: int | None = None,
        pool_timeout: float | None = None,
    ) -> None:
        conninfo, params = split_url(url)
        self._conninfo = conninfo
        self._where, self._secrets = _location(url, conninfo)

        def pick(name: str, given: object) -> Any:
            return given if given is not None else params.get(name, _DEFAULTS[name])

        prefix = str(pick("table_prefix", table_prefix))
        if _TABLE_PREFIX.fullmatch(prefix) is None:
            raise ValueError("PostgreSQL store URL: table_prefix must match [a-z_][a-z0-9_]{0,40}")
        low = _int_param("pool_min", pick("pool_min", pool_min), 0)
        high = _int_param("pool_max", pick("pool_max", pool_max), max(1, low))
        try:
            self._timeout = float(pick("pool_timeout", pool_timeout))
        except (TypeError, ValueError):
            raise ValueError("PostgreSQL store URL: pool_timeout must be a number") from None
        if not self._timeout > 0:
            raise ValueError("PostgreSQL store URL: pool_timeout must be > 0")
        self.table_prefix = prefix
        self._blobs, self._log = prefix + "blobs", prefix + "log"
        self._lock_salt = prefix.encode()
        self._q = _queries(sql.Identifier(self._blobs), sql.Identifier(self._log))
        self._closed = False
        self._down = False
        self._recover_lock = threading.Lock()

        with self._probe() as conn:  # a clear error now if the server is unreachable
            self._create_schema(conn)
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo,
            min_size=low,
            max_size=high,
            timeout=self._timeout,
            kwargs={"autocommit": True},
            configure=_configure,
            name=f"vaultvec-store {self._where}",
            num_workers=2,
            # Give up background reconnects soon: a later request starts a fresh attempt
            # at once instead of waiting out an exponential backoff after a long outage.
            reconnect_timeout=constants.POSTGRES_RECONNECT_S,
            open=False,
        )
        self._pool.open(wait=False)

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, table_prefix={self.table_prefix!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections and errors ------------------------------------------------------------

    def _error(self, op: str, key: str, why: str) -> StoreError:
        return StoreError(
            _scrub(f"PostgreSQL store {self._where}: cannot {op} {key!r}: {why}", self._secrets)
        )

    def _probe(self) -> psycopg.Connection[Any]:
        """A fresh direct connection, or :class:`Unreachable` saying why there is none."""
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            reason = _scrub(_reason(exc), self._secrets)
            raise Unreachable(
                f"cannot connect to PostgreSQL at {self._where}: {reason}", reason
            ) from None
        return conn

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        lock = zlib.crc32(self._lock_salt) - (1 << 31)  # int4 second half of the lock key
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_SCHEMA_LOCK, lock))
                row = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                    (self._blobs, self._log),
                ).fetchone()
                if row is None or not row[0]:  # checked first: CREATE needs a privilege
                    for statement in self._q["schema"]:
                        conn.execute(statement)
                for table in (self._blobs, self._log):
                    tune_vacuum(conn, table)
        except psycopg.Error as exc:
            raise self._error("create tables", self._blobs, _reason(exc)) from None

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("PostgreSQL store is closed")

    def _recover(self, op: str, key: str) -> None:
        """Probe the server; if it is up, drop dead pooled connections (a restart kills all)."""
        try:
            self._probe().close()
        except Unreachable as down:
            self._down = True  # later calls probe first instead of waiting on the pool
            raise self._error(op, key, f"server unreachable: {down.reason}") from None
        self._down = False
        with self._recover_lock:
            self._pool.check()

    def _run(
        self,
        op: str,
        key: str,
        body: Callable[[psycopg.Connection[Any]], T],
        *,
        transaction: bool = False,
        replayable: bool = True,
    ) -> T:
        """Run ``body`` on a pooled connection (inside one transaction if ``transaction``).

        A pooled connection may have died since its last use (server restart, network blip):
        then the pool is checked and the call retried once. A non-``replayable`` body is
        retried only if the connection broke before its COMMIT was sent, so it never runs twice.
        """
        self._check_open()
        if self._down:
            self._recover(op, key)
        for attempt in (1, 2):
            committing = not transaction  # autocommit: the statement is its own commit
            lost = False
            try:
                with self._pool.connection() as conn:
                    try:
                        if not transaction:
                            return body(conn)
                        with conn.transaction():
                            result = body(conn)
                            committing = True
                        return result
                    except psycopg.Error as exc:
                        lost = _lost(exc, conn)  # before the pool discards a broken connection
                        raise
            except PoolTimeout:
                self._check_open()
                self._recover(op, key)
                why = f"no pooled connection within {self._timeout:g} s (pool busy)"
                raise self._error(op, key, why) from None
            except psycopg.Error as exc:
                self._check_open()
                if attempt == 1 and lost and (replayable or not committing):
                    self._recover(op, key)
                    continue
                why = _reason(exc)
                if lost and committing and not replayable:
                    why += " (connection lost during COMMIT: the write may or may not be stored)"
                raise self._error(op, key, why) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _key_lock(self, key: str) -> int:
        """A signed 64-bit advisory lock id for ``key`` in this table set."""
        digest = hashlib.blake2b(key.encode(), digest_size=8, key=self._lock_salt).digest()
        return int.from_bytes(digest, "big", signed=True)

    # -- blobs -----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        validate_key(key)

        def body(conn: psycopg.Connection[Any]) -> bytes | None:
            with conn.cursor(binary=True) as cur:
                row = cur.execute(self._q["get"], (key,)).fetchone()
            return None if row is None else bytes(row[0])

        return self._run("read", key, body)

    def put(self, key: str, data: bytes | bytearray) -> None:
        validate_key(key)
        size = memoryview(data).nbytes
        if size > MAX_VALUE:
            raise StoreError(f"PostgreSQL store: blob {key!r} is too large ({size} bytes > 1 GiB)")
        self._run("write", key, lambda conn: conn.execute(self._q["put"], (key, data)))

    def delete(self, key: str) -> None:
        validate_key(key)

        def body(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._key_lock(key),))
            conn.execute(self._q["delete_blob"], (key,))
            conn.execute(self._q["delete_log"], (key,))

        self._run("delete", key, body, transaction=True)

    def delete_prefix(self, prefix: str) -> int:
        """Remove matching blobs and logs; returns the number of blobs plus logs removed."""
        validate_prefix(prefix)

        def body(conn: psycopg.Connection[Any]) -> int:
            bounds = (prefix, prefix + _PREFIX_END)
            row = conn.execute(self._q["delete_prefix"], bounds * 2).fetchone()
            return int(row[0]) if row else 0

        return self._run("delete prefix", prefix, body)

    def list(self, prefix: str) -> builtins.list[str]:
        validate_prefix(prefix)

        def body(conn: psycopg.Connection[Any]) -> builtins.list[str]:
            bounds = (prefix, prefix + _PREFIX_END)
            return [row[0] for row in conn.execute(self._q["list"], bounds * 2)]

        return self._run("list", prefix, body)

    # -- logs ------------------------------------------------------------------------------

    def append(self, key: str, record: bytes) -> None:
        """Append with the next per-key sequence number, under a per-key advisory lock.

        Appenders to one key queue on the lock, so a record's ``seq`` is assigned and committed
        before the next appender reads ``max(seq)``: logs are gapless, their order is the
        commit order, and a reader never sees a record appear before one it has already read.
        (A global sequence would need no lock, but its numbers are taken before commit, so a
        concurrent reader could see record n+1 without record n.)
        """
        validate_key(key)
        size = memoryview(record).nbytes
        if size > MAX_VALUE:
            raise StoreError(f"PostgreSQL store: record for {key!r} is too large ({size} bytes)")

        def body(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._key_lock(key),))
            conn.execute(self._q["append"], (key, record, key))

        self._run("append to", key, body, transaction=True, replayable=False)

    def read_log(self, key: str) -> builtins.list[bytes]:
        """All records in append order (transactions leave no torn tails to drop)."""
        validate_key(key)

        def body(conn: psycopg.Connection[Any]) -> builtins.list[bytes]:
            with conn.cursor(binary=True) as cur:
                return [bytes(row[0]) for row in cur.execute(self._q["read_log"], (key,))]

        return self._run("read log", key, body)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Per new pooled connection: keep commits durable even if the server default is off."""
    row = conn.execute("SHOW synchronous_commit").fetchone()
    if row is not None and row[0] == "off":
        conn.execute("SET synchronous_commit TO on")


def _queries(blobs: sql.Identifier, log: sql.Identifier) -> dict[str, Any]:
    def q(text: str) -> sql.Composed:
        return sql.SQL(text).format(blobs=blobs, log=log)

    in_range = 'key >= %s COLLATE "C" AND key < %s COLLATE "C"'
    return {
        "schema": [
            q(
                'CREATE TABLE IF NOT EXISTS {blobs} (key text COLLATE "C" PRIMARY KEY, '
                "data bytea NOT NULL)"
            ),
            # Ciphertext does not compress: store it out of line without trying.
            q("ALTER TABLE {blobs} ALTER COLUMN data SET STORAGE EXTERNAL"),
            q(
                'CREATE TABLE IF NOT EXISTS {log} (key text COLLATE "C" NOT NULL, '
                "seq bigint NOT NULL, record bytea NOT NULL, PRIMARY KEY (key, seq))"
            ),
            q("ALTER TABLE {log} ALTER COLUMN record SET STORAGE EXTERNAL"),
        ],
        "get": q("SELECT data FROM {blobs} WHERE key = %s"),
        "put": q(
            "INSERT INTO {blobs} (key, data) VALUES (%s, %b) "
            "ON CONFLICT (key) DO UPDATE SET data = EXCLUDED.data"
        ),
        "delete_blob": q("DELETE FROM {blobs} WHERE key = %s"),
        "delete_log": q("DELETE FROM {log} WHERE key = %s"),
        "delete_prefix": q(
            f"WITH b AS (DELETE FROM {{blobs}} WHERE {in_range} RETURNING 1), "
            f"l AS (DELETE FROM {{log}} WHERE {in_range} RETURNING key) "
            "SELECT (SELECT count(*) FROM b) + (SELECT count(DISTINCT key) FROM l)"
        ),
        "list": q(
            f"SELECT key FROM (SELECT key FROM {{blobs}} WHERE {in_range} "
            f"UNION SELECT key FROM {{log}} WHERE {in_range}) AS k "
            'ORDER BY key COLLATE "C"'
        ),
        "append": q(
            "INSERT INTO {log} (key, seq, record) "
            "SELECT %s, coalesce(max(seq), 0) + 1, %b FROM {log} WHERE key = %s"
        ),
        "read_log": q("SELECT record FROM {log} WHERE key = %s ORDER BY seq"),
    }
