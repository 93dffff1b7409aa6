"""PartitionIndex.search: a batch searched in locality order answers exactly as faiss does in
request order (ids and distances bit for bit), for every index type, with skipped lists and
with a filter; relabelled in place, it answers as before under the new labels. too_large flags the vectors
faiss cannot search."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from actors.constants import LOCALITY_MIN_QUERIES
from actors.control.training import TrainParams, train_template
from actors.engine.ivf import MAX_NORM, PartitionIndex, serialize, too_large
from actors.engine.locality import locality_order, principal_rank
from actors.engine.topk import merge_topk
from tests.helpers import clustered

N_LISTS = 48


def reference(index: faiss.IndexIVF, q, k, lists, coarse, bits=None):
    """faiss's own preassigned search, in request order."""
    params = faiss.SearchParametersIVF()
    params.nprobe = lists.shape[1]
    if bits is not None:
        params.sel = faiss.IDSelectorBitmap(len(bits) * 8, faiss.swig_ptr(bits))
    d = np.empty((len(q), k), dtype=np.float32)
    i = np.empty((len(q), k), dtype=np.int64)
    index.search_preassigned_c(
        len(q),
        faiss.swig_ptr(q),
        k,
        faiss.swig_ptr(lists),
        faiss.swig_ptr(coarse),
        faiss.swig_ptr(d),
        faiss.swig_ptr(i),
        False,
        params,
    )
    return d, i


@pytest.fixture(scope="module", params=["ivfflat", "ivf", "ivfpq"])
def partition(request) -> PartitionIndex:
    x = clustered(5000, 32, n_clusters=30, seed=3)
    template = train_template(x, request.param, N_LISTS, 8, 8, TrainParams(max_iters=8))
    part = PartitionIndex(template)
    part.add(np.arange(len(x), dtype=np.int64) * 3 + 1, x)  # labels need not be dense
    return part


@pytest.mark.parametrize("nq", [1, LOCALITY_MIN_QUERIES - 1, LOCALITY_MIN_QUERIES, 700])
def test_ordered_batch_equals_faiss_in_request_order(partition: PartitionIndex, nq: int) -> None:
    q = clustered(nq, 32, n_clusters=30, seed=nq)
    coarse, lists = partition.index.quantizer.search(q, 6)
    d, i = partition.search(q, 15, lists, coarse, None)
    ref_d, ref_i = reference(partition.index, q, 15, lists, coarse)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_array_equal(d, ref_d)


def test_skipped_lists_and_filters_keep_request_order(partition: PartitionIndex) -> None:
    q = clustered(300, 32, n_clusters=30, seed=11)
    coarse, lists = partition.index.quantizer.search(q, 8)
    lists[::3, :4] = -1  # greedy rounds mask lists a query already probed
    labels = np.arange(5000) * 3 + 1
    mask = np.zeros(labels.max() + 1, dtype=bool)
    mask[labels[labels % 2 == 0]] = True
    bits = np.packbits(mask, bitorder="little")
    d, i = partition.search(q, 10, lists, coarse, bits)
    ref_d, ref_i = reference(partition.index, q, 10, lists, coarse, bits)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_array_equal(d, ref_d)
    assert ((i % 2 == 0) | (i < 0)).all()


def test_locality_order_groups_queries_by_their_lists() -> None:
    rank = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    lists = np.array([[5, 1], [2, 9], [5, 0], [2, 3], [7, 7], [-1, 4]])
    order = locality_order(lists, rank)
    assert lists[order].tolist() == [[-1, 4], [2, 3], [2, 9], [5, 0], [5, 1], [7, 7]]
    reverse = rank[::-1].copy()  # the rank, not the list number, decides
    assert locality_order(np.array([[3], [1], [3], [0]]), reverse).tolist() == [0, 2, 1, 3]


@pytest.mark.parametrize("n", [50, 6000])  # 6,000: the axis comes from a sample of them
def test_principal_rank_follows_the_centroids_main_axis(n: int) -> None:
    rng = np.random.default_rng(5)
    t = rng.permutation(n).astype(np.float32)
    centroids = np.outer(t, rng.normal(size=16)).astype(np.float32)  # points on one line
    centroids += 1e-3 * rng.normal(size=centroids.shape).astype(np.float32)
    rank = principal_rank(centroids)
    assert sorted(rank.tolist()) == list(range(n))
    by_t = rank[np.argsort(t)]
    assert (np.diff(by_t) == 1).all() or (np.diff(by_t) == -1).all()


def test_principal_rank_of_one_list() -> None:
    assert principal_rank(np.zeros((1, 8), dtype=np.float32)).tolist() == [0]


def test_relabel_rewrites_the_ids_in_place(partition: PartitionIndex) -> None:
    """Compaction's relabelling: every search and reconstruction answers as before, under the
    new labels; the label -> list map is as long as the items."""
    part = PartitionIndex.from_template(serialize(partition.index), partition.dimension)
    old = np.arange(5000) * 3 + 1
    new_of = np.full(old.max() + 1, -1, dtype=np.int64)
    new_of[old] = np.arange(5000)
    q = clustered(50, 32, n_clusters=30, seed=5)
    coarse, lists = part.index.quantizer.search(q, 6)
    d0, i0 = part.search(q, 10, lists, coarse, None)
    vectors = part.reconstruct(old[::7])
    part.relabel(new_of)
    d1, i1 = part.search(q, 10, lists, coarse, None)
    np.testing.assert_array_equal(d1, d0)
    np.testing.assert_array_equal(i1, np.where(i0 >= 0, new_of[np.maximum(i0, 0)], -1))
    np.testing.assert_array_equal(part.reconstruct(np.arange(5000)[::7]), vectors)
    assert len(part.list_of) == part.ntotal == 5000
    assert sorted(part.all_labels().tolist()) == list(range(5000))
    with pytest.raises(ValueError, match="no new label"):
        part.relabel(np.arange(10))  # labels 10 and above would have none
    assert sorted(part.all_labels().tolist()) == list(range(5000))


def test_too_large_flags_exactly_the_rows_whose_norm_exceeds_max_norm_or_is_not_finite() -> None:
    rng = np.random.default_rng(5)
    edge = MAX_NORM / np.sqrt(8)  # 8 entries of this: a norm of exactly MAX_NORM
    rows = [
        rng.normal(size=8),
        np.full(8, edge * 0.999),
        np.full(8, edge * 1.001),
        [1e20, 0, 0, 0, 0, 0, 0, 0],
        [3e38, 3e38, 0, 0, 0, 0, 0, 0],  # finite in float32; its squares are not
        [np.inf, 0, 0, 0, 0, 0, 0, 0],
        [np.nan, 0, 0, 0, 0, 0, 0, 0],
        np.zeros(8),
    ]
    x = np.array(rows, dtype=np.float32)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    expected = [i for i, n in enumerate(norms) if not n <= MAX_NORM]
    assert expected == [2, 3, 4, 5, 6]
    assert too_large(x).tolist() == expected
    x64 = x.astype(np.float64)
    assert too_large(x64).tolist() == expected
    assert np.array_equal(x64, x.astype(np.float64), equal_nan=True)  # squared in a copy


@pytest.mark.parametrize("k", [1, 5, 10])
def test_one_query_merges_as_its_row_of_a_batch(k: int) -> None:
    """merge_topk of one row (a lone query's two passes) takes its own path: the same top-k,
    ties included, as that row merged in a batch."""
    rng = np.random.default_rng(k)
    parts_d = [rng.integers(0, 6, (40, w)).astype(np.float32) for w in (k, 7, 3)]
    parts_d[1][::5] = np.inf
    parts_l = [rng.integers(-1, 1000, d.shape) for d in parts_d]
    batch_d, batch_l = merge_topk(parts_d, parts_l, k)
    for i in range(40):
        d, lab = merge_topk([p[i : i + 1] for p in parts_d], [p[i : i + 1] for p in parts_l], k)
        np.testing.assert_array_equal(d[0], batch_d[i])
        np.testing.assert_array_equal(lab[0], batch_l[i])
