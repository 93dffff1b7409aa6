"""Store contract tests (run against every backend via the ``store`` fixture) plus tests of the
LocalStore on-disk specifics (atomic replace, torn log tails, corruption, file modes).

To add a backend, extend ``BACKENDS`` and ``_make_store``; ``TestStoreContract`` then runs
against it unchanged. The PostgreSQL backend gets a fresh database per test from the session's
throwaway server (tests/pg_server.py); its specifics are in test_store_postgres.py.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.storage import LocalStore, Store, StoreError, key_join, open_store, redact_url
from actors.storage.local import _frame, parse_log
from tests.helpers import run_threads

BACKENDS = ["local", "postgresql"]


def _make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if kind == "local":
        return LocalStore(tmp_path / "store")
    if kind == "postgresql":
        return open_store(request.getfixturevalue("fresh_postgres_url"))
    raise AssertionError(kind)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = _make_store(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalStore]:
    s = LocalStore(tmp_path / "store")
    yield s
    s.close()


def _records(n: int) -> list[bytes]:
    """Varying sizes including the empty record and some larger ones."""
    out = []
    for i in range(n):
        size = (i * 37) % 300 if i % 100 else 4096 + i
        out.append(b"" if i == 0 else (i.to_bytes(4, "little") * (size // 4 + 1))[:size])
    return out


BAD_KEYS = [
    "",
    "/a",
    "a/",
    "a//b",
    "..",
    "a/../b",
    ".",
    "a/./b",
    "a b",
    "a\\b",
    "a\x00b",
    "é",
    "a/b~",
    "a:b",
    "x" * 256,
]


class TestStoreContract:
    """Behaviour every Store backend must provide."""

    def test_is_store(self, store: Store) -> None:
        assert isinstance(store, Store)

    def test_put_get_overwrite_delete(self, store: Store) -> None:
        assert store.get("a/b") is None
        store.put("a/b", b"one")
        assert store.get("a/b") == b"one"
        store.put("a/b", b"two, longer")
        assert store.get("a/b") == b"two, longer"
        store.put("a/b", b"")
        assert store.get("a/b") == b""
        store.delete("a/b")
        assert store.get("a/b") is None
        store.delete("a/b")  # missing is fine
        store.delete("never/existed")

    def test_put_accepts_buffers(self, store: Store) -> None:
        store.put("k", bytearray(b"abc"))  # type: ignore[arg-type]
        store.put("m", memoryview(b"xyz"))  # type: ignore[arg-type]
        assert store.get("k") == b"abc"
        assert store.get("m") == b"xyz"

    def test_large_blob(self, store: Store) -> None:
        data = os.urandom(1 << 20) * 8
        store.put("big/blob", data)
        assert store.get("big/blob") == data

    def test_list(self, store: Store) -> None:
        for key in ["idx/meta", "idx/shard-0/vectors", "idx/shard-1/vectors", "idx2/meta", "other"]:
            store.put(key, b"x")
        store.append("idx/shard-0/wal", b"r")
        store.append("idx/meta", b"r")  # same key as a blob: listed once
        assert store.list("") == [
            "idx/meta",
            "idx/shard-0/vectors",
            "idx/shard-0/wal",
            "idx/shard-1/vectors",
            "idx2/meta",
            "other",
        ]
        assert store.list("idx/") == [
            "idx/meta",
            "idx/shard-0/vectors",
            "idx/shard-0/wal",
            "idx/shard-1/vectors",
        ]
        assert store.list("idx") == store.list("")[:5]
        assert store.list("idx/shard-") == [
            "idx/shard-0/vectors",
            "idx/shard-0/wal",
            "idx/shard-1/vectors",
        ]
        assert store.list("idx/shard-0/") == ["idx/shard-0/vectors", "idx/shard-0/wal"]
        assert store.list("idx/m") == ["idx/meta"]
        assert store.list("nope/") == []
        assert store.list("other/") == []
        assert store.list("zzz") == []

    def test_delete_prefix(self, store: Store) -> None:
        for key in ["idx/meta", "idx/shard-0/vectors", "idx2/meta", "idxx"]:
            store.put(key, b"x")
        store.append("idx/shard-0/wal", b"r")
        assert store.delete_prefix("idx/") == 3
        assert store.list("") == ["idx2/meta", "idxx"]
        assert store.read_log("idx/shard-0/wal") == []
        assert store.delete_prefix("idx/") == 0
        assert store.delete_prefix("idx") == 2
        assert store.list("") == []

    def test_delete_removes_blob_and_log(self, store: Store) -> None:
        store.put("k", b"blob")
        store.append("k", b"rec")
        store.delete("k")
        assert store.get("k") is None
        assert store.read_log("k") == []
        assert store.list("") == []

    def test_delete_then_append_starts_fresh_log(self, store: Store) -> None:
        store.append("log", b"old")
        store.delete("log")
        store.append("log", b"new")
        assert store.read_log("log") == [b"new"]

    def test_blob_and_log_namespaces_are_separate(self, store: Store) -> None:
        store.put("k", b"blob")
        store.append("k", b"rec")
        assert store.get("k") == b"blob"
        assert store.read_log("k") == [b"rec"]

    def test_append_read_log_order(self, store: Store) -> None:
        records = _records(1000)
        assert b"" in records
        assert store.read_log("idx/wal") == []
        for record in records:
            store.append("idx/wal", record)
        assert store.read_log("idx/wal") == records

    def test_append_accepts_buffers(self, store: Store) -> None:
        store.append("log", bytearray(b"a"))  # type: ignore[arg-type]
        store.append("log", memoryview(b"b"))  # type: ignore[arg-type]
        assert store.read_log("log") == [b"a", b"b"]

    def test_concurrent_appends_one_log(self, store: Store) -> None:
        threads, per_thread = 8, 150
        barrier = threading.Barrier(threads)

        def worker(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                store.append("shared/log", f"{t}:{i}:".encode() + bytes([t]) * (i % 50))

        run_threads(worker, threads)
        got = store.read_log("shared/log")
        assert len(got) == threads * per_thread
        seen: dict[int, list[int]] = {t: [] for t in range(threads)}
        for record in got:
            raw_t, raw_i, pad = record.split(b":", 2)
            assert pad == bytes([int(raw_t)]) * (int(raw_i) % 50)  # intact
            seen[int(raw_t)].append(int(raw_i))
        for t in range(threads):
            assert seen[t] == list(range(per_thread))  # per-thread order kept

    def test_concurrent_appends_many_logs(self, store: Store) -> None:
        def worker(t: int) -> None:
            for i in range(50):
                store.append(f"logs/{t % 4}", f"{t}:{i}".encode())

        run_threads(worker, 8)
        total = sum(len(store.read_log(f"logs/{n}")) for n in range(4))
        assert total == 8 * 50

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_bad_keys_rejected(self, store: Store, key: str) -> None:
        with pytest.raises(ValueError, match="invalid store key"):
            store.get(key)
        with pytest.raises(ValueError):
            store.put(key, b"x")
        with pytest.raises(ValueError):
            store.delete(key)
        with pytest.raises(ValueError):
            store.append(key, b"x")
        with pytest.raises(ValueError):
            store.read_log(key)

    def test_non_string_key_rejected(self, store: Store) -> None:
        with pytest.raises(ValueError):
            store.get(b"a")  # type: ignore[arg-type]

    @pytest.mark.parametrize("prefix", ["/a", "a//", "../", "a/../", "a b", "a/b c", "./x"])
    def test_bad_prefixes_rejected(self, store: Store, prefix: str) -> None:
        with pytest.raises(ValueError, match="invalid store prefix"):
            store.list(prefix)
        with pytest.raises(ValueError):
            store.delete_prefix(prefix)

    @pytest.mark.parametrize(
        "key", ["a", "A-1_z.b", "a/b/c/d", "..x", "x..", "a/.hidden", "x" * 255]
    )
    def test_good_keys(self, store: Store, key: str) -> None:
        store.put(key, b"v")
        store.append(key, b"r")
        assert store.get(key) == b"v"
        assert store.read_log(key) == [b"r"]
        assert store.list("") == [key]


# -- key helpers and URLs ----------------------------------------------------------------------


def test_key_join() -> None:
    assert key_join("idx", "shard-0", "wal") == "idx/shard-0/wal"
    assert key_join("idx/shard-0", "wal") == "idx/shard-0/wal"
    for parts in [("idx", ""), ("idx", ".."), ("a b",), ("idx", "/x")]:
        with pytest.raises(ValueError):
            key_join(*parts)


def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cases = {
        f"file://{tmp_path}/abs": tmp_path / "abs",
        "file://./rel1": Path("rel1"),
        "file://rel2": Path("rel2"),
        "rel3/sub": Path("rel3/sub"),
        f"{tmp_path}/plain": tmp_path / "plain",
        "FILE://./rel4": Path("rel4"),
        f"file://{tmp_path}/with%20space": tmp_path / "with space",
    }
    for url, path in cases.items():
        s = open_store(url)
        try:
            assert isinstance(s, LocalStore)
            assert s.root == path
            assert (tmp_path / path / "blobs").is_dir()
            s.put("k", b"v")
            assert s.get("k") == b"v"
        finally:
            s.close()


def test_open_store_postgres_without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "actors.storage.postgres", None)  # as if psycopg were missing
    for url in ["postgresql://u:secretpw@db/vaultvec", "postgres://db/x"]:
        with pytest.raises(StoreError, match=r'pip install "vaultvec\[postgres\]"') as info:
            open_store(url)
        assert "secretpw" not in str(info.value)


def test_open_store_postgres(fresh_postgres_url: str) -> None:
    from actors.storage.postgres import PostgresStore

    rest = fresh_postgres_url.split("://", 1)[1]
    for url in [fresh_postgres_url, f"postgres://{rest}", f"postgresql+psycopg://{rest}"]:
        s = open_store(url)
        try:
            assert isinstance(s, PostgresStore)
            s.put("k", b"v")
            assert s.get("k") == b"v"
        finally:
            s.close()


@pytest.mark.parametrize("url", ["s3://bucket/x", "http://x", "", "   ", "file://"])
def test_open_store_bad_urls(url: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    if "://" in url and url != "file://":
        assert "file://" in str(info.value)
        assert "postgresql://" in str(info.value)


# -- LocalStore specifics ----------------------------------------------------------------------


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


class TestLocalStore:
    def test_failed_replace_keeps_old_value(
        self, local: LocalStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        local.put("a/b", b"old")

        def boom(src: object, dst: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "replace", boom)
        with pytest.raises(StoreError, match="a/b"):
            local.put("a/b", b"new" * 1000)
        monkeypatch.undo()
        assert local.get("a/b") == b"old"
        assert [p.name for p in _files(local.root / "blobs")] == ["b"]  # no temp file lingers

    def test_failed_fsync_keeps_old_value(
        self, local: LocalStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        local.put("k", b"old")

        def boom(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fsync", boom)
        with pytest.raises(StoreError):
            local.put("k", b"new")
        monkeypatch.undo()
        assert local.get("k") == b"old"
        assert [p.name for p in _files(local.root / "blobs")] == ["k"]

    def test_no_temp_files_after_puts(self, local: LocalStore) -> None:
        for i in range(20):
            local.put("x/y", str(i).encode())
        assert [p.name for p in _files(local.root)] == ["y"]

    def test_stray_temp_files_not_listed(self, local: LocalStore) -> None:
        local.put("a/b", b"x")
        (local.root / "blobs" / "a" / ".~tmp-deadbeef").write_bytes(b"partial")
        assert local.list("") == ["a/b"]

    def test_file_and_dir_modes(self, local: LocalStore) -> None:
        old = os.umask(0)
        try:
            local.put("idx/shard-0/blob", b"x")
            local.append("idx/shard-0/wal", b"r")
        finally:
            os.umask(old)
        root = local.root
        for d in [
            root,
            root / "blobs",
            root / "logs",
            root / "blobs" / "idx",
            root / "logs" / "idx" / "shard-0",
        ]:
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        for f in [
            root / "blobs" / "idx" / "shard-0" / "blob",
            root / "logs" / "idx" / "shard-0" / "wal",
        ]:
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f

    def test_delete_prefix_removes_empty_dirs(self, local: LocalStore) -> None:
        local.put("idx/shard-0/a", b"x")
        local.append("idx/shard-1/wal", b"r")
        local.put("keep/me", b"x")
        local.delete_prefix("idx/")
        assert not (local.root / "blobs" / "idx").exists()
        assert not (local.root / "logs" / "idx").exists()
        assert (local.root / "blobs" / "keep" / "me").exists()
        local.delete("keep/me")
        assert list((local.root / "blobs").iterdir()) == []

    def test_key_as_both_blob_and_prefix_is_clear_error(self, local: LocalStore) -> None:
        local.put("a/b", b"x")
        with pytest.raises(StoreError, match="prefix directory"):
            local.put("a", b"y")
        local.put("c", b"x")
        with pytest.raises(StoreError, match="prefix directory"):
            local.put("c/d", b"y")
        assert local.get("a") is None
        assert local.get("c/d") is None
        assert local.list("c/") == []

    def test_torn_tail_is_dropped_at_every_cut(self, local: LocalStore) -> None:
        records = [b"first", b"", b"third record", b"x" * 100]
        for r in records:
            local.append("wal", r)
        path = local.root / "logs" / "wal"
        full = path.read_bytes()
        local.close()
        ends, off = [0], 0
        for r in records:
            off += 12 + len(r)
            ends.append(off)
        for cut in range(len(full) + 1):
            path.write_bytes(full[:cut])
            s = LocalStore(local.root)
            complete = max(i for i, e in enumerate(ends) if e <= cut)
            assert s.read_log("wal") == records[:complete], cut
            s.close()

    def test_append_after_torn_tail_truncates_it(self, local: LocalStore) -> None:
        for r in [b"a", b"b", b"c"]:
            local.append("wal", r)
        local.close()
        path = local.root / "logs" / "wal"
        path.write_bytes(path.read_bytes()[:-1])  # crash mid-append of "c"
        s = LocalStore(local.root)
        assert s.read_log("wal") == [b"a", b"b"]
        s.append("wal", b"d")
        assert s.read_log("wal") == [b"a", b"b", b"d"]
        s.close()

    def test_zero_filled_tail_is_dropped(self, local: LocalStore) -> None:
        local.append("wal", b"a")
        local.append("wal", b"b")
        local.close()
        path = local.root / "logs" / "wal"
        with open(path, "ab") as f:
            f.write(b"\0" * 4096)
        s = LocalStore(local.root)
        assert s.read_log("wal") == [b"a", b"b"]
        s.append("wal", b"c")
        assert s.read_log("wal") == [b"a", b"b", b"c"]
        s.close()

    def test_bad_checksum_on_last_record_is_torn(self, local: LocalStore) -> None:
        local.append("wal", b"a")
        local.append("wal", b"bbbb")
        path = local.root / "logs" / "wal"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        assert local.read_log("wal") == [b"a"]

    @pytest.mark.parametrize("where", ["body", "length", "crc", "header_crc"])
    def test_corrupt_middle_record_raises(self, local: LocalStore, where: str) -> None:
        for r in [b"first record", b"second record", b"third record"]:
            local.append("wal", r)
        local.close()
        path = local.root / "logs" / "wal"
        data = bytearray(path.read_bytes())
        second = 12 + len(b"first record")
        index = {
            "body": second + 12 + 3,
            "length": second + 1,
            "crc": second + 5,
            "header_crc": second + 9,
        }
        data[index[where]] ^= 0x40
        path.write_bytes(bytes(data))
        s = LocalStore(local.root)
        with pytest.raises(StoreError, match="corrupt"):
            s.read_log("wal")
        with pytest.raises(StoreError, match="corrupt"):
            s.append("wal", b"more")  # never append behind damage
        s.close()
        assert path.read_bytes() == bytes(data)  # left untouched for inspection

    def test_handle_eviction_keeps_all_records(self, tmp_path: Path) -> None:
        s = LocalStore(tmp_path / "s", max_open_logs=2)
        for i in range(30):
            s.append(f"log-{i % 5}", str(i).encode())
        for n in range(5):
            assert s.read_log(f"log-{n}") == [str(i).encode() for i in range(n, 30, 5)]
        assert len(s._handles) <= 2
        s.close()

    def test_closed_store_refuses(self, local: LocalStore) -> None:
        local.append("wal", b"a")
        local.close()
        with pytest.raises(StoreError, match="closed"):
            local.append("wal", b"b")
        with pytest.raises(StoreError, match="closed"):
            local.get("x")
        local.close()  # idempotent

    def test_reopen_sees_data(self, local: LocalStore) -> None:
        local.put("k", b"v")
        local.append("wal", b"r")
        local.close()
        with LocalStore(local.root) as s:
            assert s.get("k") == b"v"
            assert s.read_log("wal") == [b"r"]
            s.append("wal", b"r2")
            assert s.read_log("wal") == [b"r", b"r2"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=8), st.data())
def test_parse_log_any_truncation_yields_prefix(records: list[bytes], data: st.DataObject) -> None:
    blob = b"".join(_frame(r) for r in records)
    assert parse_log(blob, "k") == (records, len(blob))
    cut = data.draw(st.integers(0, len(blob)))
    got, end = parse_log(blob[:cut], "k")
    assert got == records[: len(got)]
    assert end == sum(12 + len(r) for r in got)
    assert cut - end < 12 + max((len(r) for r in records), default=0)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://vv:s3cr%40t@db:5432/vaultvec", "postgresql://vv:***@db:5432/vaultvec"),
        (
            "postgresql://db/vaultvec?password=s3cret&sslmode=require",
            "postgresql://db/vaultvec?password=%2A%2A%2A&sslmode=require",
        ),
        ("postgresql://vv@db/vaultvec", "postgresql://vv@db/vaultvec"),
        ("file:///data/vaultvec", "file:///data/vaultvec"),
    ],
)
def test_redact_url_hides_passwords(url: str, shown: str) -> None:
    assert redact_url(url) == shown
