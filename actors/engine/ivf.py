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

from actors import constants
from actors.engine.locality import locality_order, rank_lists, request_order
from actors.engine.selection import GENERATIONS
from actors.errors import InvalidRequest
from actors.storage import codec


def untrained_template(dimension: int) -> faiss.IndexIVF:
    quantizer = faiss.IndexFlatL2(dimension)
    quantizer.add(np.zeros((1, dimension), dtype=np.float32))
    index = faiss.IndexIVFFlat(quantizer, dimension, 1, faiss.METRIC_L2)
    index.is_trained = True
    return index


# An ivf index's sq_bits -> the faiss scalar quantizer its codes use (None: 8 bits). 4, 6 and 8
# are faiss's non-uniform quantizers: per dimension, a range trained on the residuals, cut
# into 2^bits steps. 12 is CyborgDB's tq12: faiss has no 12-bit quantizer, so it keeps
# half-precision codes, 16 bits a dimension (fp16's 11-bit significand is at least as fine as a
# 12-bit grid); it stays 12 in the config so that describe answers the precision asked for.
SQ_TYPES = {
    4: faiss.ScalarQuantizer.QT_4bit,
    6: faiss.ScalarQuantizer.QT_6bit,
    8: faiss.ScalarQuantizer.QT_8bit,
    12: faiss.ScalarQuantizer.QT_fp16,
    16: faiss.ScalarQuantizer.QT_fp16,
}


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
        if (sq_bits or 8) not in SQ_TYPES:
            raise InvalidRequest(f"sq_bits {sq_bits} is not one of {sorted(SQ_TYPES)}")
        qtype = SQ_TYPES[sq_bits or 8]
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
    # Squared in place in a float64 copy, then summed. Not einsum: it takes more of the
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


def serialize_frame(index: faiss.Index) -> codec.Frame:
    """``index`` serialised as the pieces faiss writes it in (one copy of its lists, never
    joined: a snapshot seals them chunk by chunk)."""
    pieces: list[bytes] = []
    faiss.write_index(index, faiss.PyCallbackIOWriter(pieces.append, 1 << 20))
    return codec.Frame(pieces)


def deserialize(buf: np.ndarray) -> faiss.IndexIVF:
    view = np.ascontiguousarray(buf, dtype=np.uint8).data.cast("B")
    return read_index(codec.Reader([view]), len(view))


def read_index(reader: codec.Reader, nbytes: int) -> faiss.IndexIVF:
    """The index serialised in the next ``nbytes`` of ``reader``."""
    # read_index returns the concrete, owning IVF class; extract_index_ivf would hand back a
    # non-owning view whose owner could be collected under it. It reads through a callback:
    # deserialize_index first copies all of a buffer into a zero-filled vector, which took as
    # long again as the read at 1.5 GB (docs/performance.md, scale), and a snapshot read
    # chunk by chunk is never one buffer.
    left = nbytes

    def read(size: int) -> bytes:
        nonlocal left
        chunk = reader.read(min(size, left))
        left -= len(chunk)
        return bytes(chunk)

    index = faiss.read_index(faiss.PyCallbackIOReader(read, 1 << 20))
    if left:
        raise ValueError("the serialised index is shorter than its frame says")
    if not isinstance(index, faiss.IndexIVF):
        raise ValueError("template is not an IVF index")
    return index


def centroids_of(index: faiss.IndexIVF) -> np.ndarray:
    return index.quantizer.reconstruct_n(0, index.nlist)


class PartitionIndex:
    """A faiss IVF index with integer labels, per-list radii and preassigned search.

    Removing or reconstructing an item needs the list that holds its label. faiss can keep
    that map itself (``DirectMap.Hashtable``), but its hash table holds several times the
    resident bytes per vector of the map here, allocated node by node, whose nodes are left
    scattered over the heap when a training swap frees the old lists. Here the map is
    :attr:`list_of`, 4 bytes per label, and an item's offset is found by scanning its one
    list; faiss keeps no map (``NoMap``).
    """

    def __init__(self, index: faiss.IndexIVF, radii: np.ndarray | None = None):
        self.index = index
        if index.direct_map.type != faiss.DirectMap.NoMap:  # a snapshot written with one
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        self.radii = radii if radii is not None else np.zeros(index.nlist, dtype=np.float32)
        self.list_of = np.empty(0, dtype=np.int32)  # label -> list number, -1: not here
        self._sizes: np.ndarray | None = None  # items per list, until list_of changes
        self._offset_of: tuple[int, np.ndarray] | None = None  # (generation, label -> place)
        self.generation = next(GENERATIONS)  # a new one at every change (actors.engine.selection)
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

    @property
    def is_flat(self) -> bool:
        return isinstance(self.index, faiss.IndexIVFFlat)

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
        resident. Within a list the entries are in label order, as :meth:`add` leaves items
        added in label order."""
        if self.ntotal:
            raise ValueError("fill needs an empty partition")
        if len(labels) == 0:
            return
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        x = np.asarray(x, dtype=np.float32)
        lists = np.concatenate(
            [self._nearest_lists(x[i : i + batch]) for i in range(0, len(x), batch)]
        )
        order = np.lexsort((labels, lists))  # by list, by label within a list
        lists, labels = lists[order], labels[order]
        invlists = self.index.invlists
        for a, b in _runs(lists):  # each list sized once, its entries written in place
            list_no = int(lists[a])
            invlists.resize(list_no, b - a)
            self._ids(list_no)[:] = labels[a:b]
            codes = self._codes(list_no)
            if self.is_flat:  # codes are the vectors themselves
                np.take(x, order[a:b], axis=0, out=codes.view(np.float32), mode="clip")
            else:
                rows = np.ascontiguousarray(x[order[a:b]], dtype=np.float32)
                self.index.encode_vectors(
                    b - a, swig_ptr(rows), swig_ptr(lists[a:b]), swig_ptr(codes)
                )
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
        if len(groups) > constants.PER_LIST_REMOVE_MAX:
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
        self.generation = next(GENERATIONS)
        self.churn += len(labels)

    def needs_layout(self) -> bool:
        """Enough adds and removals since the last exact layout to make :meth:`laid_out`
        worth its copy."""
        return self.churn >= max(
            constants.LISTS_COMPACT_MIN, constants.LISTS_COMPACT_SHARE * self.ntotal
        )

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
        self._sizes = None
        self.generation = next(GENERATIONS)

    def reconstruct(self, labels: np.ndarray) -> np.ndarray:
        """The stored vectors of ``labels`` (which must all be in the index), decoded."""
        labels = np.asarray(labels, dtype=np.int64)
        out = np.empty((len(labels), self.dimension), dtype=np.float32)
        places = self._places() if len(labels) >= constants.RECONSTRUCT_MAP_MIN else None
        for list_no, rows in self._groups(labels):
            at = labels[rows]
            offsets = places[at] if places is not None else self._offsets(list_no, at)
            if self.is_flat:  # codes are the vectors themselves
                out[rows] = self._codes(list_no).view(np.float32)[offsets]
            else:
                for row, offset in zip(rows.tolist(), offsets.tolist()):
                    self.index.reconstruct_from_offset(list_no, offset, swig_ptr(out[row]))
        return out

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every entry's label and vector (decoded), list by list: with flat lists one copy of
        each list, no label looked up."""
        if not self.is_flat:
            labels = self.all_labels()
            return labels, self.reconstruct(labels)
        sizes = [self.index.invlists.list_size(list_no) for list_no in range(self.nlist)]
        labels = np.empty(sum(sizes), dtype=np.int64)
        vectors = np.empty((len(labels), self.dimension), dtype=np.float32)
        at = 0
        for list_no, size in enumerate(sizes):
            if size:
                labels[at : at + size] = self._ids(list_no)
                vectors[at : at + size] = self._codes(list_no).view(np.float32)
                at += size
        return labels, vectors

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
        self.generation = next(GENERATIONS)

    def _groups(self, labels: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(list number, rows of ``labels`` in that list) for each list holding some."""
        if len(labels) and (labels.max() >= len(self.list_of) or labels.min() < 0):
            raise KeyError("label not in this partition")
        lists = self.list_of[labels]
        if (lists < 0).any():
            raise KeyError("label not in this partition")
        order = np.argsort(lists, kind="stable")
        return [(int(lists[order[a]]), order[a:b]) for a, b in _runs(lists[order])]

    def _places(self) -> np.ndarray:
        """Every label's place in its list, kept until the lists next change."""
        if self._offset_of is None or self._offset_of[0] != self.generation:
            places = np.zeros(len(self.list_of), dtype=np.int64)
            for list_no in range(self.nlist):
                ids = self._ids(list_no)
                places[ids] = np.arange(len(ids))
            self._offset_of = (self.generation, places)
        return self._offset_of[1]

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
        order = (
            locality_order(list_nos, self.list_rank)
            if n >= constants.LOCALITY_MIN_QUERIES
            else None
        )
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


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal values in a sorted array of list numbers (>= 0)."""
    starts = np.flatnonzero(np.diff(values, prepend=-1)).tolist()
    return list(zip(starts, [*starts[1:], len(values)]))
