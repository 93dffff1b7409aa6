"""The IVF partitions of one shard, over faiss.

All shards of an index share one trained template (coarse quantizer plus SQ/PQ codebooks);
each holds the inverted lists of its own items. Distances are squared L2 in *index space*
(vectors are unit-normalised for the cosine metric), so one faiss metric serves every API metric.

Before training an index is a one-list IVFFlat whose only centroid is the origin: probing that
list is an exact search, and the same code path serves both states.
"""

from __future__ import annotations

import functools

import faiss
import numpy as np
from faiss import swig_ptr

from actors.errors import InvalidRequest


def untrained_template(dimension: int) -> faiss.IndexIVF:
    quantizer = faiss.IndexFlatL2(dimension)
    quantizer.add(np.zeros((1, dimension), dtype=np.float32))
    index = faiss.IndexIVFFlat(quantizer, dimension, 1, faiss.METRIC_L2)
    index.is_trained = True
    return index


def new_ivf(
    index_type: str,
    dimension: int,
    n_lists: int,
    pq_dim: int | None,
    pq_bits: int | None,
    sq_bits: int | None = None,
) -> faiss.IndexIVF:
    quantizer = faiss.IndexFlatL2(dimension)
    if index_type == "ivfflat":
        index = faiss.IndexIVFFlat(quantizer, dimension, n_lists, faiss.METRIC_L2)
    elif index_type == "ivf":
        qtype = faiss.ScalarQuantizer.QT_fp16 if sq_bits == 16 else faiss.ScalarQuantizer.QT_8bit
        index = faiss.IndexIVFScalarQuantizer(quantizer, dimension, n_lists, qtype, faiss.METRIC_L2)
    elif index_type == "ivfpq":
        m = pq_dim or default_pq_dim(dimension)
        index = faiss.IndexIVFPQ(quantizer, dimension, n_lists, m, pq_bits or 8)
    else:
        raise InvalidRequest(f"unknown index type {index_type!r}")
    # Keep the quantizer alive with the index (faiss does not own it from Python).
    index.own_fields = True
    quantizer.this.disown()
    return index


# The largest vector norm an index accepts: squared L2 distances between any two such vectors
# (at most (2 * MAX_NORM)^2) stay finite in float32, which faiss computes in. A larger vector
# would get no list (its distances are inf) and could never be found.
MAX_NORM = float(np.sqrt(np.finfo(np.float32).max)) / 2  # ~9.2e18


def too_large(x: np.ndarray) -> np.ndarray:
    """Row numbers of ``x`` that are not finite or whose norm exceeds MAX_NORM."""
    # Squared in place in a float64 copy, then summed. Not einsum: it takes 20 KB more of the
    # calling thread's stack, and each of a shard pool actor's call threads keeps what it
    # touched resident (docs/performance.md, many indexes and churn).
    x64 = np.array(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        np.square(x64, out=x64)
        sq = x64.sum(axis=1)
    return np.flatnonzero(~(sq <= MAX_NORM * MAX_NORM))


def default_pq_dim(dimension: int) -> int:
    """Largest divisor of ``dimension`` that gives sub-vectors of at least 2 dims, at most 64."""
    for m in range(min(64, dimension // 2), 0, -1):
        if dimension % m == 0:
            return m
    return 1


def serialize(index: faiss.Index) -> np.ndarray:
    return np.asarray(faiss.serialize_index(index))


def deserialize(buf: np.ndarray) -> faiss.IndexIVF:
    # deserialize_index returns the concrete, owning IVF class; extract_index_ivf would hand
    # back a non-owning view whose owner could be collected under it.
    index = faiss.deserialize_index(np.ascontiguousarray(buf, dtype=np.uint8))
    if not isinstance(index, faiss.IndexIVF):
        raise ValueError("template is not an IVF index")
    return index


def centroids_of(index: faiss.IndexIVF) -> np.ndarray:
    return index.quantizer.reconstruct_n(0, index.nlist)


# A removal touching up to this many lists is done list by list here; beyond it faiss's own
# scan of every list (C++, on all threads) is quicker.
PER_LIST_REMOVE_MAX = 64
# Lists are laid out afresh (PartitionIndex.laid_out) once the entries added or removed since
# their last exact layout reach this share of the partition (and at least COMPACT_MIN).
COMPACT_SHARE = 0.25
COMPACT_MIN = 4096


class PartitionIndex:
    """A faiss IVF index with integer labels, per-list radii and preassigned search.

    Removing or reconstructing an item needs the list that holds its label. faiss can keep
    that map itself (``DirectMap.Hashtable``), but its hash table costs 30 to 50 resident
    bytes per vector, allocated node by node, whose nodes are left scattered over the heap when
    a training swap frees the old lists. Here the map is :attr:`list_of`, 4 bytes per label,
    and an item's offset is found by scanning its one list; faiss keeps no map (``NoMap``).
    """

    def __init__(self, index: faiss.IndexIVF, radii: np.ndarray | None = None):
        self.index = index
        if index.direct_map.type != faiss.DirectMap.NoMap:  # a snapshot written with one
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        self.radii = radii if radii is not None else np.zeros(index.nlist, dtype=np.float32)
        self.list_of = np.empty(0, dtype=np.int32)  # label -> list number, -1: not here
        self._sizes: np.ndarray | None = None  # items per list, until list_of changes
        self.churn = 0  # entries added or removed since the lists were last laid out exactly
        for list_no in range(index.nlist):
            ids = self._ids(list_no)
            if len(ids):
                self._place(ids, list_no)

    @functools.cached_property
    def list_rank(self) -> np.ndarray:
        """This partition's :func:`rank_lists`, computed once."""
        return rank_lists(self.index)

    @classmethod
    def from_template(cls, template: np.ndarray | None, dimension: int) -> PartitionIndex:
        if template is None:
            return cls(untrained_template(dimension))
        return cls(deserialize(template))

    @property
    def nlist(self) -> int:
        return int(self.index.nlist)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dimension(self) -> int:
        return int(self.index.d)

    def assign(self, x: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        """Coarse assignment: (squared distances, list numbers), nearest first."""
        nprobe = min(nprobe, self.nlist)
        dis, lists = self.index.quantizer.search(x, nprobe)
        return dis, lists

    def add(self, labels: np.ndarray, x: np.ndarray) -> None:
        if len(labels) == 0:
            return
        x = np.ascontiguousarray(x, dtype=np.float32)
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        lists = self._nearest_lists(x)
        self.index.add_core(len(x), swig_ptr(x), swig_ptr(labels), swig_ptr(lists))
        self._place(labels, lists)
        self.churn += len(labels)

    def fill(self, labels: np.ndarray, x: np.ndarray, batch: int = 65536) -> None:
        """Add to an empty partition, each list allocated once at its final size.

        Lists that grow entry by entry reserve up to twice their size, and every block they
        outgrow is freed around the heap's live blocks, where pages it shares with them stay
        resident. The lists hold the same entries in the same order as :meth:`add` gives."""
        if self.ntotal:
            raise ValueError("fill needs an empty partition")
        if len(labels) == 0:
            return
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        lists = np.concatenate(
            [self._nearest_lists(x[i : i + batch]) for i in range(0, len(x), batch)]
        )
        order = np.argsort(lists, kind="stable")  # by list, in arrival order within a list
        lists, labels = lists[order], labels[order]
        codes = np.empty((len(x), self.index.code_size), dtype=np.uint8)
        for i in range(0, len(x), batch):
            rows = np.ascontiguousarray(x[order[i : i + batch]], dtype=np.float32)
            self.index.encode_vectors(
                len(rows), swig_ptr(rows), swig_ptr(lists[i : i + batch]), swig_ptr(codes[i:])
            )
        invlists = self.index.invlists
        for a, b in _runs(lists):
            invlists.add_entries(int(lists[a]), b - a, swig_ptr(labels[a:b]), swig_ptr(codes[a:b]))
        self.index.ntotal = len(labels)
        self._place(labels, lists)

    def _nearest_lists(self, x: np.ndarray) -> np.ndarray:
        """Each vector's list, widening the lists' radii to cover it."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        dis, lists = self.assign(x, 1)
        lists1 = np.ascontiguousarray(lists[:, 0])
        if len(lists1) and lists1.min() < 0:  # faiss found no list: inf or NaN distances
            raise ValueError("a vector got no list; vectors are checked against MAX_NORM first")
        np.maximum.at(self.radii, lists1, np.sqrt(np.maximum(dis[:, 0], 0)))
        return lists1

    def remove(self, labels: np.ndarray) -> None:
        """Remove the items with these labels (labels not in the index are ignored).

        Within a list faiss's order is kept: each removed entry's place is taken by the last
        remaining entry, as ``IndexIVF.remove_ids`` does."""
        labels = np.unique(np.asarray(labels, dtype=np.int64))
        labels = labels[labels < len(self.list_of)]
        labels = labels[self.list_of[labels] >= 0]
        if len(labels) == 0:
            return
        groups = self._groups(labels)
        if len(groups) > PER_LIST_REMOVE_MAX:
            self.index.remove_ids(labels)  # without a direct map: one scan of every list
        else:
            invlists, removed = self.index.invlists, 0
            for list_no, rows in groups:
                ids = self._ids(list_no)
                gone = np.isin(ids, labels[rows])
                keep = len(ids) - int(gone.sum())
                holes = np.flatnonzero(gone[:keep])
                fill = keep + np.flatnonzero(~gone[keep:])[::-1]
                if len(holes):
                    codes = self._codes(list_no)
                    ids[holes] = ids[fill]
                    codes[holes] = codes[fill]
                invlists.resize(list_no, keep)
                removed += len(ids) - keep
            self.index.ntotal = self.ntotal - removed
        self.list_of[labels] = -1
        self._sizes = None
        self.churn += len(labels)

    def needs_layout(self) -> bool:
        """Enough adds and removals since the last exact layout to make :meth:`laid_out`
        worth its copy."""
        return self.churn >= max(COMPACT_MIN, COMPACT_SHARE * self.ntotal)

    def laid_out(self) -> faiss.ArrayInvertedLists:
        """A copy of the lists, each allocated at exactly its size, for :meth:`use_lists`.

        A list grows by doubling its allocation, and each block it outgrows is freed between
        live blocks of the heap: after as many adds into trained lists as they held, a shard
        kept 973 resident bytes per 512-byte vector, 735 with its lists laid out afresh once
        the writes paused (benchmarks/bench_service.py). Copied list by list, the lists hold
        what they did in the same order; the old ones are freed whole when replaced."""
        invlists = self.index.invlists
        fresh = faiss.ArrayInvertedLists(self.nlist, self.index.code_size)
        for list_no in range(self.nlist):
            n = invlists.list_size(list_no)
            if n:
                fresh.add_entries(
                    list_no, n, invlists.get_ids(list_no), invlists.get_codes(list_no)
                )
        return fresh

    def use_lists(self, lists: faiss.ArrayInvertedLists) -> None:
        """Swap in lists from :meth:`laid_out` (taken while no write ran since)."""
        self.index.replace_invlists(lists, True)
        lists.this.disown()  # the index owns and frees them now
        self.churn = 0

    def relabel(self, new_of: np.ndarray) -> None:
        """Give every item the label ``new_of[label]``, rewriting the ids inside the lists in
        place: codes, list order and sizes stay as they are (benchmarks/churn.py measures this
        against copying the lists and against adding the vectors again). Every label held must
        map to one >= 0; nothing changes otherwise."""
        held = np.flatnonzero(self.list_of >= 0)
        if len(held) and held[-1] >= len(new_of):
            raise ValueError("relabel: a label held has no new label")
        new = new_of[held]
        if len(new) and new.min() < 0:
            raise ValueError("relabel: a label held has no new label")
        list_of = np.full(int(new.max()) + 1 if len(new) else 0, -1, dtype=np.int32)
        list_of[new] = self.list_of[held]
        for list_no in range(self.nlist):
            ids = self._ids(list_no)
            if len(ids):
                ids[:] = new_of[ids]
        self.list_of = list_of

    def reconstruct(self, labels: np.ndarray) -> np.ndarray:
        """The stored vectors of ``labels`` (which must all be in the index), decoded."""
        labels = np.asarray(labels, dtype=np.int64)
        out = np.empty((len(labels), self.dimension), dtype=np.float32)
        flat = isinstance(self.index, faiss.IndexIVFFlat)  # codes are the vectors themselves
        for list_no, rows in self._groups(labels):
            offsets = self._offsets(list_no, labels[rows])
            if flat:
                out[rows] = self._codes(list_no).view(np.float32)[offsets]
            else:
                for row, offset in zip(rows.tolist(), offsets.tolist()):
                    self.index.reconstruct_from_offset(list_no, offset, swig_ptr(out[row]))
        return out

    def all_labels(self) -> np.ndarray:
        parts = [self._ids(list_no).copy() for list_no in range(self.nlist)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    # -- the label -> list map ----------------------------------------------------------------
    def _ids(self, list_no: int) -> np.ndarray:
        """A list's labels: a view of faiss's own array."""
        invlists = self.index.invlists
        return faiss.rev_swig_ptr(invlists.get_ids(list_no), invlists.list_size(list_no))

    def _codes(self, list_no: int) -> np.ndarray:
        """A list's codes, one row per entry: a view of faiss's own array."""
        invlists, size = self.index.invlists, self.index.code_size
        n = invlists.list_size(list_no)
        return faiss.rev_swig_ptr(invlists.get_codes(list_no), n * size).reshape(n, size)

    def _place(self, labels: np.ndarray, list_nos: np.ndarray | int) -> None:
        top = int(labels.max()) + 1
        if top > len(self.list_of):
            grown = np.full(max(top, len(self.list_of) * 3 // 2), -1, dtype=np.int32)
            grown[: len(self.list_of)] = self.list_of
            self.list_of = grown
        self.list_of[labels] = list_nos
        self._sizes = None

    def _groups(self, labels: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(list number, rows of ``labels`` in that list) for each list holding some."""
        if len(labels) and (labels.max() >= len(self.list_of) or labels.min() < 0):
            raise KeyError("label not in this partition")
        lists = self.list_of[labels]
        if (lists < 0).any():
            raise KeyError("label not in this partition")
        order = np.argsort(lists, kind="stable")
        return [(int(lists[order[a]]), order[a:b]) for a, b in _runs(lists[order])]

    def _offsets(self, list_no: int, labels: np.ndarray) -> np.ndarray:
        """Where in list ``list_no`` each of ``labels`` (all in it) is stored."""
        ids = self._ids(list_no)
        sorter = np.argsort(ids)
        return sorter[np.searchsorted(ids, labels, sorter=sorter)]

    def search(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Search only the given lists (one row of list numbers per query).

        A batch is searched in locality order (:func:`locality_order`) and its results put back
        in request order; each query's result is computed alone, so the order changes nothing
        but the speed.
        """
        n = len(x)
        order = locality_order(list_nos, self.list_rank) if n >= LOCALITY_MIN_QUERIES else None
        if order is not None:
            x, list_nos, coarse_dis = x[order], list_nos[order], coarse_dis[order]
        x = np.ascontiguousarray(x, dtype=np.float32)
        list_nos = np.ascontiguousarray(list_nos, dtype=np.int64)
        coarse_dis = np.ascontiguousarray(coarse_dis, dtype=np.float32)
        distances = np.empty((n, k), dtype=np.float32)
        labels = np.empty((n, k), dtype=np.int64)
        params = faiss.SearchParametersIVF()
        params.nprobe = list_nos.shape[1]
        params.max_codes = 0
        selector = None
        if selector_bits is not None:
            selector = faiss.IDSelectorBitmap(len(selector_bits) * 8, swig_ptr(selector_bits))
            params.sel = selector
        self.index.search_preassigned_c(
            n,
            swig_ptr(x),
            k,
            swig_ptr(list_nos),
            swig_ptr(coarse_dis),
            swig_ptr(distances),
            swig_ptr(labels),
            False,
            params,
        )
        del selector
        if order is not None:
            distances, labels = request_order(order, distances, labels)
        return distances, labels

    def list_counts(self, selector_bits: np.ndarray | None = None) -> np.ndarray:
        """Items per list, or with a filter the matching items per list: (nlist,) int64.

        The counts come from the label -> list map and the filter's bitmap, so they cost one
        pass over the labels, as evaluating the filter did."""
        placed = self.list_of
        if selector_bits is None:
            if self._sizes is None:  # kept until an add or removal: unfiltered queries reuse it
                self._sizes = np.bincount(placed[placed >= 0], minlength=self.nlist)
            return self._sizes
        n = min(len(placed), len(selector_bits) * 8)
        mask = np.unpackbits(selector_bits, count=n, bitorder="little").view(bool)
        placed = placed[:n][mask]
        return np.bincount(placed[placed >= 0], minlength=self.nlist)

    def search_adaptive(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
        first: int,
        slack: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Automatic probing: how many lists each query scans is chosen from what it finds.

        1. Each query scans its ``first`` nearest lists, more if those hold fewer than ``k``
           items that the filter matches (the per-list match counts come from the filter's
           bitmap), so that the first pass has a k-th distance to go by.
        2. With ``D1`` the squared distance to its nearest centroid and ``Dk`` its k-th squared
           distance after the first pass, every further list whose centroid lies within
           ``D1 + slack * Dk`` is scanned too, except lists holding no matching item.

        A query far from every centroid, or one whose filter leaves few candidates nearby,
        has a large ``Dk`` and scans more lists; one deep inside a dense list scans few. Queries
        whose plan (the gateway's ``list_nos``) is too short for the rule have their lists
        assigned here, wider. Returns (distances, labels, lists scanned per query).
        """
        counts = self.list_counts(selector_bits)
        return self._adaptive(x, k, list_nos, coarse_dis, selector_bits, first, slack, counts)

    def _first_pass(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
        first: int,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step 1 of :meth:`search_adaptive`: (distances, labels, lists it scanned per query,
        plan columns it covered per query, per-column match counts)."""
        plan = list_nos.shape[1]
        c = counts[np.maximum(list_nos, 0)] * (list_nos >= 0)
        enough = np.cumsum(c, axis=1) >= k
        reach = np.where(enough.any(axis=1), enough.argmax(axis=1) + 1, plan)
        p1 = np.minimum(np.maximum(reach, first), plan)
        w1 = int(p1.max())
        take1 = (np.arange(w1)[None, :] < p1[:, None]) & (c[:, :w1] > 0)
        distances, labels = self.search(
            x, k, np.where(take1, list_nos[:, :w1], -1), coarse_dis[:, :w1], selector_bits
        )
        return distances, labels, take1.sum(axis=1), p1, c

    def _adaptive(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
        first: int,
        slack: float,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nq, plan = list_nos.shape
        if nq == 0 or plan == 0:
            empty = np.full((nq, k), np.inf, dtype=np.float32)
            return empty, np.full((nq, k), -1, dtype=np.int64), np.zeros(nq, dtype=np.int64)
        if nq == 1:
            return self._adaptive_one(
                x, k, list_nos, coarse_dis, selector_bits, first, slack, counts
            )
        distances, labels, scanned, p1, c = self._first_pass(
            x, k, list_nos, coarse_dis, selector_bits, first, counts
        )
        # 2. further lists within D1 + slack * Dk (Dk is inf when the first pass found < k).
        with np.errstate(over="ignore"):
            bound = coarse_dis[:, :1] + slack * distances[:, k - 1 : k]
        take2 = (np.arange(plan)[None, :] >= p1[:, None]) & (c > 0) & (coarse_dis < bound)
        # A plan that ends inside the bound (or before k matches) may be too short.
        cut = (coarse_dis[:, -1] < bound[:, 0]) | (np.cumsum(c, axis=1)[:, -1] < k)
        wider = np.flatnonzero(cut) if plan < self.nlist else np.zeros(0, dtype=np.int64)
        take2[wider] = False
        rows = np.flatnonzero(take2.any(axis=1))
        if len(rows):
            lo = int(p1[rows].min())
            d2, l2 = self.search(
                x[rows],
                k,
                np.where(take2[rows, lo:], list_nos[rows, lo:], -1),
                coarse_dis[rows, lo:],
                selector_bits,
            )
            distances[rows], labels[rows] = merge_topk([distances[rows], d2], [labels[rows], l2], k)
            scanned += take2.sum(axis=1)
        if len(wider):
            # These queries start over on a plan four times as long (the work already done is
            # counted); the first pass and its k-th distance come out the same.
            dw, lw, sw = self._wider(x[wider], k, plan, selector_bits, first, slack, counts)
            distances[wider], labels[wider] = dw, lw
            scanned[wider] += sw
        return distances, labels, scanned

    def _adaptive_one(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
        first: int,
        slack: float,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_adaptive` of one query, the same steps on its row as plain Python lists:
        numpy's calls on arrays of one row cost more than the scan (a single query's search
        went 173 -> ~60 us in-process). Same lists, same faiss calls, same merge: the same
        answer bit for bit (tests/unit/test_partition.py)."""
        plan = list_nos.shape[1]
        lists = list_nos[0].tolist()
        c = [int(n) if n > 0 else 0 for n in counts[np.maximum(list_nos[0], 0)].tolist()]
        c = [n if lst >= 0 else 0 for n, lst in zip(c, lists)]
        # 1. the first `first` lists, more until they hold k matching items
        reach, total = plan, 0
        for j, n in enumerate(c):
            total += n
            if total >= k:
                reach = j + 1
                break
        p1 = min(max(reach, first), plan)
        row1 = [lst if n > 0 else -1 for lst, n in zip(lists[:p1], c[:p1])]
        distances, labels = self.search(
            x, k, np.array([row1], dtype=np.int64), coarse_dis[:, :p1], selector_bits
        )
        scanned = sum(n > 0 for n in c[:p1])
        # 2. further lists within D1 + slack * Dk, in float32 as the batch rule computes it
        coarse = coarse_dis[0]
        with np.errstate(over="ignore"):
            bound = float(coarse[0] + np.float32(slack) * distances[0, k - 1])
        if plan < self.nlist and (float(coarse[-1]) < bound or sum(c) < k):
            # the plan may be too short: start over on one four times as long
            dw, lw, sw = self._wider(x, k, plan, selector_bits, first, slack, counts)
            return dw, lw, sw + scanned
        dis = coarse.tolist()
        row2 = [
            lst if n > 0 and d < bound else -1 for lst, n, d in zip(lists[p1:], c[p1:], dis[p1:])
        ]
        more = sum(lst >= 0 for lst in row2)
        if more:
            d2, l2 = self.search(
                x, k, np.array([row2], dtype=np.int64), coarse_dis[:, p1:], selector_bits
            )
            distances, labels = merge_topk([distances, d2], [labels, l2], k)
        return distances, labels, np.array([scanned + more], dtype=np.int64)

    def _wider(
        self,
        x: np.ndarray,
        k: int,
        plan: int,
        selector_bits: np.ndarray | None,
        first: int,
        slack: float,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_adaptive` of ``x`` on a plan four times ``plan`` long, assigned here."""
        xw = np.ascontiguousarray(x)
        dis_w, lists_w = self.assign(xw, min(self.nlist, 4 * plan))
        return self._adaptive(xw, k, lists_w, dis_w, selector_bits, first, slack, counts)

    def slack_needed(
        self,
        x: np.ndarray,
        k: int,
        list_nos: np.ndarray,
        coarse_dis: np.ndarray,
        selector_bits: np.ndarray | None,
        first: int,
        labels: np.ndarray,
    ) -> np.ndarray:
        """For results ``labels`` (nq, k; -1 = none) of queries ``x``: the smallest slack with
        which :meth:`search_adaptive` scans each one's list (0 when the first pass does; nan
        for -1). The first pass does not depend on the slack, so one exact search tells how
        recall grows with it."""
        counts = self.list_counts(selector_bits)
        found, _, _, p1, _ = self._first_pass(
            x, k, list_nos, coarse_dis, selector_bits, first, counts
        )
        kth = found[:, -1]
        out = np.full(labels.shape, np.nan, dtype=np.float64)
        valid = labels >= 0
        if not valid.any():
            return out
        lists = np.full(labels.shape, -1, dtype=np.int64)
        lists[valid] = self.list_of[labels[valid]]
        w1 = int(p1.max())
        firsts = np.where(np.arange(w1)[None, :] < p1[:, None], list_nos[:, :w1], -2)
        in_first = (firsts[:, None, :] == lists[:, :, None]).any(axis=2)
        centroids = self.index.quantizer.reconstruct_n(0, self.nlist)
        rows, cols = np.nonzero(valid)
        diff = x[rows] - centroids[lists[rows, cols]]
        d_list = np.einsum("ij,ij->i", diff, diff)
        with np.errstate(divide="ignore", invalid="ignore"):
            need = (d_list - coarse_dis[rows, 0]) / kth[rows].astype(np.float64)
        need = np.where(np.isfinite(need), np.maximum(need, 0.0), 0.0)
        out[rows, cols] = np.where(in_first[rows, cols], 0.0, need)
        return out

    def search_greedy(
        self, x: np.ndarray, k: int, start_nprobe: int, selector_bits: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Probe lists in centroid order until no unprobed list can hold a closer point.

        A point p in list j satisfies |q - p| >= |q - c_j| - r_j (r_j: the list's radius), so a
        query is done once the smallest such bound over its unprobed lists reaches its k-th
        distance. Unfinished queries double their probe count each round. Returns (distances,
        labels, lists probed per query).
        """
        nlist = self.nlist
        dis_c, lists = self.assign(x, nlist)
        lower = np.sqrt(np.maximum(dis_c, 0)) - self.radii[lists]
        # suffix_min[:, j] = best bound among lists j.. (inf past the end)
        suffix_min = np.minimum.accumulate(lower[:, ::-1], axis=1)[:, ::-1]
        suffix_min = np.concatenate([suffix_min, np.full((len(x), 1), np.inf, np.float32)], axis=1)
        p = max(1, min(start_nprobe, nlist))
        distances, labels = self.search(x, k, lists[:, :p], dis_c[:, :p], selector_bits)
        probed = np.full(len(x), p, dtype=np.int64)
        while True:
            kth = np.sqrt(np.maximum(distances[:, k - 1], 0))
            todo = np.flatnonzero((probed < nlist) & (suffix_min[np.arange(len(x)), probed] < kth))
            if len(todo) == 0:
                return distances, labels, probed
            start = int(probed[todo].min())
            stop = min(nlist, 2 * int(probed[todo].max()))
            # Queries in one round share a window [start, stop); lists a query already probed
            # are masked out by giving them list number -1, which faiss skips.
            window = lists[todo, start:stop].copy()
            cols = np.arange(start, stop)
            window[cols[None, :] < probed[todo, None]] = -1
            d2, l2 = self.search(x[todo], k, window, dis_c[todo, start:stop], selector_bits)
            distances[todo], labels[todo] = merge_topk([distances[todo], d2], [labels[todo], l2], k)
            probed[todo] = stop


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal values in a sorted array of list numbers (>= 0)."""
    starts = np.flatnonzero(np.diff(values, prepend=-1)).tolist()
    return list(zip(starts, [*starts[1:], len(values)]))


# Below this many queries a batch is searched as it comes: too few share lists to matter.
LOCALITY_MIN_QUERIES = 32


def principal_rank(centroids: np.ndarray, sample: int = 4096, iterations: int = 20) -> np.ndarray:
    """Rank of each centroid along the centroids' first principal axis; lists with close ranks
    lie close together. The axis comes from power iteration on at most ``sample`` centroids,
    so it costs milliseconds for any n_lists; the fixed seed gives every shard the same ranks."""
    n = len(centroids)
    rng = np.random.default_rng(0)
    rows = rng.choice(n, sample, replace=False) if n > sample else slice(None)
    c = centroids[rows].astype(np.float64)
    c -= c.mean(axis=0)
    v = rng.normal(size=(c.shape[1],))
    for _ in range(iterations):
        w = c.T @ (c @ v)
        norm = np.linalg.norm(w)
        if norm == 0:  # one list, or all centroids alike: any order will do
            break
        v = w / norm
    rank = np.empty(n, dtype=np.int64)
    axis = v.astype(centroids.dtype)
    rank[np.argsort(centroids @ axis, kind="stable")] = np.arange(n)
    return rank


def rank_lists(index: faiss.IndexIVF) -> np.ndarray:
    """Each list's rank along the centroids' first principal axis (:func:`locality_order`)."""
    return principal_rank(centroids_of(index))


def request_order(order: np.ndarray, *rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-query arrays computed in ``order`` (a permutation), put back in request order."""
    out = []
    for a in rows:
        back = np.empty_like(a)
        back[order] = a
        out.append(back)
    return tuple(out)


def locality_order(list_nos: np.ndarray, list_rank: np.ndarray) -> np.ndarray:
    """A query order in which queries that probe the same or nearby lists come one after another.

    faiss scans a batch query by query, each query reading its nprobe inverted lists. Sorted by
    the principal-axis rank of their nearest list (then of their second nearest), consecutive
    queries read mostly the same lists while those are still in the CPU caches, instead of
    fetching them from memory again; neighbouring groups share lists too, as their nearest
    lists lie close together. ``benchmarks/bench_bulk.py`` measures raw faiss in this order
    beside request order. List number -1 (a list a greedy round skips) sorts first.
    """

    def key(col: np.ndarray) -> np.ndarray:
        return np.where(col >= 0, list_rank[np.maximum(col, 0)], -1)

    if list_nos.shape[1] == 1:
        return np.argsort(key(list_nos[:, 0]), kind="stable")
    return np.lexsort((key(list_nos[:, 1]), key(list_nos[:, 0])))


def merge_topk(
    distances: list[np.ndarray], labels: list[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-part (nq, k_i) result blocks into the (nq, k) best, ascending. Any label dtype."""
    if len(distances[0]) == 1:  # one query: the same steps on its row, without the 2-D calls
        d1 = np.concatenate([part[0] for part in distances])
        lab1 = np.concatenate([part[0] for part in labels])
        if len(d1) > k:
            top = np.argpartition(d1, k - 1)[:k]
            d1, lab1 = d1[top], lab1[top]
        order1 = np.argsort(d1, kind="stable")
        return d1[order1][None], lab1[order1][None]
    d = np.concatenate(distances, axis=1)
    lab = np.concatenate(labels, axis=1)
    if d.shape[1] > k:
        part = np.argpartition(d, k - 1, axis=1)[:, :k]
        d = np.take_along_axis(d, part, axis=1)
        lab = np.take_along_axis(lab, part, axis=1)
    order = np.argsort(d, axis=1, kind="stable")
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(lab, order, axis=1)
