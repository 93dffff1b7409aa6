"""The autovacuum settings of the PostgreSQL store's tables (actors.storage.postgres).

A shard's snapshot replaces gigabytes of chunks at a time, and PostgreSQL's default, throttled
autovacuum fell so far behind that a 10M × 128 ingest had taken 48 GB of disk by its 7.5
millionth item (docs/performance.md). So both tables and their TOAST tables are vacuumed
without the cost delay and at 2% dead rows: set when the tables are made, and on open where a
setting is missing and this user may set it.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

VACUUM_TUNING = {
    "autovacuum_vacuum_cost_delay": "0",
    "autovacuum_vacuum_scale_factor": "0.02",
    "toast.autovacuum_vacuum_cost_delay": "0",
    "toast.autovacuum_vacuum_scale_factor": "0.02",
}
log = logging.getLogger("vaultvec.store")


def tune_vacuum(conn: psycopg.Connection[Any], table: str) -> None:
    """:data:`VACUUM_TUNING` on ``table`` where it is missing; a user who may not alter the
    table (it belongs to another role) is told so in the log, and goes on without it."""
    row = conn.execute(
        "SELECT c.reloptions, t.reloptions FROM pg_class c "
        "LEFT JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.oid = to_regclass(%s)",
        (table,),
    ).fetchone()
    have = set() if row is None else {*(row[0] or ()), *(f"toast.{o}" for o in row[1] or ())}
    missing = {
        k: v for k, v in VACUUM_TUNING.items() if not any(h.startswith(f"{k}=") for h in have)
    }
    if not missing:  # (an owner's own values stay)
        return
    options = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(v)) for k, v in missing.items()
    )
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the rest standing
            conn.execute("SET LOCAL lock_timeout = '2s'")  # never behind a long vacuum
            conn.execute(sql.SQL("ALTER TABLE {} SET ({})").format(sql.Identifier(table), options))
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.LockNotAvailable) as exc:
        log.warning(
            "PostgreSQL store: cannot tune the autovacuum of %s (%s): ask its owner to run "
            "ALTER TABLE %s SET (%s), or its disk may fill with dead snapshot chunks",
            table,
            "not its owner" if isinstance(exc, psycopg.errors.InsufficientPrivilege) else "busy",
            table,
            ", ".join(f"{k} = {v}" for k, v in missing.items()),
        )
