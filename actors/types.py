"""Data that crosses Ray between the gateway, the control plane and the shards.

Frozen dataclasses holding numpy arrays; never an HTTP request object.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from actors.filters import FilterNode
from actors.strings import StringBlock

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
    sq_bits: int | None = None  # ivf: 8 (None) or 16 (half precision)
    embedding_model: str | None = None
    n_lists_requested: int | None = None  # given at create time; None = automatic
    # Training state. version 0 = untrained (exact search); each training swap bumps it.
    version: int = 0
    n_lists: int = 1
    trained_size: int = 0
    # (top_k, n_probes) pairs from calibration, ascending top_k.
    nprobe_table: tuple[tuple[int, int], ...] = ()
    recall_target: float = 0.95

    @property
    def is_trained(self) -> bool:
        return self.version > 0

    def to_json(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["nprobe_table"] = [list(p) for p in self.nprobe_table]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IndexConfig:
        d = dict(d)
        d["nprobe_table"] = tuple(tuple(p) for p in d.get("nprobe_table", ()))
        return cls(**d)

    def evolve(self, **changes: Any) -> IndexConfig:
        return replace(self, **changes)

    def auto_nprobe(self, top_k: int) -> int:
        return auto_nprobe(self.nprobe_table, self.n_lists, top_k)


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


@dataclass(frozen=True)
class IndexMeta:
    """The plaintext catalog entry: enough to list an index and verify a key, nothing more."""

    name: str
    index_id: str
    salt: bytes
    verifier: bytes


@dataclass(frozen=True)
class UpsertBatch:
    ids: tuple[str, ...]
    vectors: np.ndarray  # (n, d) float32, in index space (unit-normalised for cosine)
    norms: np.ndarray | None  # (n,) float32 original norms (cosine only)
    metadata: tuple[bytes | None, ...]  # orjson-encoded metadata documents
    contents: tuple[str | None, ...]


@dataclass(frozen=True)
class SearchRequest:
    queries: np.ndarray  # (nq, d) float32 in index space
    k: int
    version: int
    list_nos: np.ndarray  # (nq, nprobe) int64 coarse assignment by the gateway
    coarse_dis: np.ndarray  # (nq, nprobe) float32
    filter: FilterNode | None = None
    greedy: bool = False
    with_metadata: bool = True
    # The caller's explicit n_probes (0 = automatic): what a shard uses when it holds another
    # training version than the gateway planned with and must assign the lists itself.
    n_probes: int = 0


@dataclass(frozen=True)
class SearchResult:
    distances: np.ndarray  # (nq, k) float32 squared L2 in index space; +inf where empty
    ids: StringBlock  # (nq, k) str or None
    metadata: np.ndarray | None  # (nq, k) object: bytes (JSON) or None
    version: int


@dataclass(frozen=True)
class Fetched:
    ids: list[str]
    vectors: np.ndarray | None  # (n, d) float32 originals (ivfflat only)
    metadata: list[bytes | None] | None
    contents: list[str | None] | None


@dataclass(frozen=True)
class ShardStats:
    count: int
    version: int


def to_wire(obj: Any) -> bytes:
    """Encode a request/result for a shard call once, as bytes: Ray passes bytes through without
    its per-object serializer, which is measurably slower for small numpy-carrying dataclasses,
    and a fan-out sends the same bytes to every shard."""
    return pickle.dumps(obj, protocol=5)


def from_wire(data: bytes) -> Any:
    return pickle.loads(data)


def shard_of(item_id: str, n_shards: int) -> int:
    """Stable placement: the same id lands on the same shard in every process and release."""
    digest = hashlib.blake2b(item_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_shards


def shard_assignment(ids: list[str], n_shards: int) -> np.ndarray:
    return np.fromiter((shard_of(i, n_shards) for i in ids), dtype=np.int64, count=len(ids))
