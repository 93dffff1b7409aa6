"""One shard's part of a backup, in-process: sealed chunks that restore into another index's
shard bit for bit, in order only, once (a repeated last chunk answers as the first time), not
at all when the store refuses the snapshot (and then again), never from a state whose bounds
are wrong; and the backup file's framing refuses a file cut short."""

from __future__ import annotations

import io
from pathlib import Path
from unittest import mock

import numpy as np
import orjson
import pytest

from actors import constants
from actors.engine.items import ItemTable
from actors.engine.shard import Shard
from actors.engine.shard_backup import check_frame, chunk_aad
from actors.errors import InvalidRequest
from actors.storage import LocalStore, StoreError, codec
from actors.storage.backup_format import END, HEADER, MAGIC, BadBackup, frame, read_frames
from actors.storage.crypto import seal
from actors.types import BackupSource, UpsertBatch

OLD, NEW = bytes(range(32)), bytes(range(1, 33))


def filled(tmp_path: Path) -> Shard:
    s = Shard(LocalStore(tmp_path / "a"), "src", "ida", 0)
    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    ids = [f"i{j}" for j in range(500)]
    meta = [orjson.dumps({"j": j}) for j in range(500)]
    s.upsert(OLD, UpsertBatch(ids, x, None, meta, [f"c{j}" for j in range(500)]))
    return s


def everything(s: Shard, key: bytes) -> tuple:
    ids = sorted(s.list_ids(key))
    got = s.get(key, ids, vectors=True, metadata=True, contents=True)
    assert got.vectors is not None
    return ids, got.vectors.tobytes(), got.metadata, got.contents


def chunks(s: Shard, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bytes]]:
    monkeypatch.setattr(constants, "BACKUP_CHUNK_BYTES", 4096)
    return list(s.backup(OLD, "b" * 32))


def test_a_part_restores_in_order_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = filled(tmp_path)
    parts = chunks(src, monkeypatch)
    total = parts[0][0]
    assert total > 3 and all(p[0] == total for p in parts)
    source = BackupSource("src", "b" * 32, OLD)
    dst = Shard(LocalStore(tmp_path / "b"), "dst", "idb", 0)
    with pytest.raises(InvalidRequest, match="before chunk 0"):
        dst.restore_chunk(NEW, source, 1, total, parts[1][2])
    assert dst.restore_chunk(NEW, source, 0, total, parts[0][2]) is None
    with pytest.raises(InvalidRequest, match="in order"):
        dst.restore_chunk(NEW, source, 2, total, parts[2][2])
    with pytest.raises(InvalidRequest, match="does not open"):  # another shard's place
        dst.restore_chunk(NEW, BackupSource("src", "c" * 32, OLD), 1, total, parts[1][2])
    for n in range(1, total):
        done = dst.restore_chunk(NEW, source, n, total, parts[n][2])
    assert done == 500
    assert dst.restore_chunk(NEW, source, total - 1, total, parts[-1][2]) == 500  # again: done
    assert everything(Shard(LocalStore(tmp_path / "b"), "dst", "idb", 0), NEW) == everything(
        src, OLD
    )


def test_a_part_the_store_refuses_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = chunks(filled(tmp_path), monkeypatch)
    total, source = parts[0][0], BackupSource("src", "b" * 32, OLD)
    dst = Shard(LocalStore(tmp_path / "b"), "dst", "idb", 0)
    for n in range(total - 1):
        dst.restore_chunk(NEW, source, n, total, parts[n][2])
    refusing = mock.patch.object(dst.store, "put", side_effect=StoreError("disk full"))
    with refusing, pytest.raises(StoreError):
        dst.restore_chunk(NEW, source, total - 1, total, parts[-1][2])
    assert dst.list_ids(NEW) == [] and dst.restored is None
    for n in range(total):  # sent again from chunk 0
        done = dst.restore_chunk(NEW, source, n, total, parts[n][2])
    assert done == 500


def test_a_restore_spools_sealed_chunks_and_checks_the_state_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks received wait, sealed as they came, in a file without a name in the shard's
    vector directory (a part larger than memory is never held whole), and the state they hold
    is checked for its bounds as it is read back."""
    parts = chunks(filled(tmp_path), monkeypatch)
    total, source = parts[0][0], BackupSource("src", "b" * 32, OLD)
    spools = tmp_path / "spool"
    spools.mkdir()
    dst = Shard(LocalStore(tmp_path / "b"), "dst", "idb", 0, vector_dir=str(spools))
    for n in range(total - 1):
        dst.restore_chunk(NEW, source, n, total, parts[n][2])
    incoming = dst._incoming
    assert incoming is not None and list(spools.iterdir()) == []
    incoming.spool.seek(0)
    assert incoming.spool.read() == b"".join(p[2] for p in parts[:-1])
    # A whole state sealed as a backup's chunk, empty but for labels allocated far past its
    # items (which, unchecked, would install).
    spare = constants.RESTORE_SPARE_LABELS + 1
    bad = codec.pack({"seq": 0, "version": 0, "next_label": spare}, ItemTable().to_arrays())
    sealed = seal(OLD, bad, chunk_aad("src", 0, "e" * 32, 0, 1))
    with pytest.raises(InvalidRequest, match="not a shard's state"):
        dst.restore_chunk(NEW, BackupSource("src", "e" * 32, OLD), 0, 1, sealed)
    assert dst.list_ids(NEW) == [] and dst._incoming is None


def test_a_state_out_of_bounds_is_refused() -> None:
    arrays = {
        "labels": np.arange(3, dtype=np.int64),
        **{k: np.zeros(3) for k in ("ids_len", "meta_len", "contents_len", "norms")},
        "index": np.zeros(1, np.uint8),
    }
    check_frame({"next_label": 3}, arrays, 0)
    for meta, change in (
        ({"next_label": 2_000_000_000}, {}),  # would allocate per label far past the items
        ({"next_label": 2}, {}),  # a label at or past next_label
        ({"next_label": 3}, {"norms": np.zeros(2)}),  # arrays that disagree
        ({"next_label": 3}, {"labels": np.array([-1, 0, 1])}),
    ):
        with pytest.raises(InvalidRequest, match="not a shard's state"):
            check_frame(meta, {**arrays, **change}, 0)
    meta, unpacked = codec.unpack(codec.pack({"next_label": 3}, arrays))
    check_frame(meta, unpacked, 0)


def test_the_framing_refuses_what_is_not_a_whole_backup() -> None:
    whole = MAGIC + frame(HEADER, b"{}") + frame(END, b"{}")
    assert [k for k, _ in read_frames(io.BytesIO(whole))] == [HEADER, END]
    for data, words in (
        (b"not a backup", "magic"),
        (whole[:-1], "cut short"),
        (MAGIC + frame(HEADER, b"{}"), "cut short"),
        (MAGIC + b"Z" + bytes(8), "unknown frame"),
    ):
        with pytest.raises(BadBackup, match=words):
            list(read_frames(io.BytesIO(data)))
