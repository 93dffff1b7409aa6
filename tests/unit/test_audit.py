"""The audit log (serve_app/audit.py): one JSON line per request, written off the request path,
rotated by size, shared by several processes, and never failing or stalling a request."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import stat
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from actors.errors import IndexNotFound
from serve_app import audit, replica
from serve_app.access import context
from serve_app.app import create_app
from serve_app.settings import Settings


def record(n: int) -> dict[str, Any]:
    return {"key": "alice", "route": "/v1/vectors/query", "status": 200, "n": n}


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_records_land_as_json_lines_in_a_private_file(tmp_path: Path) -> None:
    target = tmp_path / "audit" / "audit.jsonl"
    log = audit.AuditLog(str(target))
    for n in range(100):
        log.write(record(n))
    log.flush()
    assert [r["n"] for r in lines(target)] == list(range(100))
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700


def test_a_short_write_loses_no_part_of_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "audit.jsonl"
    real_write = os.write
    monkeypatch.setattr(audit.os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    log = audit.AuditLog(str(target))
    for n in range(20):
        log.write(record(n))
    log.flush()
    assert [r["n"] for r in lines(target)] == list(range(20))


def test_the_file_is_rotated_by_size_keeping_the_backups_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "audit.jsonl"
    log = audit.AuditLog(str(target), max_bytes=2_000, backups=2)
    for n in range(300):  # ~75 bytes a line: several rotations
        log.write(record(n))
        if n % 25 == 0:
            log.flush()
    log.flush()
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    kept = [
        r["n"]
        for p in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")
        for r in lines(tmp_path / p)
    ]
    assert kept == list(range(kept[0], 300))  # the newest, in order, nothing torn
    assert all((tmp_path / name).stat().st_size <= 2_000 for name in files)


def _write_many(target: str, who: int, n: int) -> None:
    log = audit.AuditLog(target, max_bytes=20_000, backups=50)
    for i in range(n):
        log.write({"who": who, "i": i, "pad": "x" * 40})
    log.flush(30)


def test_processes_sharing_the_file_lose_and_tear_nothing(tmp_path: Path) -> None:
    """The gateway replicas of a node write one file: whole lines, none lost, across rotations."""
    target = str(tmp_path / "audit.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(target, who, 2_000)) for who in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for path in sorted(tmp_path.glob("audit.jsonl*")):
        if not path.name.endswith(".lock"):
            for r in lines(path):
                got[r["who"]].append(r["i"])
    assert {who: sorted(i) for who, i in got.items()} == {w: list(range(2_000)) for w in got}


def test_a_failing_disk_neither_fails_nor_stalls_a_request(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the log's directory should be")
    log = audit.AuditLog(str(blocked / "audit.jsonl"))
    t0 = time.perf_counter()
    for n in range(1000):
        log.write(record(n))  # never raises
    assert time.perf_counter() - t0 < 1.0
    log.flush()
    assert log.dropped == 1000


def test_a_full_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = audit.AuditLog.__new__(audit.AuditLog)  # no writer thread: the queue only fills
    log.queue = audit.queue.Queue(3)
    log.dropped, log._warned = 0, 0.0
    for n in range(5):
        log.write(record(n))
    assert (log.queue.qsize(), log.dropped) == (3, 2)


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("10.0.0.7", None, "10.0.0.7"),
        ("10.0.0.7", b"6.6.6.6", "10.0.0.7"),  # a client's own header is not believed
        ("127.0.0.1", b"203.0.113.9", "203.0.113.9"),  # through HAProxy on this machine
        ("127.0.0.1", b"6.6.6.6, 203.0.113.9", "203.0.113.9"),  # HAProxy's is the last
        ("127.0.0.1", None, "127.0.0.1"),
    ],
)
def test_the_client_address(peer: str, forwarded: bytes | None, client: str) -> None:
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded)]
    assert audit.client_address({"client": (peer, 1234), "headers": headers}) == client


class NoIndexes:
    """An engine that holds no index (as the real one, it notes the index a request names)."""

    async def view(self, name: str, key: str) -> Any:
        context.note(index=name)
        raise IndexNotFound(f"index {name!r} not found")


def test_the_app_records_each_request_once_with_no_secret(tmp_path: Path) -> None:
    """Through the real app: the key's name, the route, the status, the index named in the
    body — never the API key or the body's contents."""
    target = tmp_path / "audit.jsonl"
    log = audit.configure(str(target), 1 << 20, 1)
    try:
        with replica.configured(Settings(api_key=["alice:top-secret-key"]), NoIndexes()):
            app = create_app()
            body = orjson.dumps(
                {"index_name": "notes", "index_key": "ab" * 32, "ids": ["patient-1"]}
            )
            _call(app, "POST", "/v1/vectors/get", {"x-api-key": "top-secret-key"}, body)
            _call(app, "POST", "/v1/vectors/get", {"x-api-key": "wrong"}, body)
            _call(app, "GET", "/v1/health", {}, b"")
            assert log is not None
            log.flush()
    finally:
        audit.configure(None, 0, 0)
    got = lines(target)
    assert [(r["key"], r["route"], r["method"]) for r in got] == [
        ("alice", "/v1/vectors/get", "POST"),
        (None, "/v1/vectors/get", "POST"),
    ]  # the health check is not recorded
    assert (got[0]["status"], got[0]["index"], got[0]["items"]) == (404, "notes", 1)
    assert got[1]["status"] == 401 and got[0]["client"] == "127.0.0.1"
    assert set(got[0]) == {
        "time", "key", "index", "method", "route", "status", "items", "duration_ms", "client"
    }  # fmt: skip
    text = target.read_text()
    for secret in ("top-secret-key", "ab" * 32, "patient-1", "wrong"):
        assert secret not in text
    assert context.current() is None


def _call(app: Any, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80),
        "headers": [(b"content-type", b"application/json"),
                    *((k.encode(), v.encode()) for k, v in headers.items())],
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def test_nothing_is_recorded_when_off(tmp_path: Path) -> None:
    assert Settings(audit_log="off").audit_target() is None
    assert Settings(storage=f"file://{tmp_path}").audit_target() == str(
        tmp_path / "audit" / "audit.jsonl"
    )
    assert Settings(storage="postgresql://x/y").audit_target() == "stdout"
    assert not os.path.exists(tmp_path / "audit")
