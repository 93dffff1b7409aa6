"""PartitionIndex removes and reconstructs by label through its own label -> list map exactly as
faiss does with its own direct map: the same lists, entry for entry, and the same vectors."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from actors import constants
from actors.constants import PER_LIST_REMOVE_MAX
from actors.control.training import TrainParams, train_template
from actors.engine.ivf import PartitionIndex, deserialize, serialize
from tests.helpers import clustered

N, DIM, N_LISTS = 4000, 32, 100
LABELS = np.arange(N, dtype=np.int64) * 2 + 5  # labels need not be dense


def lists_of(index: faiss.IndexIVF) -> list[tuple[list[int], bytes]]:
    """Every list's labels and codes, in faiss's order."""
    out = []
    inv = index.invlists
    for list_no in range(index.nlist):
        n = inv.list_size(list_no)
        ids = faiss.rev_swig_ptr(inv.get_ids(list_no), n).tolist()
        codes = faiss.rev_swig_ptr(inv.get_codes(list_no), n * index.code_size).tobytes()
        out.append((ids, codes))
    return out


@pytest.fixture(scope="module", params=["ivfflat", "ivf", "ivfpq"])
def built(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray]:
    """(vectors, serialised template) for one index type."""
    x = clustered(N, DIM, n_clusters=20, seed=7)
    template = train_template(x, request.param, N_LISTS, 8, 8, TrainParams(max_iters=6))
    return x, serialize(template)


def pair(built: tuple[np.ndarray, np.ndarray]) -> tuple[PartitionIndex, faiss.IndexIVF]:
    """The same items in a PartitionIndex and in a plain faiss index with no direct map."""
    x, template = built
    part = PartitionIndex(deserialize(template))
    part.add(LABELS, x)
    raw = deserialize(serialize(part.index))
    assert raw.direct_map.type == faiss.DirectMap.NoMap
    return part, raw


@pytest.mark.parametrize("count", [1, 7, 60, 900])  # a few lists, then more than the per-list cap
def test_remove_leaves_the_lists_faiss_leaves(built, count: int) -> None:
    part, raw = pair(built)
    gone = np.random.default_rng(count).choice(LABELS, count, replace=False)
    lists_touched = len(np.unique(part.list_of[gone]))
    assert (lists_touched <= PER_LIST_REMOVE_MAX) == (count <= 60)
    part.remove(gone)
    assert raw.remove_ids(gone) == count
    assert lists_of(part.index) == lists_of(raw)
    assert part.ntotal == raw.ntotal == N - count
    assert (part.list_of[gone] == -1).all()
    kept = np.setdiff1d(LABELS, gone)
    assert np.array_equal(np.sort(part.all_labels()), kept)


def test_reconstruct_returns_what_faiss_decodes(built) -> None:
    part, raw = pair(built)
    raw.set_direct_map_type(faiss.DirectMap.Hashtable)
    rng = np.random.default_rng(1)
    gone = rng.choice(LABELS, 500, replace=False)  # removals move entries inside their lists
    part.remove(gone)
    raw.remove_ids(gone)
    want = rng.choice(np.setdiff1d(LABELS, gone), 300, replace=False)
    np.testing.assert_array_equal(part.reconstruct(want), raw.reconstruct_batch(want))
    if isinstance(part.index, faiss.IndexIVFFlat):  # flat codes are the vectors themselves
        x, _ = built
        np.testing.assert_array_equal(part.reconstruct(want), x[(want - 5) // 2])


def test_labels_not_in_the_index(built) -> None:
    part, _ = pair(built)
    before = lists_of(part.index)
    part.remove(np.array([0, 4, 10**9], dtype=np.int64))  # never added: nothing changes
    assert lists_of(part.index) == before
    part.remove(LABELS[:1])
    part.remove(LABELS[:1])  # twice: the second time it is gone already
    assert part.ntotal == N - 1
    with pytest.raises(KeyError):
        part.reconstruct(LABELS[:1])
    with pytest.raises(KeyError):
        part.reconstruct(np.array([10**9], dtype=np.int64))
    assert part.reconstruct(np.zeros(0, dtype=np.int64)).shape == (0, DIM)


def test_index_saved_with_a_direct_map_loads_without_one(built) -> None:
    """Snapshots written while faiss kept its own map: loaded, the map is rebuilt here."""
    part, _ = pair(built)
    part.index.set_direct_map_type(faiss.DirectMap.Hashtable)
    loaded = PartitionIndex(deserialize(serialize(part.index)))
    assert loaded.index.direct_map.type == faiss.DirectMap.NoMap
    assert np.array_equal(loaded.list_of[LABELS], part.list_of[LABELS])
    some = LABELS[::97]
    np.testing.assert_array_equal(loaded.reconstruct(some), part.reconstruct(some))


def test_fill_lays_out_the_lists_add_does(built) -> None:
    """A rebuild fills a fresh partition in one go: every list allocated once, yet entry for
    entry what adding the same items in batches gives (so results do not change)."""
    x, template = built
    added = PartitionIndex(deserialize(template))
    for start in range(0, N, 700):
        added.add(LABELS[start : start + 700], x[start : start + 700])
    filled = PartitionIndex(deserialize(template))
    filled.fill(LABELS, x, batch=1100)
    assert lists_of(filled.index) == lists_of(added.index)
    assert filled.ntotal == added.ntotal == N
    np.testing.assert_array_equal(filled.radii, added.radii)
    np.testing.assert_array_equal(filled.list_of[LABELS], added.list_of[LABELS])
    some = LABELS[::53]
    np.testing.assert_array_equal(filled.reconstruct(some), added.reconstruct(some))
    with pytest.raises(ValueError):
        filled.fill(LABELS[:1], x[:1])


def test_a_rebuild_from_entries_in_list_order_lays_out_what_label_order_does(built) -> None:
    """A rebuild reads the old lists as they lie (``entries``), not in label order: filled
    from that, the fresh lists are entry for entry what filling in label order gives."""
    x, template = built
    old = PartitionIndex(deserialize(template))
    old.fill(LABELS, x)
    labels, vectors = old.entries()
    assert sorted(labels.tolist()) == LABELS.tolist()
    np.testing.assert_array_equal(vectors, old.reconstruct(labels))
    shuffled = np.random.default_rng(3).permutation(N)
    from_entries = PartitionIndex(deserialize(template))
    from_entries.fill(labels[shuffled], vectors[shuffled])
    in_label_order = PartitionIndex(deserialize(template))
    order = np.argsort(labels)
    in_label_order.fill(labels[order], vectors[order])
    assert lists_of(from_entries.index) == lists_of(in_label_order.index)


def test_lists_laid_out_afresh_hold_what_they_held(built, monkeypatch) -> None:
    monkeypatch.setattr(constants, "LISTS_COMPACT_MIN", 100)
    part, _ = pair(built)
    part.use_lists(part.laid_out())
    assert part.churn == 0 and not part.needs_layout()
    x, _ = built
    part.add(LABELS[:999] + 10**6, x[:999])  # 999 of 4,999: under a quarter
    assert not part.needs_layout()
    part.remove(LABELS[:300])  # adds and removals both count
    assert part.needs_layout()
    before = lists_of(part.index)
    q = x[:40] + 0.01
    coarse, lists = part.index.quantizer.search(q, 8)
    d0, i0 = part.search(q, 10, lists, coarse, None)
    part.use_lists(part.laid_out())
    assert lists_of(part.index) == before
    assert part.churn == 0 and part.ntotal == N + 999 - 300
    d1, i1 = part.search(q, 10, lists, coarse, None)
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_array_equal(d0, d1)
    part.remove(LABELS[300:310])  # the new lists take removals and reconstruction as before
    some = LABELS[400:420]
    np.testing.assert_array_equal(part.reconstruct(some), pair(built)[0].reconstruct(some))
