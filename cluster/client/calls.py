"""The client's requests, without I/O (shared by Client and AsyncClient).

Each operation becomes a ``Plan``: the HTTP calls to make (one, or several for a batch larger
than one request may carry) and how to combine their decoded answers. Batches of at least
``binary_threshold`` vectors go to vaultvec's compact array routes (``/v1/vectors/query_arrays``,
``/v1/vectors/upsert_arrays``: base64 little-endian float32 in, a counts array + flat ids +
base64 distances out); smaller ones, text queries, queries whose ``include`` asks for
``vector`` or ``contents`` (which only the JSON answer carries) and items without vectors
(embedded on the server by the index's ``embedding_model``) to the JSON routes. Answers are
decoded by cluster.client.results.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import orjson
import pybase64

from cluster.client.errors import InvalidRequestError
from cluster.client.results import (
    F32,
    JSON_ONLY_FIELDS,
    QueryResult,
    concat,
    decode_arrays_query,
    json_query_decoder,
    trim_single,
)

T = TypeVar("T")
DEFAULT_TOP_K = 100  # the server's default, for padding JSON answers
QUERY = "/v1/vectors/query"
QUERY_ARRAYS = "/v1/vectors/query_arrays"
UPSERT = "/v1/vectors/upsert"
UPSERT_ARRAYS = "/v1/vectors/upsert_arrays"


@dataclass(frozen=True)
class Call:
    path: str
    body: dict[str, Any] | None = None
    method: str = "POST"
    decode: Callable[[Any], Any] = field(default=lambda body: body)


@dataclass(frozen=True)
class Plan(Generic[T]):
    calls: list[Call]
    combine: Callable[[list[Any]], T]


def single(call: Call) -> Plan[Any]:
    return Plan([call], lambda parts: parts[0])


# -- encoding -------------------------------------------------------------------------------
def as_f32_matrix(vectors: Any) -> tuple[np.ndarray, bool]:
    """Any array-like of numbers -> (C-contiguous little-endian float32 (n, d), was 1-D)."""
    x = np.asarray(vectors)
    single_row = x.ndim == 1
    if single_row:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError("vectors must be one vector or a 2-D array of vectors")
    return np.ascontiguousarray(x, dtype=F32), single_row


def b64(x: np.ndarray) -> str:
    return pybase64.b64encode_as_string(np.ascontiguousarray(x, dtype=F32).data)


def chunks(n: int, rows: int) -> list[slice]:
    """``n`` rows in as few requests of at most ``rows`` as possible, of even size: requests
    sent concurrently finish together instead of waiting on one larger remainder."""
    parts = -(-n // max(1, rows))
    bounds = [n * i // parts for i in range(parts + 1)] if parts else [0]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def rows_per_request(dim: int, max_request_bytes: int, binary: bool) -> int:
    """Rows that fit in a request body: base64 float32 (binary) or JSON numbers, which orjson
    writes with up to ~20 characters each."""
    per_row = dim * 4 * 4 // 3 if binary else dim * 20
    return max(1, max_request_bytes // (per_row + 64))


def pack(sizes: Sequence[int], limit: int) -> list[slice]:
    """Consecutive runs of items whose sizes add up to at most ``limit`` (an item larger than
    ``limit`` goes alone): the requests of a batch whose rows differ in size."""
    parts, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            parts.append(slice(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        parts.append(slice(start, len(sizes)))
    return parts


def drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def refuse_split_duplicates(ids: list[str], parts: list[slice]) -> None:
    """The server refuses an id repeated within one upsert; requests split apart could not see
    it, so the client refuses it before sending anything."""
    if len(parts) > 1 and len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise InvalidRequestError(f"items ids contains the id {dup!r} more than once")


# -- queries --------------------------------------------------------------------------------
def query(
    index: dict[str, str],
    vectors: Any,
    contents: str | None,
    top_k: int | None,
    options: dict[str, Any],
    binary: bool | None,
    binary_threshold: int,
    max_request_bytes: int,
) -> Plan[QueryResult]:
    """A query by ``vectors`` (one 1-D vector or a 2-D batch) or by ``contents`` (one text,
    embedded on the server): exactly one of the two."""
    if (vectors is None) == (contents is None):
        raise ValueError("give exactly one of vectors and contents")
    params = drop_none(top_k=top_k, **options)
    include = params.get("include")
    json_only = sorted(JSON_ONLY_FIELDS.intersection(include or ()))
    if params.get("text"):
        json_only.append("hybrid scores")  # text: a hybrid query, answered on the JSON route
    if binary and json_only:
        raise ValueError(
            f"the compact array route cannot return {' or '.join(json_only)}: "
            "binary=True does not apply"
        )
    if contents is not None:
        return query_text(index, contents, top_k, params, binary)
    x, single_row = as_f32_matrix(vectors)
    if json_only:
        use_binary = False
    else:
        use_binary = binary if binary is not None else len(x) >= binary_threshold
    parts = chunks(len(x), rows_per_request(x.shape[1], max_request_bytes, use_binary))
    calls = []
    for part in parts:
        q = x[part]
        if use_binary:
            body = {**index, "query_vectors": b64(q), "shape": list(q.shape), **params}
            calls.append(Call(QUERY_ARRAYS, body, decode=decode_arrays_query))
        else:
            qv = q[0].tolist() if single_row else q.tolist()
            body = {**index, "query_vectors": qv, **params}
            k = top_k if top_k is not None else DEFAULT_TOP_K
            decode = json_query_decoder(len(q), k, single_row, include)
            calls.append(Call(QUERY, body, decode=decode))

    def combine(results: list[QueryResult]) -> QueryResult:
        r = results[0] if len(results) == 1 else concat(results)
        return trim_single(r) if single_row else r

    return Plan(calls, combine)


def query_text(
    index: dict[str, str],
    contents: str,
    top_k: int | None,
    params: dict[str, Any],
    binary: bool | None,
) -> Plan[QueryResult]:
    """One text query (``query_contents`` on the JSON route): flat results, like a 1-D vector."""
    if not isinstance(contents, str):
        raise TypeError(f"contents must be one query text (str), not {type(contents).__name__}")
    if binary:
        raise ValueError("a text query has no compact array form: binary=True does not apply")
    k = top_k if top_k is not None else DEFAULT_TOP_K
    body = {**index, "query_contents": contents, **params}
    decode = json_query_decoder(1, k, single_row=True, include=params.get("include"))
    call = Call(QUERY, body, decode=decode)
    return Plan([call], lambda parts: trim_single(parts[0]))


# -- upserts --------------------------------------------------------------------------------
def upsert(
    index: dict[str, str],
    ids: Sequence[str],
    vectors: Any,
    metadata: Sequence[dict[str, Any] | None] | None,
    contents: Sequence[str | None] | None,
    binary: bool | None,
    binary_threshold: int,
    max_request_bytes: int,
) -> Plan[int]:
    """Items with ``vectors`` (n, d), or, when ``vectors`` is None, items embedded on the server
    from their ``contents`` (the index needs an ``embedding_model``)."""
    ids = [str(i) for i in ids]
    for name, column in (("metadata", metadata), ("contents", contents)):
        if column is not None and len(column) != len(ids):
            raise ValueError(f"{len(column)} {name} entries for {len(ids)} ids")
    if vectors is None:
        return upsert_texts(index, ids, metadata, contents, binary, max_request_bytes)
    x, _ = as_f32_matrix(vectors)
    if len(ids) != len(x):
        raise ValueError(f"{len(ids)} ids for {len(x)} vectors")
    use_binary = binary if binary is not None else len(x) >= binary_threshold
    parts = chunks(len(x), rows_per_request(x.shape[1], max_request_bytes, use_binary))
    refuse_split_duplicates(ids, parts)
    calls = []
    for part in parts:
        meta = None if metadata is None else list(metadata[part])
        cont = None if contents is None else list(contents[part])
        if use_binary:
            body = {
                **index,
                "ids": ids[part],
                "vectors": b64(x[part]),
                "shape": [len(ids[part]), x.shape[1]],
            }
            body.update(drop_none(metadata=meta, contents=cont))
            calls.append(Call(UPSERT_ARRAYS, body, decode=upserted))
        else:
            items = []
            for j, i in enumerate(range(part.start, part.stop)):
                item: dict[str, Any] = {"id": ids[i], "vector": x[i].tolist()}
                if meta is not None and meta[j] is not None:
                    item["metadata"] = meta[j]
                if cont is not None and cont[j] is not None:
                    item["contents"] = cont[j]
                items.append(item)
            calls.append(Call(UPSERT, {**index, "items": items}, decode=upserted))
    return Plan(calls, sum)


def upsert_texts(
    index: dict[str, str],
    ids: list[str],
    metadata: Sequence[dict[str, Any] | None] | None,
    contents: Sequence[str | None] | None,
    binary: bool | None,
    max_request_bytes: int,
) -> Plan[int]:
    """Items without vectors (JSON route only), split into requests of at most
    ``max_request_bytes`` by their encoded size."""
    if contents is None:
        raise ValueError("give vectors, or contents to embed (an index with an embedding_model)")
    if binary:
        raise ValueError("items without vectors have no compact array form: binary=True")
    items = []
    for j, (item_id, text) in enumerate(zip(ids, contents)):
        if text is None:
            raise ValueError(f"item {item_id!r} has neither a vector nor contents")
        item: dict[str, Any] = {"id": item_id, "contents": text}
        if metadata is not None and metadata[j] is not None:
            item["metadata"] = metadata[j]
        items.append(item)
    opt = orjson.OPT_SERIALIZE_NUMPY
    envelope = len(orjson.dumps({**index, "items": []}, option=opt))
    sizes = [len(orjson.dumps(item, option=opt)) + 1 for item in items]
    parts = pack(sizes, max_request_bytes - envelope)
    refuse_split_duplicates(ids, parts)
    calls = [Call(UPSERT, {**index, "items": items[p]}, decode=upserted) for p in parts]
    return Plan(calls, sum)


def upserted(body: dict[str, Any]) -> int:
    return int(body["upserted_count"])


# -- everything else ------------------------------------------------------------------------
def get(index: dict[str, str], ids: Sequence[str], include: Sequence[str] | None) -> Plan[Any]:
    def decode(body: dict[str, Any]) -> list[dict[str, Any]]:
        out = body["results"]
        for item in out:
            if item.get("vector") is not None:
                item["vector"] = np.asarray(item["vector"], dtype=np.float32)
        return list(out)

    body = {**index, "ids": [str(i) for i in ids], **drop_none(include=include)}
    return single(Call("/v1/vectors/get", body, decode=decode))


def hybrid(
    text: str | None,
    fields: Sequence[str] | None,
    weights: Sequence[float] | None,
    require_all: bool | None,
    **fusion: Any,
) -> dict[str, Any]:
    """A request's text-search fields (only those given)."""
    return drop_none(
        text=text,
        text_fields=None if fields is None else list(fields),
        text_field_weights=None if weights is None else [float(w) for w in weights],
        require_all_terms=require_all,
        **fusion,
    )
