"""QueryParams and UpsertRows: the defaults and the validation every transport shares."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from actors.engine.filters import parse_filter
from actors.errors import InvalidRequest
from serve_app.batch_models import ArraysQueryRequest
from serve_app.gateway.hits import Query
from serve_app.models import Item, QueryRequest, UpsertRequest
from serve_app.service.params import (
    COMPACT_INCLUDE,
    QUERY_INCLUDE,
    Fields,
    Limits,
    QueryArgs,
    QueryParams,
    UpsertArgs,
    UpsertRows,
    get_fields,
    unique_ids,
)
from serve_app.settings import Settings

KEY = "ab" * 32
LIMITED: dict[str, Any] = {"max_top_k": 500, "max_items_per_upsert": 3, "max_id_length": 8}
SETTINGS = Settings(**LIMITED)


def args(**options: Any) -> QueryArgs:
    return QueryArgs("idx", KEY, **options)


# -- QueryParams ----------------------------------------------------------------------------
@pytest.mark.parametrize("accepted", [QUERY_INCLUDE, COMPACT_INCLUDE])
def test_query_defaults(accepted: tuple[str, ...]) -> None:
    p = QueryParams.of(args(), SETTINGS, accepted)
    assert (p.index_name, p.index_key) == ("idx", KEY)
    assert (p.top_k, p.n_probes, p.filter, p.greedy) == (100, 0, None, False)
    assert p.fields == Fields(distance=True, metadata=True, vector=False, contents=False)
    assert p.query == Query(100, 0, None, False, True)


def test_explicit_query_options_reach_the_engine_query() -> None:
    p = QueryParams.of(
        args(top_k=7, n_probes=3, filters={"n": {"$gt": 1}}, greedy=True, include=["distance"]),
        SETTINGS,
        COMPACT_INCLUDE,
    )
    assert p.query == Query(7, 3, parse_filter({"n": {"$gt": 1}}), True, False)
    assert p.fields == Fields(distance=True, metadata=False, vector=False, contents=False)


def test_null_options_mean_the_defaults() -> None:
    p = QueryParams.of(args(n_probes=0, filters={}, greedy=None, include=None), SETTINGS)
    assert (p.n_probes, p.filter, p.greedy) == (0, None, False)


@pytest.mark.parametrize("top_k", [0, -5, 501])
def test_top_k_out_of_range(top_k: int) -> None:
    with pytest.raises(InvalidRequest, match=r"^top_k must be between 1 and 500$"):
        QueryParams.of(args(top_k=top_k), SETTINGS)


@pytest.mark.parametrize("top_k", [1, 500])
def test_top_k_bounds_are_inclusive(top_k: int) -> None:
    assert QueryParams.of(args(top_k=top_k), SETTINGS).top_k == top_k


def test_negative_n_probes() -> None:
    with pytest.raises(InvalidRequest, match=r"^n_probes must be >= 0 \(0 = automatic\)$"):
        QueryParams.of(args(n_probes=-1), SETTINGS, COMPACT_INCLUDE)


@pytest.mark.parametrize("value", ["vector", "contents", "embedding"])
def test_the_compact_answer_refuses_what_it_cannot_carry(value: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"^include: unknown value '{value}'$"):
        QueryParams.of(args(include=["distance", value]), SETTINGS, COMPACT_INCLUDE)


def test_the_json_answer_takes_every_query_field_and_no_other() -> None:
    p = QueryParams.of(args(include=list(QUERY_INCLUDE)), SETTINGS, QUERY_INCLUDE)
    assert p.fields == Fields(distance=True, metadata=True, vector=True, contents=True)
    with pytest.raises(InvalidRequest, match=r"^include: unknown value 'embedding'$"):
        QueryParams.of(args(include=["embedding", "metadata"]), SETTINGS, QUERY_INCLUDE)
    with pytest.raises(InvalidRequest, match=r"unknown value 'a'"):  # the first one, sorted
        QueryParams.of(args(include=["b", "a"]), SETTINGS)


@pytest.mark.parametrize(
    ("flt", "named"),
    [({"n": {"$foo": 1}}, "$foo"), ({"$or": []}, "$or"), ([{"n": 1}], "filter")],
)
def test_a_malformed_filter_fails_when_the_params_are_built(flt: Any, named: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        QueryParams.of(args(filters=flt), SETTINGS)
    assert named in err.value.detail


def test_validation_order_top_k_include_n_probes_filter() -> None:
    bad = {"include": ["x"], "n_probes": -1, "filters": {"n": {"$foo": 1}}}
    with pytest.raises(InvalidRequest, match="top_k"):
        QueryParams.of(args(top_k=0, **bad), SETTINGS)
    with pytest.raises(InvalidRequest, match="include"):
        QueryParams.of(args(**bad), SETTINGS)
    with pytest.raises(InvalidRequest, match="n_probes"):
        QueryParams.of(args(n_probes=-1, filters=bad["filters"]), SETTINGS)


def test_pydantic_bodies_build_the_same_params_as_the_ray_arguments() -> None:
    options: dict[str, Any] = {"top_k": 5, "n_probes": 2, "filters": {"a": 1}, "greedy": True}
    body = QueryRequest(index_name="idx", index_key=KEY, query_vectors=[1.0], **options)
    arrays = ArraysQueryRequest(
        index_name="idx", index_key=KEY, query_vectors="", shape=[1, 1], **options
    )
    ray = QueryParams.of(args(**options), SETTINGS, COMPACT_INCLUDE)
    assert QueryParams.of(body, SETTINGS) == ray
    assert QueryParams.of(arrays, SETTINGS, COMPACT_INCLUDE) == ray


# -- Fields ---------------------------------------------------------------------------------
def test_get_returns_every_field_by_default() -> None:
    """Every index type's shards keep the original vectors (compressed ones on disk): a get
    asks for them; a shard without them leaves them out (tests/unit/test_full_vectors.py)."""
    assert get_fields(None) == Fields(False, True, True, True)
    assert get_fields(["metadata"]) == Fields(False, True, False, False)
    assert Fields.parse(["vector", "contents"], QUERY_INCLUDE) == Fields(False, False, True, True)
    with pytest.raises(InvalidRequest, match="include: unknown value 'distance'"):
        get_fields(["distance"])


# -- UpsertRows -----------------------------------------------------------------------------
def items(*entries: dict[str, Any]) -> UpsertRequest:
    return UpsertRequest(index_name="idx", index_key=KEY, items=[Item(**e) for e in entries])


def test_json_items_keep_their_vectors_for_the_index_to_check() -> None:
    rows = UpsertRows.of_items(
        items(
            {"id": "a", "vector": [1.0, 2.0], "metadata": {"k": [1, "x"]}},
            {"id": "b", "contents": "text to embed"},
        ),
        SETTINGS,
    )
    assert (rows.index_name, rows.index_key, rows.ids) == ("idx", KEY, ["a", "b"])
    assert list(rows.vectors) == [[1.0, 2.0], None]
    assert rows.metadata == [b'{"k":[1,"x"]}', None]
    assert rows.contents == [None, "text to embed"]
    assert rows.field == "items vectors"


def test_columns_default_to_no_metadata_and_no_contents() -> None:
    x = np.ones((2, 3), np.float32)
    rows = UpsertRows.of_columns(UpsertArgs("idx", KEY, ["a", "b"]), x, SETTINGS)
    assert rows.ids == ["a", "b"] and rows.vectors is x
    assert rows.metadata == [None, None] and rows.contents == [None, None]
    assert rows.field == "vectors"


def test_columns_encode_metadata_as_stored() -> None:
    cols = UpsertArgs("idx", KEY, ("a", "b"), [None, {"n": 1}], ["t", None])
    rows = UpsertRows.of_columns(cols, np.ones((2, 3), np.float32), SETTINGS)
    assert rows.metadata == [None, b'{"n":1}'] and rows.contents == ["t", None]


@pytest.mark.parametrize(
    ("cols", "rows", "message"),
    [
        (UpsertArgs("i", KEY, ["a", "b"]), 3, "^vectors has 3 rows for 2 ids$"),
        (UpsertArgs("i", KEY, ["a"], [None, None]), 1, "^metadata has 2 entries for 1 ids$"),
        (UpsertArgs("i", KEY, ["a"], None, []), 1, "^contents has 0 entries for 1 ids$"),
        (UpsertArgs("i", KEY, ["a"], None, [3]), 1, "^contents must be strings or null$"),  # type: ignore[list-item]
        (UpsertArgs("i", KEY, ["a"], ["m"]), 1, "^item 0: metadata must be a JSON object or null$"),
    ],
)
def test_column_errors(cols: UpsertArgs, rows: int, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        UpsertRows.of_columns(cols, np.ones((rows, 2), np.float32), SETTINGS)


LIMIT_ERRORS = [
    (
        ["a", "b", "c", "d"],
        None,
        None,
        "holds 4 items; the limit is 3 (VAULTVEC_MAX_ITEMS_PER_UPSERT)",
    ),
    (["a", "123456789"], None, None, "item 1: ids must be strings of 1 to 8 characters"),
    (["a", ""], None, None, "item 1: ids must be strings of 1 to 8 characters"),
    (["a"], [{"d": [[[[1]]]]}], None, None),  # 5 levels: within the default depth limit
    (
        ["a"],
        [{"b": "x" * 70_000}],
        None,
        "item 0: metadata is 70008 bytes as JSON; the limit is 65536",
    ),
    (["a"], None, ["é" * 600_000], "item 'a': contents are 1200000 bytes; the limit is 1048576"),
]


@pytest.mark.parametrize(("ids", "metadata", "contents", "message"), LIMIT_ERRORS)
def test_limits_apply_to_columns_and_items_alike(
    ids: list[str], metadata: list[Any] | None, contents: list[str] | None, message: str | None
) -> None:
    x = np.ones((len(ids), 2), np.float32)
    cols = UpsertArgs("i", KEY, ids, metadata, contents)
    entries = [
        {
            "id": i or "-",
            "vector": [1.0, 2.0],
            "metadata": metadata[n] if metadata else None,
            "contents": contents[n] if contents else None,
        }
        for n, i in enumerate(ids)
    ]
    if message is None:
        UpsertRows.of_columns(cols, x, SETTINGS)
        UpsertRows.of_items(items(*entries), SETTINGS)
        return
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        UpsertRows.of_columns(cols, x, SETTINGS)
    if "" not in ids:  # the JSON model refuses an empty id itself
        with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
            UpsertRows.of_items(items(*entries), SETTINGS)


def test_metadata_nested_too_deep() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(40):
        node["k"] = {}
        node = node["k"]
    with pytest.raises(InvalidRequest, match="nested deeper than 32 levels"):
        UpsertRows.of_columns(UpsertArgs("i", KEY, ["a"], [deep]), np.ones((1, 2)), SETTINGS)


def test_the_json_model_refuses_an_empty_id_before_the_limits() -> None:
    with pytest.raises(ValidationError):
        items({"id": "", "vector": [1.0]})


def test_limits_are_built_once_per_settings_object() -> None:
    assert Limits.of(SETTINGS) is Limits.of(SETTINGS)
    assert Limits.of(SETTINGS).items == 3
    defaults = Settings(**{})
    assert Limits.of(defaults).items == defaults.max_items_per_upsert


def test_unique_ids() -> None:
    unique_ids(["a", "b"])
    with pytest.raises(InvalidRequest, match=r"^items ids contains the id 'a' more than once$"):
        unique_ids(["a", "b", "a"], "items ids")
    with pytest.raises(InvalidRequest, match=r"^ids contains an empty id$"):
        unique_ids(["a", ""])
