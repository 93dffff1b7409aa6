"""Who may do what is decided in one place (serve_app.access.rights), before an operation of the
service layer touches the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from actors.errors import Forbidden
from serve_app.access import context
from serve_app.access.context import RequestContext
from serve_app.access.rights import ALL, Right, require
from serve_app.http.errors import api_error
from serve_app.models import (
    CreateIndexRequest,
    DeleteRequest,
    GetRequest,
    IndexRequest,
    ListIdsRequest,
)
from serve_app.service import indexes, items, upserts
from serve_app.service.deps import Services
from serve_app.service.params import UpsertRows
from serve_app.settings import Settings

KEY = "ab" * 32


class Untouchable:
    """An engine whose every use is a test failure: a refused operation must stop before it."""

    def __init__(self) -> None:
        self.touched: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.touched.append(name)
        raise AssertionError(f"the engine was reached ({name}) by a refused request")


@pytest.fixture
def engine() -> Untouchable:
    return Untouchable()


@pytest.fixture
def svc(engine: Untouchable) -> Services:
    return Services(engine=engine, settings=Settings())  # type: ignore[arg-type]


def holding(rights: Right | None) -> Any:
    """A request context whose credentials hold ``rights`` (None: an API key, every right)."""

    class _Open:
        def __enter__(self) -> RequestContext:
            self.ctx = RequestContext(client="127.0.0.1", key="reader", rights=rights)
            self.token = context.open_(self.ctx)
            return self.ctx

        def __exit__(self, *exc: object) -> None:
            context.close(self.token)

    return _Open()


def _rows() -> UpsertRows:
    return UpsertRows(
        index_name="docs",
        index_key=KEY,
        ids=["a"],
        vectors=np.ones((1, 4), dtype=np.float32),
        metadata=[None],
        contents=[None],
    )


def _writes(svc: Services) -> Iterator[tuple[str, Any]]:
    yield "upsert", upserts.upsert(svc.engine, _rows())
    yield (
        "delete items",
        items.delete(svc, DeleteRequest(index_name="docs", index_key=KEY, ids=["a"])),
    )


def _manages(svc: Services) -> Iterator[tuple[str, Any]]:
    yield (
        "create",
        indexes.create(svc, CreateIndexRequest(index_name="docs", index_key=KEY, dimension=4)),
    )
    yield "delete index", indexes.delete(svc, IndexRequest(index_name="docs", index_key=KEY))


def test_a_read_only_key_is_refused_every_write_before_the_engine(
    svc: Services, engine: Untouchable
) -> None:
    for what, call in [*_writes(svc), *_manages(svc)]:
        with holding(Right.READ), pytest.raises(Forbidden, match="reader"):
            asyncio.run(call)
        assert engine.touched == [], what


def test_a_read_only_key_may_read(svc: Services, engine: Untouchable) -> None:
    """Reads get past the check (and on to the engine, which this one refuses)."""
    for call in (
        items.get(svc, GetRequest(index_name="docs", index_key=KEY, ids=["a"])),
        items.list_ids(svc, ListIdsRequest(index_name="docs", index_key=KEY)),
    ):
        with holding(Right.READ), pytest.raises(AssertionError, match="engine was reached"):
            asyncio.run(call)
    assert engine.touched


def test_a_write_only_key_may_not_read_nor_manage(svc: Services) -> None:
    get = items.get(svc, GetRequest(index_name="docs", index_key=KEY, ids=["a"]))
    with holding(Right.WRITE), pytest.raises(Forbidden):
        asyncio.run(get)
    with holding(Right.READ | Right.WRITE), pytest.raises(Forbidden):
        asyncio.run(indexes.delete(svc, IndexRequest(index_name="docs", index_key=KEY)))


def test_an_api_key_and_callers_outside_a_request_hold_every_right() -> None:
    with holding(None):
        for right in Right:
            require(right)
    with holding(ALL):
        require(Right.MANAGE)
    assert context.current() is None
    require(Right.WRITE)


def test_refused_is_a_403_on_every_transport() -> None:
    with holding(Right.READ), pytest.raises(Forbidden) as refused:
        require(Right.WRITE)
    err = api_error(refused.value)
    assert err.status_code == 403 and "may not write" in err.detail
