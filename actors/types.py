"""Data that crosses Ray between the gateway, the control plane and the shards.

Frozen dataclasses holding numpy arrays; never an HTTP request object.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from actors.engine.filters import FilterNode
from actors.engine.strings import StringBlock

INDEX_TYPES = ("ivfflat", "ivf", "ivfpq")
METRICS = ("euclidean", "squared_euclidean", "cosine")


@dataclass(frozen=True)
class IndexConfig:
    """Everything about an index but its data. Stored encrypted with the index's data key."""

    name: str
    index_id: str
    index_type: str
    metric: str
    n_shards: int
    dimension: int | None = None
    pq_dim: int | None = None
    pq_bits: int | None = None
    sq_bits: int | None = None  # ivf: bits a dimension, 4, 6, 8 (None), 12 or 16 (ivf.SQ_TYPES)
    embedding_model: str | None = None
    n_lists_requested: int | None = None  # given at create time; None = automatic
    # Training state. version 0 = untrained (exact search); each training swap bumps it.
    version: int = 0
    n_lists: int = 1
    trained_size: int = 0
    # (top_k, n_probes) pairs from calibration, ascending top_k.
    nprobe_table: tuple[tuple[int, int], ...] = ()
    recall_target: float = 0.95
    # Automatic probing (actors.engine.adaptive): (top_k, first, slack unfiltered,
    # slack under a 10% filter) from calibration, ascending top_k; empty (an index trained
    # before it existed) = the fixed table.
    probe_table: tuple[tuple[int, int, float, float], ...] = ()
    # The key epoch (IndexMeta.epoch) whose data key seals this config and the templates: it
    # says where they are stored (actors.storage.persistence.epoch_prefix).
    key_epoch: int = 0
    # CyborgDB's metadata_schema: (field, filterable, pattern, full_text) per field named at
    # create time; the others are filterable without pattern (serve_app.service.schema).
    metadata_schema: tuple[tuple[str, bool, bool, bool], ...] = ()
    # BM25 (k1, b) when a field is full_text (actors.engine.fulltext); None otherwise.
    bm25: tuple[float, float] | None = None

    @property
    def full_text_fields(self) -> tuple[str, ...]:
        return tuple(name for name, _, _, full_text in self.metadata_schema if full_text)

    @property
    def is_trained(self) -> bool:
        return self.version > 0

    def to_json(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["nprobe_table"] = [list(p) for p in self.nprobe_table]
        d["probe_table"] = [list(p) for p in self.probe_table]
        d["metadata_schema"] = [list(p) for p in self.metadata_schema]
        d["bm25"] = None if self.bm25 is None else list(self.bm25)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IndexConfig:
        d = dict(d)
        d["nprobe_table"] = tuple(tuple(p) for p in d.get("nprobe_table", ()))
        d["probe_table"] = tuple(
            (int(k), int(f), float(a), float(b)) for k, f, a, b in d.get("probe_table", ())
        )
        d["metadata_schema"] = tuple(
            (str(n), bool(f), bool(p), bool(t)) for n, f, p, t in d.get("metadata_schema", ())
        )
        bm25 = d.get("bm25")
        d["bm25"] = None if bm25 is None else (float(bm25[0]), float(bm25[1]))
        return cls(**d)

    def evolve(self, **changes: Any) -> IndexConfig:
        return replace(self, **changes)

    def auto_nprobe(self, top_k: int) -> int:
        return auto_nprobe(self.nprobe_table, self.n_lists, top_k)

    def auto_probing(self, top_k: int) -> tuple[int, tuple[float, float]] | None:
        """(first, (slack unfiltered, slack under a 10% filter)) of automatic probing for
        ``top_k`` results; None: use the fixed table.

        Past the largest calibrated top_k, ``first`` grows with sqrt(top_k) as the fixed
        n_probes does and the slacks stay (the k-th distance they multiply grows by itself)."""
        if not self.probe_table or not self.is_trained:
            return None
        for k, first, slack, slack_filtered in self.probe_table:
            if top_k <= k:
                return min(first, self.n_lists), (slack, slack_filtered)
        k_max, first_max, slack, slack_filtered = self.probe_table[-1]
        first = int(np.ceil(first_max * np.sqrt(top_k / k_max)))
        return min(max(first, first_max), self.n_lists), (slack, slack_filtered)


def auto_nprobe(table: tuple[tuple[int, int], ...], n_lists: int, top_k: int) -> int:
    """n_probes for a query of ``top_k`` results, from a calibration table."""
    if not table:
        return n_lists
    for k, nprobe in table:
        if top_k <= k:
            return min(nprobe, n_lists)
    k_max, nprobe_max = table[-1]
    scaled = int(np.ceil(nprobe_max * np.sqrt(top_k / k_max)))
    return min(max(scaled, nprobe_max), n_lists)


@dataclass(frozen=True, repr=False)
class BackupSource:
    """Where the chunks of a restore come from (actors.engine.shard_backup): the backed-up
    index's name, the backup's id, and that index's data key, which opens them."""

    index_name: str
    backup_id: str
    data_key: bytes

    def __repr__(self) -> str:  # never the key
        return f"BackupSource({self.index_name!r}, {self.backup_id!r})"


@dataclass(frozen=True)
class KeyRotation:
    """A key rotation under way (actors.control.rotation): the next key epoch's salt and verifier."""

    salt: bytes
    verifier: bytes


@dataclass(frozen=True)
class UserGrant:
    """One user of an index (actors.storage.users): its rights, the check of its key, and the
    index's data key wrapped under its key (and its key's KEK escrowed under the data key, for
    rotations). Holds nothing that opens the index without the user's key or the index key."""

    user_id: str
    rights: tuple[str, ...]  # sorted, from ("read", "write")
    salt: bytes
    verifier: bytes
    wrapped: bytes
    escrow: bytes

    def __repr__(self) -> str:
        return f"UserGrant({self.user_id!r}, {self.rights!r})"


@dataclass(frozen=True)
class IndexMeta:
    """The plaintext catalog entry: enough to list an index, verify a key and find its
    partitions, nothing more."""

    name: str
    index_id: str
    salt: bytes
    verifier: bytes
    # Per shard number, the pool actor hosting that partition (actors.pool); chosen by the
    # control plane at creation, empty until then.
    placement: tuple[str, ...] = ()
    # Key epoch: each key rotation moves the index to the next one; ``salt`` and ``verifier``
    # are this epoch's, and its blobs live under actors.storage.persistence.epoch_prefix.
    epoch: int = 0
    rotation: KeyRotation | None = None  # set while a rotation to epoch + 1 is under way
    retired_epoch: int = -1  # >= 0: an earlier epoch whose blobs are still being deleted
    owner: str = ""  # the name of the API key that created it (quotas); "" before names
    users: tuple[UserGrant, ...] = ()  # per-index user keys (actors.storage.users)
    # The id of the backup being restored into the index (serve_app.service.backups): until the
    # restore commits, the index answers nothing but the restore and its deletion.
    restoring: str = ""


@dataclass(frozen=True)
class Partition:
    """One shard of one index, as a pool actor hosts it: the unit of placement."""

    name: str
    index_id: str
    shard_no: int

    def encode(self) -> str:
        """The form a call to a pool actor carries (:class:`actors.pool.client.ShardClient`): Ray
        passes a str argument for less per call than the dataclass, counting both ends (figures:
        docs/performance.md; benchmarks/shard_hop.py)."""
        return f"{self.shard_no}:{self.index_id}:{self.name}"

    @staticmethod
    def of(p: Partition | str) -> Partition:
        """``p``, or the partition :meth:`encode` gave ``p``."""
        if isinstance(p, Partition):
            return p
        shard_no, index_id, name = p.split(":", 2)
        return Partition(name, index_id, int(shard_no))


@dataclass(frozen=True)
class UpsertBatch:
    ids: tuple[str, ...]
    vectors: np.ndarray  # (n, d) float32, in index space (unit-normalised for cosine)
    norms: np.ndarray | None  # (n,) float32 original norms (cosine only)
    metadata: tuple[bytes | None, ...]  # orjson-encoded metadata documents
    contents: tuple[str | None, ...]

    def rows(self, start: int, stop: int) -> UpsertBatch:
        """Items ``start`` to ``stop`` (the arrays as views)."""
        return UpsertBatch(
            ids=self.ids[start:stop],
            vectors=self.vectors[start:stop],
            norms=None if self.norms is None else self.norms[start:stop],
            metadata=self.metadata[start:stop],
            contents=self.contents[start:stop],
        )


PROBING_MODES = ("fixed", "adaptive", "measure", "greedy")


@dataclass(frozen=True)
class Probing:
    """How a shard probes its lists for a search (actors.engine.search has a strategy for each
    mode):

    - ``fixed``: the planned lists, as given. ``n_probes`` is the caller's explicit n_probes (0:
      the calibrated table), which a shard holding another training version than the gateway
      planned with uses to assign the lists itself;
    - ``adaptive``: scan ``first`` of the planned lists, then those the slack admits; slacks and
      the gateway's scales for (unfiltered, a filter matching <= 10%): see :func:`probe_slack`.
      A kind whose ``fixed`` is not 0 scans a fixed count of lists instead, that multiple of
      ``first`` (:func:`fixed_lists`), where the gateway measured it cheaper for its recall;
    - ``measure``: answer exactly and tell what each result needed: the slack (the same
      ``first``) and the lists in centroid order; and per query the lists the adaptive rule
      scans at each of :data:`REACH_SCALES`;
    - ``greedy``: probe in centroid order until no list can hold a closer item.
    """

    mode: str = "fixed"
    n_probes: int = 0
    first: int = 0
    slacks: tuple[float, float] = (0.0, 0.0)
    scales: tuple[float, ...] = (1.0, 1.0, 1.0)
    fixed: tuple[float, ...] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        if self.mode not in PROBING_MODES:
            raise ValueError(f"probing mode {self.mode!r} is not one of {PROBING_MODES}")


FIXED = Probing()


@dataclass(frozen=True)
class SearchRequest:
    queries: np.ndarray  # (nq, d) float32 in index space
    k: int
    version: int  # the training version the gateway planned with
    list_nos: np.ndarray  # (nq, nprobe) int64 coarse assignment by the gateway
    coarse_dis: np.ndarray  # (nq, nprobe) float32
    filter: FilterNode | None = None
    with_metadata: bool = True
    probing: Probing = FIXED
    rerank_mult: int = 0  # candidates per result reranked by full vectors; 0 = the default


@dataclass(frozen=True)
class SearchResult:
    distances: np.ndarray  # (nq, k) float32 squared L2 in index space; +inf where empty
    ids: StringBlock  # (nq, k) str or None
    metadata: np.ndarray | None  # (nq, k) object: bytes (JSON) or None
    version: int
    lists_scanned: int = 0  # inverted lists this shard scanned, summed over the queries
    # measure requests: per result, the probing scale that finds it (nan: no result), and
    # which scale the shard applied (selectivity bucket of probe_slack)
    needed: np.ndarray | None = None
    bucket: int = 0
    matched: int = 0  # live items on this shard that the filter matches (all, without one)
    # measure requests: per result, the lists in centroid order that find it (its list's rank
    # + 1; nan: no result); per query, the lists the adaptive rule scans at REACH_SCALES
    lists_needed: np.ndarray | None = None
    reach: np.ndarray | None = None


# Kinds of query whose probing scale the gateway fits apart (serve_app.gateway.probing): 0 unfiltered
# (or a filter matching at least BROAD of the items), 1 a broad filter, 2 a selective one
# (matching less than SELECTIVE); and EXACT_SCAN, queries a shard answered by an exact scan of
# the items their filter matches, which no scale applies to.
BROAD, SELECTIVE = 0.95, 0.3
BUCKETS = ("unfiltered", "broad_filter", "selective_filter", "exact_scan")
EXACT_SCAN = 3
# The probing scales at which a measured query tells the lists the adaptive rule would scan
# (SearchResult.reach): 2^-6 to 2^6 in quarter powers of two.
REACH_SCALES = tuple(2.0 ** (i / 4) for i in range(-24, 25))


def fixed_lists(multiple: float, first: int) -> int:
    """Lists a kind probed with a fixed count scans: ``multiple`` times ``first``, rounded
    down (a fitted multiple lies a hair above the lists its queries needed)."""
    return max(1, math.floor(multiple * first + 1e-9))


def probe_slack(
    slacks: tuple[float, float], scales: tuple[float, ...], selectivity: float
) -> tuple[float, float, int]:
    """(slack, calibrated slack, bucket) for a query whose filter matches ``selectivity`` of
    the items: the calibrated slack interpolated on log10(selectivity) between the unfiltered
    one (1) and the 10% one (0.1, and below), times the gateway's scale for its bucket."""
    w = min(max(-math.log10(max(selectivity, 1e-12)), 0.0), 1.0)
    a, b = slacks
    base = math.exp((1 - w) * math.log(max(a, 1e-12)) + w * math.log(max(b, 1e-12)))
    bucket = 0 if selectivity >= BROAD else 1 if selectivity >= SELECTIVE else 2
    return base * scales[bucket], base, bucket


@dataclass(frozen=True)
class Fetched:
    ids: list[str]
    vectors: np.ndarray | None  # (n, d) float32 originals (None where not kept)
    metadata: list[bytes | None] | None
    contents: list[str | None] | None


@dataclass(frozen=True)
class TextStats:
    """One full-text field's collection statistics on a shard (or summed over an index): items
    with at least one term in it, their terms in all, and how many hold each query term."""

    docs: int
    length: int
    df: tuple[int, ...]

    def __add__(self, other: TextStats) -> TextStats:
        df = tuple(a + b for a, b in zip(self.df, other.df, strict=True))
        return TextStats(self.docs + other.docs, self.length + other.length, df)


@dataclass(frozen=True)
class TextQuery:
    """A BM25 search (actors.engine.fulltext): the query's distinct terms in the given fields,
    each field's score weighted; the best ``k`` (None: every match) among the items
    ``filter`` matches."""

    fields: tuple[str, ...]
    weights: tuple[float, ...]
    terms: tuple[str, ...]
    k1: float
    b: float
    require_all: bool = False
    filter: FilterNode | None = None
    k: int | None = None
    # Per field, the index-wide statistics (a sharded index); None: the shard's own.
    stats: tuple[TextStats, ...] | None = None
    with_metadata: bool = False


@dataclass(frozen=True)
class TextHits:
    """A shard's (or the merged) best BM25 matches, descending score, ties by id."""

    ids: list[str]
    scores: list[float]
    metadata: list[bytes | None] | None = None


@dataclass(frozen=True)
class ShardStats:
    count: int
    version: int
    resident_bytes: int = 0  # what the loaded partition holds (Shard.resident_bytes)


@dataclass(frozen=True)
class PoolStats:
    """One pool actor's memory: its budget, idle TTL, resident size and partitions."""

    name: str
    node_id: str
    budget_bytes: int
    idle_ttl_s: float
    rss_bytes: int
    partitions: int  # hosted (loaded or not)
    loaded: int
    loaded_bytes: int  # Shard.resident_bytes summed over the loaded partitions
    evictions: int


def shard_of(item_id: str, n_shards: int) -> int:
    """Stable placement: the same id lands on the same shard in every process and release."""
    digest = hashlib.blake2b(item_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_shards


def shard_assignment(ids: list[str], n_shards: int) -> np.ndarray:
    return np.fromiter((shard_of(i, n_shards) for i in ids), dtype=np.int64, count=len(ids))
