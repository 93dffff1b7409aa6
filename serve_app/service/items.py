"""The operations on an index's items besides queries and upserts: get, delete, list their ids,
count them, and the metadata-only search (query_metadata)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.engine.filters import parse_filter
from actors.errors import InvalidRequest
from serve_app.access import context
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.models import (
    CountRequest,
    DeleteRequest,
    GetRequest,
    IndexRequest,
    QueryMetadataRequest,
)
from serve_app.service import fulltext, schema
from serve_app.service.deps import Services
from serve_app.service.params import Limits, distinct, get_fields
from serve_app.service.unlock import open_index


async def get(svc: Services, body: GetRequest) -> list[dict[str, Any]]:
    """The stored items of ``body.ids`` (each once, unknown ones left out) in the order asked."""
    Limits.of(svc.settings).check_ids(body.ids)
    context.note(items=len(body.ids))
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    return await fetch(svc.engine, cv, body.ids, body.include)


async def fetch(
    engine: Engine, cv: CachedView, ids: list[str], include: Sequence[str] | None
) -> list[dict[str, Any]]:
    ids = distinct(ids)
    context.note(items=len(ids))
    if not ids:
        return []
    if any(not i for i in ids):
        raise InvalidRequest("ids contains an empty id")
    fields = get_fields(include, cv.config)
    found = await engine.fetch(cv, ids, fields.vector, fields.metadata, fields.contents)
    return [found[i] for i in ids if i in found]


async def delete(svc: Services, body: DeleteRequest) -> int:
    """Delete ``body.ids``, or the items ``body.filters`` matches (among the ids if given, every
    item with ``all``); how many were deleted."""
    by_filter = body.filters is not None or body.all
    if body.ids is None and not by_filter:
        raise InvalidRequest('give ids, filters, or "all": true')
    if body.all and (body.ids is not None or body.filters):
        raise InvalidRequest('"all": true deletes every item: send it without ids or filters')
    if body.filters == {} and not body.all:
        raise InvalidRequest('filters {} matches every item: send "all": true to delete them all')
    ids = None
    if body.ids is not None:
        Limits.of(svc.settings).check_ids(body.ids)
        ids = distinct(body.ids)
        if any(not i for i in ids):
            raise InvalidRequest("ids contains an empty id")
        context.note(items=len(ids))
    node = parse_filter(body.filters or None)
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.WRITE)
    engine = svc.engine
    if not by_filter:
        assert ids is not None
        return await engine.delete(cv, ids)
    if ids is not None:
        if not ids:
            return 0
        parts = await engine.by_shard(cv, ids, lambda c, sub: c.delete_matching(cv.key, node, sub))
    else:
        parts = await engine.all_shards(cv, lambda c: c.delete_matching(cv.key, node))
    deleted = sum(parts)
    context.note(items=deleted)
    return deleted


async def count_matching(svc: Services, body: CountRequest) -> int:
    """How many items ``body.filters`` matches (every item when null or {}), exact, from the
    shards' filter columns."""
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    node = parse_filter(body.filters or None)
    return sum(await svc.engine.all_shards(cv, lambda c: c.count_matching(cv.key, node)))


async def list_ids(svc: Services, body: IndexRequest) -> list[str]:
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    ids = await svc.engine.list_ids(cv)
    context.note(items=len(ids))
    return ids


async def count(svc: Services, body: IndexRequest) -> int:
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    num, _ = await svc.engine.count(cv)
    return num


async def query_metadata(
    svc: Services, body: QueryMetadataRequest
) -> tuple[list[dict[str, Any]], list[str]]:
    """Metadata-only search: (results, ids) of the items the filter matches (no vector), in
    the order of ``order_by`` if given, at most ``top_k``, with the fields of ``include`` as
    get returns them. With ``text``: the items matching its terms, by descending BM25 score,
    each with its ``score``."""
    search = fulltext.TextSearch.of(body)
    if search is not None and body.order_by is not None:
        raise InvalidRequest("query_metadata: order_by does not apply with text (ranked by BM25)")
    order_by, ascending = sort_order(body.order_by, body.ascending)
    engine = svc.engine
    cv = await open_index(engine, body.index_name, body.index_key, Right.READ)
    node = parse_filter(body.filters or None)
    schema.enforce(cv.config, node)
    scores: dict[str, float] = {}
    if search is not None:
        hits = await fulltext.ranked(engine, cv, search, node, body.top_k)
        ids, scores = hits.ids, dict(zip(hits.ids, hits.scores, strict=True))
    else:
        ids = await engine.match_ids(cv, node, body.top_k, order_by, ascending)
    context.note(items=len(ids))
    if body.include:
        results = await fetch(engine, cv, ids, body.include)
    else:
        results = [{"id": i} for i in ids]
    if search is not None:  # ranked: each row carries its BM25 score
        for row in results:
            row["score"] = scores[row["id"]]
    return results, ids


def sort_order(
    order_by: str | dict[str, int] | None, ascending: bool | None
) -> tuple[str | None, bool]:
    """(field, ascending) of query_metadata's order_by: a name, or {name: 1 | -1}."""
    if isinstance(order_by, dict):
        if len(order_by) != 1 or next(iter(order_by.values())) not in (1, -1):
            raise InvalidRequest('order_by must be a field name or {"field": 1 | -1}')
        ((order_by, direction),) = order_by.items()
        return order_by, direction == 1
    if order_by is not None and not order_by:
        raise InvalidRequest("order_by must name a metadata field")
    return order_by, ascending is not False
