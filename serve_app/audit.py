"""The audit log: one JSON line per request to the API, written off the request path.

Each line: ``time`` (UTC, ISO 8601), ``key`` (the API key's name, serve_app.access.keys; null when the
request had no valid key), ``index`` (the index it unlocked, if any), ``method``, ``route``,
``status``, ``items`` (items upserted, queries, ids asked for or answered), ``duration_ms`` and
``client`` (the client's address: the last X-Forwarded-For entry HAProxy added when the request
came through it). Never ids, vectors, metadata, contents or keys: nothing the record holds is
read from the request's body but the index name and a count.

Recorded: every request but the unauthenticated ones that read nothing (GET /v1/health, the
docs), refused ones included (a 401 is worth knowing), and the Ray transport's calls (route
``ray:<method>``, client ``ray``). Where (``VAULTVEC_AUDIT_LOG``): a file, rotated by size and
shared by the gateway replicas of a node under a lock file, or standard output, or off.

A record is handed to a queue and written by a thread of its own: a slow or failing disk never
delays or fails a request. When the queue is full (or a write fails), records are dropped and
counted (``vaultvec_audit_dropped_total``), and a warning is logged at most once a minute.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Collection, Iterator
from datetime import datetime, timezone
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app import constants
from serve_app.access import context
from serve_app.access.context import RequestContext
from serve_app.telemetry import REGISTRY, StatusSend, track

log = logging.getLogger("vaultvec.audit")


class AuditLog:
    """Writes records as JSON lines to ``target`` (a path or ``stdout``) from a daemon thread."""

    def __init__(self, target: str, max_bytes: int = 100 << 20, backups: int = 5) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(constants.AUDIT_QUEUE_SIZE)
        self.dropped = 0
        self._warned = 0.0
        self._thread = threading.Thread(target=self._run, name="vaultvec-audit", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        """Queue ``record``; never blocks (a full queue drops it, counted)."""
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self._lost(1, "the audit log's queue is full")

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued record was written (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _lost(self, n: int, why: str) -> None:
        self.dropped += n
        DROPPED.inc((), n)
        now = time.monotonic()
        if now - self._warned > constants.AUDIT_WARN_EVERY_S:
            self._warned = now
            log.warning("audit log: %d record(s) dropped: %s", n, why)

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < constants.AUDIT_BATCH:
                    batch.append(self.queue.get_nowait())
            try:
                self._append(b"".join(orjson.dumps(r) + b"\n" for r in batch))
            except Exception as exc:  # a full disk, a permission: the requests go on
                self._lost(len(batch), f"{type(exc).__name__}: {exc}")
            finally:
                for _ in batch:
                    self.queue.task_done()

    def _append(self, data: bytes) -> None:
        if self.target == "stdout":
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return
        directory = os.path.dirname(os.path.abspath(self.target))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with _locked(self.target + ".lock"):
            try:
                size = os.stat(self.target).st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.max_bytes:
                self._rotate()
            fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                left = memoryview(data)
                while left:  # a write may take less than it was given
                    left = left[os.write(fd, left) :]
            finally:
                os.close(fd)

    def _rotate(self) -> None:
        """audit.jsonl -> .1 -> .2 ... (the oldest beyond ``backups`` removed)."""
        if self.backups == 0:
            os.remove(self.target)
            return
        for n in range(self.backups - 1, 0, -1):
            older = f"{self.target}.{n}"
            if os.path.exists(older):
                os.replace(older, f"{self.target}.{n + 1}")
        os.replace(self.target, f"{self.target}.1")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock shared by every process writing the same log (the node's replicas)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


_LOG: AuditLog | None = None


def configure(target: str | None, max_bytes: int, backups: int) -> AuditLog | None:
    """This process's audit log (one per gateway replica process), or none when ``target`` is
    None (off)."""
    global _LOG
    _LOG = None if target is None else AuditLog(target, max_bytes, backups)
    return _LOG


def current_log() -> AuditLog | None:
    return _LOG


# -- metrics (this replica's registry: serve_app.telemetry) ---------------------------------------
KEY_REQUESTS = REGISTRY.counter(
    "vaultvec_key_requests_total",
    "requests by API key name (none: no valid key) and status",
    ("key", "status"),
)
DROPPED = REGISTRY.counter(
    "vaultvec_audit_dropped_total", "audit records dropped (queue full or a failed write)", ()
)
NO_KEY = "none"


def record(ctx: RequestContext, method: str, route: str, status: int, seconds: float) -> None:
    KEY_REQUESTS.inc((ctx.key or NO_KEY, str(status)))
    if _LOG is None:
        return
    _LOG.write(
        {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "key": ctx.key,
            "index": ctx.index,
            "method": method,
            "route": route,
            "status": status,
            "items": ctx.items,
            "duration_ms": round(seconds * 1000.0, 3),
            "client": ctx.client,
        }
    )


def client_address(scope: Scope) -> str:
    """The request's client: the TCP peer, or, when that is this machine (HAProxy, which adds
    the header with ``option forwardfor``: cluster/haproxy_guard.py), the last address of
    X-Forwarded-For."""
    peer = scope.get("client")
    host = peer[0] if peer else ""
    if host in ("127.0.0.1", "::1", "") or host.startswith("::ffff:127."):
        forwarded = None
        for name, value in scope.get("headers", ()):
            if name == b"x-forwarded-for":
                forwarded = value
        if forwarded:
            return forwarded.decode("latin-1").rsplit(",", 1)[-1].strip()[:64]
    return host


class Audit:
    """Pure ASGI middleware, outermost: opens the request's context, and records the request
    when it ends (not ``unaudited`` paths: the health check, the docs)."""

    def __init__(self, app: ASGIApp, unaudited: Collection[str], routes: Collection[str]) -> None:
        self.app = app
        self.unaudited = frozenset(unaudited)
        self.unaudited_prefixes = tuple(p for p in unaudited if p.endswith("/"))
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or path in self.unaudited
            or path.startswith(self.unaudited_prefixes)
        ):
            await self.app(scope, receive, send)
            return
        ctx = RequestContext(client_address(scope))
        token = context.open_(ctx)
        start = time.perf_counter()
        sender = StatusSend(send)
        try:
            await self.app(scope, receive, sender)
        finally:
            context.close(token)
            route = path if path in self.routes else "other"
            record(ctx, scope["method"], route, sender.status, time.perf_counter() - start)


@contextlib.asynccontextmanager
async def call(route: str) -> AsyncIterator[None]:
    """``async with call("ray:query_arrays"):`` a call of the Ray transport (no HTTP, no API
    key: its callers joined the Ray cluster), audited and counted as a request of that route."""
    ctx = RequestContext("ray")
    token = context.open_(ctx)
    start = time.perf_counter()
    status = 200
    try:
        async with track(route):
            yield
    except BaseException as exc:
        status = getattr(exc, "status_code", 500)
        raise
    finally:
        context.close(token)
        record(ctx, "CALL", route, status, time.perf_counter() - start)
