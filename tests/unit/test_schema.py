"""CyborgDB's metadata_schema (serve_app.service.schema): parsed at create, echoed by describe,
enforced by query_metadata."""

from __future__ import annotations

from typing import Any

import pytest

from actors.engine.filters import parse_filter
from actors.errors import InvalidRequest
from actors.types import IndexConfig
from serve_app.service import schema

SCHEMA = {"title": {"filterable": True, "pattern": True}, "blob": {"filterable": False}}


def config(raw: dict[str, Any] | None) -> IndexConfig:
    cfg = IndexConfig("docs", "ix", "ivfflat", "euclidean", 1, metadata_schema=schema.parse(raw))
    return IndexConfig.from_json(cfg.to_json())  # as stored


def test_parsed_stored_and_described() -> None:
    assert schema.describe(config(SCHEMA)) == {
        "title": {"filterable": True, "pattern": True, "full_text": False},
        "blob": {"filterable": False, "pattern": False, "full_text": False},
    }
    assert schema.describe(config(None)) == {}


@pytest.mark.parametrize(
    "bad",
    [
        {"t": {"pattern": True, "filterable": False}},
        {"t": {"indexed": True}},
        {"t": {"pattern": "yes"}},
        {"t": True},
    ],
)
def test_malformed_schemas_are_422(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="metadata_schema"):
        schema.parse(bad)


@pytest.mark.parametrize(
    ("flt", "refused"),
    [
        ({"title": {"$regex": "^a"}}, None),
        ({"title": "alpha", "other": {"$gt": 1}}, None),  # fields left out are filterable
        ({"other": {"$regex": "^a"}}, "needs a pattern field"),
        ({"other": {"$contains": "a"}}, "needs a pattern field"),
        ({"blob": "x"}, "not filterable"),
        ({"$or": [{"title": "a"}, {"blob": {"$not": {"$eq": 1}}}]}, "not filterable"),
    ],
)
def test_query_metadata_enforces_the_schema(flt: dict[str, Any], refused: str | None) -> None:
    node = parse_filter(flt)
    if refused is None:
        schema.enforce(config(SCHEMA), node)
    else:
        with pytest.raises(InvalidRequest, match=refused):
            schema.enforce(config(SCHEMA), node)
