"""GET /openapi.json documents every /v1 route with its request, response and error models."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.support import ok

ROUTES = {
    ("get", "/v1/health"): (None, "HealthResponse"),
    ("get", "/v1/indexes/list"): (None, "ListIndexesResponse"),
    ("post", "/v1/indexes/create"): ("CreateIndexRequest", "StatusResponse"),
    ("post", "/v1/indexes/describe"): ("IndexRequest", "DescribeResponse"),
    ("post", "/v1/indexes/delete"): ("IndexRequest", "StatusResponse"),
    ("post", "/v1/indexes/train"): ("TrainRequest", "StatusResponse"),
    ("post", "/v1/indexes/rotate_key"): ("RotateKeyRequest", "StatusResponse"),
    ("get", "/v1/indexes/training-status"): (None, "TrainingStatusResponse"),
    ("post", "/v1/vectors/upsert"): ("UpsertRequest", "UpsertResponse"),
    ("post", "/v1/vectors/query"): ("QueryRequest", "QueryResponse"),
    ("post", "/v1/vectors/get"): ("GetRequest", "GetResponse"),
    ("post", "/v1/vectors/delete"): ("DeleteRequest", "DeleteResponse"),
    ("post", "/v1/vectors/update"): ("UpdateRequest", "UpdateResponse"),
    ("post", "/v1/vectors/count"): ("CountRequest", "CountResponse"),
    ("post", "/v1/vectors/list_ids"): ("ListIdsRequest", "ListIdsResponse"),
    ("post", "/v1/vectors/num_vectors"): ("IndexRequest", "NumVectorsResponse"),
    ("post", "/v1/vectors/query_metadata"): ("QueryMetadataRequest", "QueryMetadataResponse"),
    ("post", "/v1/vectors/query_binary"): ("BinaryQueryRequest", "QueryResponse"),
    ("post", "/v1/vectors/upsert_binary"): ("BinaryUpsertRequest", "UpsertResponse"),
    ("post", "/v1/vectors/query_arrays"): ("ArraysQueryRequest", "ArraysQueryResponse"),
    ("post", "/v1/vectors/upsert_arrays"): ("ArraysUpsertRequest", "UpsertResponse"),
    ("get", "/v1/embedding-models"): (None, "EmbeddingModelsResponse"),
    ("post", "/v1/indexes/{index_name}/users"): ("CreateUserRequest", "CreateUserResponse"),
    ("get", "/v1/indexes/{index_name}/users"): (None, "ListUsersResponse"),
    ("delete", "/v1/indexes/{index_name}/users/{user_id}"): (None, None),  # 204, no body
    ("post", "/v1/indexes/backup"): ("BackupRequest", None),  # a stream, not JSON
    ("post", "/v1/indexes/restore/begin"): ("RestoreBeginRequest", "StatusResponse"),
    ("post", "/v1/indexes/restore/chunk"): ("RestoreChunkRequest", "RestoreChunkResponse"),
    ("post", "/v1/indexes/restore/commit"): ("RestoreCommitRequest", "RestoreCommitResponse"),
}


@pytest.fixture(scope="module")
def spec(http) -> dict[str, Any]:
    return ok(http.get("/openapi.json"))


def _ref(schema: dict[str, Any]) -> str:
    return schema["$ref"].rsplit("/", 1)[1]


def _json_schema(part: dict[str, Any]) -> dict[str, Any]:
    return part["content"]["application/json"]["schema"]


@pytest.mark.parametrize(("method", "path"), list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_route_models_are_documented(spec, method, path):
    request_model, response_model = ROUTES[(method, path)]
    op = spec["paths"][path][method]
    if request_model is None:
        assert "requestBody" not in op
    else:
        assert op["requestBody"]["required"] is True
        assert _ref(_json_schema(op["requestBody"])) == request_model
    if path == "/v1/indexes/backup":
        assert "application/vnd.vaultvec.backup" in op["responses"]["200"]["content"]
    elif response_model is None:
        assert "204" in op["responses"] and "200" not in op["responses"]
    else:
        assert _ref(_json_schema(op["responses"]["200"])) == response_model
    if path != "/v1/health":
        for status in ("401", "422", "500"):
            assert _ref(_json_schema(op["responses"][status])) == "ErrorResponse", status
    if path == "/v1/indexes/create":
        assert _ref(_json_schema(op["responses"]["409"])) == "ErrorResponse"
    # A route that reads a body may refuse it: stalled (408), too large (413), not JSON (415).
    for status in ("408", "413", "415"):
        if request_model is None:
            assert status not in op["responses"], status
        else:
            assert _ref(_json_schema(op["responses"][status])) == "ErrorResponse", status
    if path.startswith(("/v1/vectors/", "/v1/indexes/{index_name}/users")) or path in (
        "/v1/indexes/describe",
        "/v1/indexes/delete",
        "/v1/indexes/train",
        "/v1/indexes/rotate_key",
    ):
        assert _ref(_json_schema(op["responses"]["404"])) == "ErrorResponse"
    if path in ("/v1/indexes/train", "/v1/indexes/rotate_key"):  # training or rotating
        assert _ref(_json_schema(op["responses"]["409"])) == "ErrorResponse"


def test_request_bodies_claim_no_placeholder_example(spec):
    # A document built before Serve pickles the app is, in the replica's copy, rebuilt with
    # "example": {} on every request body (a body without its required fields), which Swagger
    # UI prefills and schemathesis sends as a valid one (see serve_app.app.json_routes).
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for media in op.get("requestBody", {}).get("content", {}).values():
                assert "example" not in media and "examples" not in media, f"{method} {path}"


def test_no_undocumented_v1_routes(spec):
    documented = {(m, p) for p, ops in spec["paths"].items() for m in ops if p.startswith("/v1/")}
    assert documented == set(ROUTES)


def test_error_response_schema(spec):
    schema = spec["components"]["schemas"]["ErrorResponse"]
    assert set(schema["required"]) == {"status_code", "detail"}
    assert schema["properties"]["status_code"]["type"] == "integer"
    assert schema["properties"]["detail"]["type"] == "string"
    assert "errors" in schema["properties"]


def test_request_models_describe_their_fields(spec):
    schemas = spec["components"]["schemas"]
    query = schemas["QueryRequest"]["properties"]
    assert {
        "index_name",
        "index_key",
        "query_vectors",
        "query_contents",
        "top_k",
        "n_probes",
        "greedy",
        "filters",
        "include",
    } <= set(query)
    # index_key may be left out by a per-index user key's requests (a 422 for an API key's)
    assert set(schemas["QueryRequest"]["required"]) == {"index_name"}
    upsert = schemas["UpsertRequest"]
    assert set(upsert["required"]) == {"index_name", "items"}
    item = schemas["Item"]
    assert set(item["required"]) == {"id"} and {"vector", "contents", "metadata"} <= set(
        item["properties"]
    )
    assert {"ids", "include"} <= set(schemas["GetRequest"]["properties"])
    train = schemas["TrainRequest"]["properties"]
    assert {"n_lists", "batch_size", "max_iters", "tolerance", "max_memory"} <= set(train)
    create = schemas["CreateIndexRequest"]["properties"]
    assert {"index_config", "metric", "embedding_model"} <= set(create)
    describe = schemas["DescribeResponse"]
    assert set(describe["required"]) >= {
        "index_name",
        "index_type",
        "is_trained",
        "index_config",
        "num_vectors",
    }


def test_api_key_requirement_is_documented(spec):
    schemes = spec.get("components", {}).get("securitySchemes", {})
    header_schemes = {
        n
        for n, s in schemes.items()
        if s.get("type") == "apiKey"
        and s.get("in") == "header"
        and s.get("name", "").lower() == "x-api-key"
    }
    for method, path in ROUTES:
        op = spec["paths"][path][method]
        declared = any(
            next(iter(req)) in header_schemes
            for req in op.get("security", spec.get("security", []))
        )
        declared |= any(
            p.get("in") == "header" and p.get("name", "").lower() == "x-api-key"
            for p in op.get("parameters", [])
        )
        assert declared == (path != "/v1/health"), f"{method} {path}"
