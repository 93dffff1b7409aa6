"""A request's parameters, validated and defaulted once, whatever the transport.

Every route (JSON, CyborgDB's binary form, vaultvec's compact arrays) and the Ray transport
build one :class:`QueryParams` or :class:`UpsertRows` from what it decoded; the defaults, the
limits and the error messages live here and nowhere else. serve_app.service then runs them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from actors.engine.filters import FilterNode, parse_filter
from actors.errors import InvalidRequest
from serve_app.gateway.hits import Query
from serve_app.models import UpsertRequest

DEFAULT_TOP_K = 100
MAX_RERANK_MULT = 100  # candidates per result a query may ask to rerank (rerank_mult)
DEFAULT_QUERY_INCLUDE = ("distance", "metadata")
QUERY_INCLUDE = ("distance", "metadata", "vector", "contents")  # JSON and binary answers
COMPACT_INCLUDE = ("distance", "metadata")  # the compact answer (arrays route, Ray transport)
GET_INCLUDE = ("vector", "contents", "metadata")


@dataclass(frozen=True)
class Limits:
    """The configured request limits (Settings.max_*); every transport checks the same."""

    ids: int = 100_000
    items: int = 100_000
    id_length: int = 1024
    metadata_bytes: int = 65_536
    metadata_depth: int = 32
    contents_bytes: int = 1 << 20

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """The limits of a replica's settings (built once per settings object)."""
        cached = _LIMITS.get(id(settings))
        if cached is not None and cached[0] is settings:
            return cached[1]
        limits = cls(
            ids=settings.max_ids_per_request,
            items=settings.max_items_per_upsert,
            id_length=settings.max_id_length,
            metadata_bytes=settings.max_metadata_bytes,
            metadata_depth=settings.max_metadata_depth,
            contents_bytes=settings.max_contents_bytes,
        )
        _LIMITS[id(settings)] = (settings, limits)
        return limits

    def check_ids(self, ids: Sequence[str], field: str = "ids") -> None:
        if len(ids) > self.ids:
            raise InvalidRequest(
                f"{field} holds {len(ids)} ids; the limit is {self.ids} (VAULTVEC_MAX_IDS_PER_REQUEST)"
            )

    def encode_metadata(self, m: Any, at: int) -> bytes | None:
        """One item's metadata -> stored JSON, within the depth and size limits."""
        if m is None:
            return None
        if not isinstance(m, dict):
            raise InvalidRequest(f"item {at}: metadata must be a JSON object or null")
        if nesting(m, self.metadata_depth) > self.metadata_depth:
            raise InvalidRequest(
                f"item {at}: metadata is nested deeper than {self.metadata_depth} levels "
                "(VAULTVEC_MAX_METADATA_DEPTH)"
            )
        try:
            blob = orjson.dumps(m)
        except TypeError:  # orjson.JSONEncodeError
            raise InvalidRequest(f"item {at}: metadata must be JSON-serialisable") from None
        if len(blob) > self.metadata_bytes:
            raise InvalidRequest(
                f"item {at}: metadata is {len(blob)} bytes as JSON; the limit is "
                f"{self.metadata_bytes} (VAULTVEC_MAX_METADATA_BYTES)"
            )
        return blob

    def check_items(self, ids: Sequence[str], contents: Sequence[str | None]) -> None:
        """Item count, id lengths and contents sizes of an upsert."""
        if len(ids) > self.items:
            raise InvalidRequest(
                f"the upsert holds {len(ids)} items; the limit is {self.items} "
                "(VAULTVEC_MAX_ITEMS_PER_UPSERT)"
            )
        for i, item_id in enumerate(ids):
            if not isinstance(item_id, str) or not 1 <= len(item_id) <= self.id_length:
                raise InvalidRequest(
                    f"item {i}: ids must be strings of 1 to {self.id_length} characters "
                    "(VAULTVEC_MAX_ID_LENGTH)"
                )
        for i, text in enumerate(contents):
            # A character is at most 4 UTF-8 bytes: only long texts need encoding.
            if text is not None and 4 * len(text) > self.contents_bytes:
                size = len(text.encode("utf-8", "surrogatepass"))
                if size > self.contents_bytes:
                    raise InvalidRequest(
                        f"item {ids[i]!r}: contents are {size} bytes; the limit is "
                        f"{self.contents_bytes} (VAULTVEC_MAX_CONTENTS_BYTES)"
                    )


_LIMITS: dict[int, tuple[Any, Limits]] = {}


def nesting(value: Any, stop: int) -> int:
    """How deeply ``value``'s objects and arrays nest (1 = a flat object), counted without
    recursion and only up to ``stop + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop:
            return deepest
        stack.extend((c, depth + 1) for c in children)
    return deepest


@dataclass(frozen=True)
class Fields:
    """What an answer carries beside each id. ``distance`` selects it in the compact answer
    only: every JSON query result has its distance (CyborgDB's clients rely on it)."""

    distance: bool
    metadata: bool
    vector: bool
    contents: bool

    @classmethod
    def parse(cls, include: Sequence[str], accepted: Collection[str]) -> Fields:
        """The fields ``include`` names; 422 naming a value ``accepted`` does not hold."""
        unknown = set(include) - set(accepted)
        if unknown:
            raise InvalidRequest(f"include: unknown value {sorted(unknown)[0]!r}")
        inc = set(include)
        return cls("distance" in inc, "metadata" in inc, "vector" in inc, "contents" in inc)


def get_fields(include: Sequence[str] | None) -> Fields:
    """A get's fields; omitted = every field. ``vector`` is left out of an item whose shard
    keeps no original (an ivf/ivfpq partition trained before it kept them): never an error,
    as CyborgDB's SDKs always ask for it."""
    return Fields.parse(GET_INCLUDE if include is None else include, GET_INCLUDE)


def distinct(ids: Sequence[str]) -> list[str]:
    """``ids`` with repeats dropped, first occurrence kept (a get answers each id once)."""
    return list(dict.fromkeys(ids))


def unique_ids(ids: Sequence[str], field: str = "ids") -> None:
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise InvalidRequest(f"{field} contains the id {dup!r} more than once")
    if any(not i for i in ids):
        raise InvalidRequest(f"{field} contains an empty id")


class QueryFields(Protocol):
    """A query's options as a transport received them (None = the default): the pydantic
    bodies of the JSON, binary and arrays routes, and :class:`QueryArgs`."""

    @property
    def index_name(self) -> str: ...
    @property
    def index_key(self) -> str | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def n_probes(self) -> int | None: ...
    @property
    def rerank_mult(self) -> int | None: ...
    @property
    def filters(self) -> Any: ...
    @property
    def greedy(self) -> bool | None: ...
    @property
    def include(self) -> Sequence[str] | None: ...


@dataclass(frozen=True)
class QueryArgs:
    """The query options of a call that has no request body (the Ray transport)."""

    index_name: str
    index_key: str | None
    top_k: int | None = None
    n_probes: int | None = None
    filters: Any = None
    greedy: bool | None = None
    include: Sequence[str] | None = None
    rerank_mult: int | None = None


@dataclass(frozen=True)
class QueryParams:
    """One query's parameters: validated, defaults applied, the filter parsed."""

    index_name: str
    index_key: str | None
    top_k: int
    n_probes: int  # 0 = automatic
    filter: FilterNode | None
    greedy: bool
    fields: Fields  # as asked (a shard leaves out a vector it does not keep)
    rerank_mult: int = 0  # 0 = the partition's default (actors.constants.RERANK_MULT)

    @classmethod
    def of(
        cls, body: QueryFields, settings: Any, accepted: Collection[str] = QUERY_INCLUDE
    ) -> QueryParams:
        """``body``'s parameters under ``settings`` (max_top_k); ``accepted``: the include
        values the transport's answer can carry."""
        top_k = DEFAULT_TOP_K if body.top_k is None else body.top_k
        if not 1 <= top_k <= settings.max_top_k:
            raise InvalidRequest(f"top_k must be between 1 and {settings.max_top_k}")
        include = DEFAULT_QUERY_INCLUDE if body.include is None else body.include
        fields = Fields.parse(include, accepted)
        if body.n_probes is not None and body.n_probes < 0:
            raise InvalidRequest("n_probes must be >= 0 (0 = automatic)")
        node = parse_filter(body.filters)
        n_probes, greedy = body.n_probes or 0, bool(body.greedy)
        rerank = body.rerank_mult or 0
        if not 0 <= rerank <= MAX_RERANK_MULT:
            raise InvalidRequest(f"rerank_mult must be between 1 and {MAX_RERANK_MULT}")
        return cls(body.index_name, body.index_key, top_k, n_probes, node, greedy, fields, rerank)

    @property
    def query(self) -> Query:
        """The engine's form of these parameters."""
        return Query(
            self.top_k,
            self.n_probes,
            self.filter,
            self.greedy,
            self.fields.metadata,
            self.rerank_mult,
        )


# An upsert's vectors: a (n, d) float32 matrix, or (JSON items) each item's vector, None where
# the item's contents are to be embedded once the index's model is known.
ItemVectors = Sequence[Sequence[float] | None]


class Columns(Protocol):
    """An upsert as column lists beside a decoded matrix: the arrays body, :class:`UpsertArgs`."""

    @property
    def index_name(self) -> str: ...
    @property
    def index_key(self) -> str | None: ...
    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def metadata(self) -> Sequence[Any] | None: ...
    @property
    def contents(self) -> Sequence[str | None] | None: ...


@dataclass(frozen=True)
class UpsertArgs:
    """The columns of the binary form's batch and of the Ray transport's upsert."""

    index_name: str
    index_key: str | None
    ids: Sequence[str]
    metadata: Sequence[Any] | None = None
    contents: Sequence[str | None] | None = None


@dataclass(frozen=True)
class UpsertRows:
    """One upsert's rows: within the Limits, metadata encoded as stored, contents per row."""

    index_name: str
    index_key: str | None
    ids: list[str]
    vectors: np.ndarray | ItemVectors
    metadata: list[bytes | None]  # stored JSON
    contents: list[str | None]
    field: str = "vectors"  # how errors name the vectors

    @classmethod
    def of_items(cls, body: UpsertRequest, settings: Any) -> UpsertRows:
        """The JSON route's items: vectors or contents to embed."""
        limits = Limits.of(settings)
        items = body.items
        ids, contents = [it.id for it in items], [it.contents for it in items]
        limits.check_items(ids, contents)
        metadata = [limits.encode_metadata(it.metadata, i) for i, it in enumerate(items)]
        vectors = [it.vector for it in items]
        return cls(
            body.index_name, body.index_key, ids, vectors, metadata, contents, "items vectors"
        )

    @classmethod
    def of_columns(cls, cols: Columns, x: np.ndarray, settings: Any) -> UpsertRows:
        """Column lists with the decoded (n, d) matrix ``x`` (already finite and 2-D)."""
        ids = list(cols.ids)
        n = len(ids)
        if x.shape[0] != n:
            raise InvalidRequest(f"vectors has {x.shape[0]} rows for {n} ids")
        metadata, contents = cols.metadata, cols.contents
        for name, column in (("metadata", metadata), ("contents", contents)):
            if column is not None and len(column) != n:
                raise InvalidRequest(f"{name} has {len(column)} entries for {n} ids")
        if contents is not None and any(c is not None and not isinstance(c, str) for c in contents):
            raise InvalidRequest("contents must be strings or null")
        cont: list[str | None] = [None] * n if contents is None else list(contents)
        limits = Limits.of(settings)
        limits.check_items(ids, cont)
        meta: list[bytes | None] = [None] * n
        if metadata is not None:
            meta = [limits.encode_metadata(m, i) for i, m in enumerate(metadata)]
        return cls(cols.index_name, cols.index_key, ids, x, meta, cont)
