"""Compressed partitions (ivf, ivfpq) keep their items' full vectors sealed on local disk and
rerank the codes' candidates with them: the file (unnamed, owner-only, sealed per record and
bound to its label), recall against the codes alone, and the full vectors surviving every path
a shard's state takes (WAL replay, snapshot, retraining, compaction, updates)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import orjson
import pytest
from cryptography.exceptions import InvalidTag

from actors import constants
from actors.control.training import TrainParams, train_template
from actors.engine import compaction, updates
from actors.engine.filters import parse_filter
from actors.engine.fullvectors import FullVectors, rerank
from actors.engine.ivf import serialize
from actors.engine.shard import Shard
from actors.storage import codec
from actors.types import BackupSource, SearchRequest, UpsertBatch
from tests.helpers import clustered, exact_knn

KEY = bytes(range(32))
D = 32


def batch(x: np.ndarray, start: int) -> UpsertBatch:
    ids = tuple(f"id{start + i}" for i in range(len(x)))
    meta = tuple(orjson.dumps({"n": start + i}) for i in range(len(x)))
    return UpsertBatch(ids, x, None, meta, tuple(None for _ in ids))


def request(shard: Shard, q: np.ndarray, k: int = 10, nprobe: int = 0, mult: int = 0):
    """Every list probed unless ``nprobe`` says fewer: what is left to lose is the codes'."""
    assert shard.partition is not None
    coarse, lists = shard.partition.index.quantizer.search(q, nprobe or shard.partition.nlist)
    return SearchRequest(q, k, shard.version, lists, coarse, rerank_mult=mult)


def recall(found: list[list[str]], truth: np.ndarray) -> float:
    hits = sum(len(set(row) & {f"id{j}" for j in t}) for row, t in zip(found, truth, strict=True))
    return hits / truth.size


def pq_shard(path: Path, x: np.ndarray, n_lists: int = 16) -> Shard:
    shard = Shard(f"file://{path}", "idx", "id0", 0)
    shard.upsert(KEY, batch(x, 0))
    template = train_template(x, "ivfpq", n_lists, 8, 8, TrainParams(max_iters=10))
    shard.rebuild(KEY, 1, serialize(template))
    return shard


# -- the file ------------------------------------------------------------------------------
def test_records_open_only_at_their_label_and_the_file_has_no_name(tmp_path: Path) -> None:
    fv = FullVectors(D, str(tmp_path))
    x = np.random.default_rng(0).standard_normal((100, D)).astype(np.float32)
    fv.put(np.arange(100), x)
    np.testing.assert_array_equal(fv.get(np.array([7, 3, 99])), x[[7, 3, 99]])
    np.testing.assert_array_equal(fv.range(10, 20), x[10:20])
    assert os.listdir(tmp_path) == []  # O_TMPFILE (or unlinked at once): nothing to open
    info = os.fstat(fv._fd)
    assert stat.S_IMODE(info.st_mode) & 0o077 == 0 and info.st_size == 100 * fv.record
    raw = os.pread(fv._fd, info.st_size, 0)
    assert x[5].tobytes()[:16] not in raw  # sealed: no vector's bytes in the clear
    # Record 3 written over record 4's place: it opens at neither label.
    os.pwrite(fv._fd, os.pread(fv._fd, fv.record, 3 * fv.record), 4 * fv.record)
    with pytest.raises(InvalidTag):
        fv.get(np.array([4]))
    with pytest.raises(KeyError):
        fv.get(np.array([100]))


def test_labels_skipped_read_as_zeros_and_a_relabelling_moves_records(tmp_path: Path) -> None:
    fv = FullVectors(D, str(tmp_path))
    x = np.random.default_rng(1).standard_normal((10, D)).astype(np.float32)
    fv.put(np.array([0, 1, 5, 6, 9]), x[:5])
    assert fv.count == 10
    assert not fv.range(2, 5).any()
    new_of = np.full(10, -1)
    new_of[[0, 5, 9]] = [0, 1, 2]
    moved = fv.relabelled(new_of)
    np.testing.assert_array_equal(moved.range(0, 3), x[[0, 2, 4]])
    assert moved.count == 3


def test_a_section_streams_the_vectors_and_reads_back_into_a_new_file(tmp_path: Path) -> None:
    fv = FullVectors(D, str(tmp_path))
    x = np.random.default_rng(2).standard_normal((9000, D)).astype(np.float32)
    fv.put(np.arange(9000), x)
    frame = codec.pack_frame({"a": 1}, {"vectors": fv.section()})
    assert all(len(c) <= 1 << 16 for c in frame.chunks(1 << 16))
    read = {"vectors": lambda r, n: FullVectors.read(r, n, str(tmp_path))}
    meta, arrays = codec.unpack_stream(codec.Reader(frame.chunks(1 << 16)), read)
    back = arrays["vectors"]
    assert meta == {"a": 1} and back.count == 9000 and back._aead is not fv._aead
    np.testing.assert_array_equal(back.range(0, 9000), x)


def test_a_stream_that_gives_the_wrong_length_fails_the_frame() -> None:
    frame = codec.Frame([codec.Stream(10, lambda: [b"12345"])])
    with pytest.raises(ValueError, match="gave 5 bytes"):
        frame.tobytes()


def test_rerank_orders_candidates_by_exact_distance(tmp_path: Path) -> None:
    fv = FullVectors(2, str(tmp_path))
    fv.put(np.arange(4), np.array([[0, 0], [3, 0], [1, 0], [2, 0]], np.float32))
    q = np.array([[0.9, 0]], np.float32)
    d, labels, _ = rerank(fv, q, np.array([[0, 1, 3, -1, 2]]), 3)
    assert labels.tolist() == [[2, 0, 3]]
    np.testing.assert_allclose(d, [[0.01, 0.81, 1.21]], rtol=1e-5)


# -- a shard ----------------------------------------------------------------------------------
def test_a_pq_shard_reranks_to_the_exact_neighbours(tmp_path: Path) -> None:
    x = clustered(4000, D, n_clusters=20, seed=3)
    q = clustered(100, D, n_clusters=20, seed=4)
    truth = exact_knn(x, q, 10)[1]
    shard = pq_shard(tmp_path, x)
    assert shard.vectors is not None and shard.vectors.count == 4000
    assert shard.partition is not None and not shard.partition.is_flat
    codes_only = shard.search(KEY, request(shard, q, mult=1)).ids.tolist()
    reranked = shard.search(KEY, request(shard, q)).ids.tolist()
    assert recall(codes_only, truth) < 0.9  # 8 bytes a vector lose neighbours
    assert recall(reranked, truth) >= 0.99
    dist = shard.search(KEY, request(shard, q)).distances
    exact = [row == [f"id{j}" for j in t] for row, t in zip(reranked, truth, strict=True)]
    assert sum(exact) >= 95  # exact distances, not the codes' estimates:
    rows = np.flatnonzero(exact)
    np.testing.assert_allclose(dist[rows], exact_knn(x, q, 10)[0][rows] ** 2, rtol=1e-4, atol=1e-4)


def test_full_vectors_survive_replay_snapshot_retraining_and_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = clustered(5000, D, n_clusters=20, seed=5)
    q = clustered(50, D, n_clusters=20, seed=6)
    shard = pq_shard(tmp_path, x[:4000])
    shard.upsert(KEY, batch(x[4000:], 4000))  # after the training's snapshot: in the WAL
    shard.delete(KEY, [f"id{i}" for i in range(1000)])
    live = x[1000:]

    def check(s: Shard) -> None:
        s.stats(KEY)  # (loads a shard made afresh)
        found = s.search(KEY, request(s, q)).ids.tolist()
        truth = exact_knn(live, q, 10)[1] + 1000
        assert recall(found, truth) >= 0.95  # (the codes alone: 0.56 before the retraining)
        got = s.get(KEY, ["id4500", "id1234"], True, False, False).vectors
        np.testing.assert_array_equal(got, x[[4500, 1234]])

    check(shard)
    check(Shard(f"file://{tmp_path}", "idx", "id0", 0))  # snapshot + WAL replay
    shard.snapshot(KEY)
    reloaded = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    check(reloaded)  # from the snapshot alone
    template = train_template(live, "ivfpq", 32, 4, 8, TrainParams(max_iters=5))
    reloaded.rebuild(KEY, 2, serialize(template))  # the file's exact vectors, not the codes
    check(reloaded)
    monkeypatch.setattr(compaction.prepare, "__defaults__", (0.0, 1))  # due at once
    before = reloaded.vectors
    reloaded._lay_out_lists()  # (what a pause in writes runs)
    assert reloaded.vectors is not before and reloaded.vectors is not None
    assert reloaded.vectors.count == 4000 == reloaded.items.next_label
    check(reloaded)


def test_an_update_keeps_the_exact_vector_not_its_code(tmp_path: Path) -> None:
    x = clustered(3000, D, n_clusters=10, seed=7)
    shard = pq_shard(tmp_path, x)
    shard.update(
        KEY,
        parse_filter({"n": 5}),
        None,
        updates.parse_update({"$set": {"tag": "a"}}, None, False, 0),
    )
    got = shard.get(KEY, ["id5"], True, True, False)
    assert got.vectors is not None and got.metadata is not None
    np.testing.assert_array_equal(got.vectors[0], x[5])
    assert orjson.loads(got.metadata[0])["tag"] == "a"
    sample = shard.sample(KEY, 10_000)  # training samples are exact (id5 now last)
    np.testing.assert_array_equal(np.sort(sample, axis=0), np.sort(x, axis=0))


def test_ivfflat_keeps_no_file_and_rerank_mult_one_is_the_codes_alone(tmp_path: Path) -> None:
    x = clustered(2000, D, n_clusters=10, seed=8)
    flat = Shard(f"file://{tmp_path / 'flat'}", "idx", "id0", 0)
    flat.upsert(KEY, batch(x, 0))
    flat.rebuild(KEY, 1, serialize(train_template(x, "ivfflat", 8, None, None, TrainParams())))
    assert flat.vectors is None
    shard = pq_shard(tmp_path / "pq", x, n_lists=8)
    q = x[:20]
    one = shard.search(KEY, request(shard, q, mult=1))
    kept, shard.vectors = shard.vectors, None  # the codes alone, no file to rerank with
    plain = shard.search(KEY, request(shard, q))
    shard.vectors = kept
    assert one.ids.tolist() == plain.ids.tolist()
    np.testing.assert_array_equal(one.distances, plain.distances)


def test_items_deleted_last_before_the_training_need_no_record(tmp_path: Path) -> None:
    """The file holds the live items the first training kept: the labels of items deleted
    before it, at the end, have no record, and later trainings need none."""
    x = clustered(3000, D, n_clusters=10, seed=9)
    shard = Shard(f"file://{tmp_path}", "idx", "id0", 0)
    shard.upsert(KEY, batch(x, 0))
    shard.delete(KEY, [f"id{i}" for i in range(2990, 3000)])
    template = serialize(train_template(x, "ivfpq", 8, 8, 8, TrainParams(max_iters=5)))
    shard.rebuild(KEY, 1, template)
    assert shard.vectors is not None and shard.vectors.count == 2990
    assert shard.items.next_label == 3000
    shard.rebuild(KEY, 2, template)
    assert shard.stats(KEY).count == 2990
    got = shard.get(KEY, ["id2989"], True, False, False).vectors
    np.testing.assert_array_equal(got, x[[2989]])


def test_a_backup_restores_the_full_vectors_into_the_shards_vector_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = clustered(3000, D, n_clusters=10, seed=10)
    src = pq_shard(tmp_path / "a", x, n_lists=8)
    monkeypatch.setattr(constants, "BACKUP_CHUNK_BYTES", 64 << 10)
    parts = list(src.backup(KEY, "b" * 32))
    new_key = bytes(range(1, 33))
    dst = Shard(f"file://{tmp_path / 'b'}", "dst", "id1", 0, vector_dir=str(tmp_path))
    source = BackupSource("idx", "b" * 32, KEY)
    for n, (total, _, blob) in enumerate(parts):
        done = dst.restore_chunk(new_key, source, n, total, blob)
    assert done == 3000 and dst.vectors is not None and dst.vectors.directory == str(tmp_path)
    got = dst.get(new_key, ["id7", "id2999"], True, False, False).vectors
    np.testing.assert_array_equal(got, x[[7, 2999]])


def test_a_partition_without_full_vectors_returns_no_vector_rather_than_its_codes(
    tmp_path: Path,
) -> None:
    """A compressed partition trained before full vectors were kept (none on disk): get
    leaves the vector out; the gateway then answers without it, never with decoded codes."""
    x = clustered(2000, D, n_clusters=10, seed=11)
    shard = pq_shard(tmp_path, x, n_lists=8)
    assert shard.get(KEY, ["id3"], True, False, False).vectors is not None
    shard.vectors = None  # (as a partition written by an earlier vaultvec loads)
    assert shard.get(KEY, ["id3"], True, False, False).vectors is None
    # An update of every item rewrites them from their codes: no file may take those for
    # originals.
    shard.update(KEY, None, None, updates.parse_update({"$set": {"t": 1}}, None, False, 0))
    assert shard.vectors is None
    assert shard.get(KEY, ["id3"], True, False, False).vectors is None
