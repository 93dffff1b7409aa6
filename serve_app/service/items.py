"""The operations on an index's items besides queries and upserts: get, delete, list their ids,
count them, and the metadata-only search (query_metadata)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from actors.engine.filters import FilterNode, parse_filter
from actors.engine.updates import parse_update
from actors.errors import InvalidRequest
from serve_app.access import context
from serve_app.access.rights import Right
from serve_app.gateway.engine import CachedView, Engine
from serve_app.models import (
    CountRequest,
    DeleteRequest,
    GetRequest,
    IndexRequest,
    ListIdsRequest,
    Paged,
    QueryMetadataRequest,
    UpdateRequest,
)
from serve_app.service import cursors, fulltext, schema
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
    fields = get_fields(include)
    found = await engine.fetch(cv, ids, fields.vector, fields.metadata, fields.contents)
    return [found[i] for i in ids if i in found]


@dataclass(frozen=True)
class Target:
    """Which items a delete or update by filter touches: those ``node`` matches (every item when
    None), among ``ids`` when given."""

    node: FilterNode | None
    ids: list[str] | None

    @classmethod
    def of(
        cls,
        svc: Services,
        ids: list[str] | None,
        filters: dict[str, Any] | None,
        all_items: bool | None,
    ) -> Target:
        if ids is None and filters is None and not all_items:
            raise InvalidRequest('give ids, filters, or "all": true')
        if all_items and (ids is not None or filters):
            raise InvalidRequest('"all": true means every item: send it without ids or filters')
        if filters == {} and not all_items:
            raise InvalidRequest('filters {} matches every item: send "all": true for them all')
        if ids is not None:
            Limits.of(svc.settings).check_ids(ids)
            ids = distinct(ids)
            if any(not i for i in ids):
                raise InvalidRequest("ids contains an empty id")
            context.note(items=len(ids))
        return cls(parse_filter(filters or None), ids)

    async def each_shard(
        self, engine: Engine, cv: CachedView, call: Callable[..., Awaitable[int]]
    ) -> int:
        """``call(shard, node, ids)`` on every shard that may hold a target; the answers summed."""
        if self.ids is not None:
            if not self.ids:
                return 0
            parts = await engine.by_shard(cv, self.ids, lambda c, sub: call(c, self.node, sub))
        else:
            parts = await engine.all_shards(cv, lambda c: call(c, self.node, None))
        n = sum(parts)
        context.note(items=n)
        return n


async def delete(svc: Services, body: DeleteRequest) -> int:
    """Delete ``body.ids``, or the items ``body.filters`` matches (among the ids if given, every
    item with ``all``); how many were deleted."""
    by_filter = body.filters is not None or bool(body.all)
    target = Target.of(svc, body.ids, body.filters, body.all)
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.WRITE)
    if not by_filter:
        assert target.ids is not None
        return await svc.engine.delete(cv, target.ids)
    return await target.each_shard(
        svc.engine, cv, lambda c, node, ids: c.delete_matching(cv.key, node, ids)
    )


async def update(svc: Services, body: UpdateRequest) -> int:
    """Apply ``body.update`` ($set/$unset on metadata) and ``body.contents`` to the items
    ``body.ids``/``body.filters`` select, vectors unchanged; how many were updated."""
    limits = Limits.of(svc.settings)
    change = parse_update(
        body.update, body.contents, body.contents is not None, limits.metadata_bytes
    )
    target = Target.of(svc, body.ids, body.filters, body.all)
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.WRITE)
    if change.set_contents and cv.config.embedding_model:
        raise InvalidRequest(
            "update: this index embeds its items' contents into their vectors "
            "(embedding_model): upsert the items again to change their contents"
        )
    return await target.each_shard(
        svc.engine, cv, lambda c, node, ids: c.update(cv.key, node, ids, change)
    )


async def count_matching(svc: Services, body: CountRequest) -> int:
    """How many items ``body.filters`` matches (every item when null or {}), exact, from the
    shards' filter columns."""
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    node = parse_filter(body.filters or None)
    return sum(await svc.engine.all_shards(cv, lambda c: c.count_matching(cv.key, node)))


async def list_ids(svc: Services, body: ListIdsRequest) -> tuple[list[str], str | None]:
    """Every id, or with ``limit`` one page of them in id order and the next page's cursor."""
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    if body.limit is None:
        refuse_cursor(body, "list_ids")
        ids = await svc.engine.match_ids(cv, None, None)
        cursor = None
    else:
        ids, cursor = await page(svc.engine, cv, body, "list_ids", None, None)
    context.note(items=len(ids))
    return ids, cursor


def refuse_cursor(body: Paged, route: str) -> None:
    if body.cursor is not None:
        raise InvalidRequest(f"{route}: cursor needs limit (the page size)")


async def page(
    engine: Engine,
    cv: CachedView,
    body: Paged,
    route: str,
    filters: dict[str, Any] | None,
    node: FilterNode | None,
) -> tuple[list[str], str | None]:
    """One page of a scan in id order (of the items ``node``, parsed from ``filters``,
    matches): its ids and the next page's cursor (None: the last)."""
    assert body.limit is not None
    after = "" if body.cursor is None else cursors.open_cursor(cv, route, filters, body.cursor)
    ids, more = await engine.page_ids(cv, node, after, body.limit)
    return ids, (cursors.seal_cursor(cv, route, filters, ids[-1]) if more else None)


async def count(svc: Services, body: IndexRequest) -> int:
    cv = await open_index(svc.engine, body.index_name, body.index_key, Right.READ)
    num, _ = await svc.engine.count(cv)
    return num


async def query_metadata(
    svc: Services, body: QueryMetadataRequest
) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """Metadata-only search: (results, ids, next cursor) of the items the filter matches (no
    vector), in the order of ``order_by`` if given, at most ``top_k``, with the fields of
    ``include`` as get returns them. With ``text``: the items matching its terms, by
    descending BM25 score, each with its ``score``. With ``limit``: one page in id order."""
    search = fulltext.TextSearch.of(body)
    if search is not None and body.order_by is not None:
        raise InvalidRequest("query_metadata: order_by does not apply with text (ranked by BM25)")
    if body.limit is None:
        refuse_cursor(body, "query_metadata")
    elif search is not None or body.order_by is not None or body.top_k is not None:
        raise InvalidRequest(
            "query_metadata: limit pages through the matches in id order; it does not combine "
            "with text, order_by or top_k"
        )
    order_by, ascending = sort_order(body.order_by, body.ascending)
    engine = svc.engine
    cv = await open_index(engine, body.index_name, body.index_key, Right.READ)
    node = parse_filter(body.filters or None)
    schema.enforce(cv.config, node)
    scores: dict[str, float] = {}
    cursor = None
    if body.limit is not None:
        ids, cursor = await page(engine, cv, body, "query_metadata", body.filters or None, node)
    elif search is not None:
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
    return results, ids, cursor


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
