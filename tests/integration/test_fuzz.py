"""Schemathesis over the server's OpenAPI document, against the real Ray + Serve service.

Every operation gets the schema's examples, the coverage phase's boundary and non-JSON cases,
and a bounded, derandomized fuzzing run of valid and invalid (negative mode) requests. A share
of the bodies is pointed at a real index holding a few items, with its real key, so requests
get past 401/404 into each route's own validation and the engine. Every response must be free
of 5xx and conform to the document: a documented status code, content type, headers and body
schema (and a 405 with Allow for a method an operation does not take, a 401 without the key, a
4xx for a request the schema says is invalid).
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.integration.conftest import API_KEY, Service
from tests.integration.support import Index, create_index, ok

DIMENSION = 2  # small, so that generated vectors often have the index's dimension
ITEMS = [
    {"id": "a", "vector": [1.0, 0.0], "contents": "alpha", "metadata": {"n": 1, "tag": "x"}},
    {"id": "b", "vector": [0.0, 1.0], "contents": "beta", "metadata": {"n": 2}},
    {"id": "c", "vector": [0.5, 0.5]},
]
MAX_SHARDS = 2  # per generated create: see cap_shards
# Fuzzing examples per operation: 30 keeps the test under a minute on 2 cores (on top of the
# examples and coverage phases); raise it for a deeper local run.
EXAMPLES = int(os.environ.get("VAULTVEC_FUZZ_EXAMPLES", "30"))
STATUSES: dict[str, Counter[int]] = {}  # "METHOD path" -> the statuses it was answered


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI document, as JSON. Loaded at import, not from the server, because
    schemathesis.pytest.from_fixture fails on pytest 9.2 (whose nodes lost the ``_nodeid`` it
    rewrites); served_document checks that the server serves exactly this document."""
    from serve_app.app import create_app

    return orjson.loads(orjson.dumps(create_app().openapi()))


schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.update(headers={"X-API-Key": API_KEY}, request_timeout=60)
schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
# Not positive_data_acceptance ("a schema-valid request gets a 2xx"): validity here depends on
# more than a JSON Schema can say, so valid-looking requests are rightly refused with a 422: a
# vector whose length is not the index's dimension, base64 that does not hold shape's floats,
# an order_by direction other than 1/-1, text_fields (not supported), a count sent as 5.0 (the
# API takes JSON integers only; JSON Schema's "integer" cannot tell 5.0 from 5). Every
# check on the response itself stays on.
schema.config.checks.update(excluded_check_names=["positive_data_acceptance"])


@pytest.fixture(scope="module")
def served_document(http: httpx.Client) -> None:
    """The fuzzed document is the one the server serves."""
    assert ok(http.get("/openapi.json")) == openapi_document()


@pytest.fixture(scope="module")
def fuzz_index(http: httpx.Client) -> Iterator[Index]:
    idx = create_index(http, dimension=DIMENSION)
    idx.upsert(ITEMS)
    yield idx
    idx.drop()


def test_fuzzed_document_is_the_served_one(http: httpx.Client) -> None:
    assert ok(http.get("/openapi.json")) == openapi_document()


def _share(body: Any) -> int:
    """A stable 0-7 bucket of a generated body (derandomized runs send the same requests)."""
    return zlib.crc32(json.dumps(body, sort_keys=True, default=repr).encode()) % 8


def _valid_name(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 255


def _valid_key(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(c in "0123456789abcdefABCDEF" for c in value)
    )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return _int(value) or isinstance(value, float)


def _fit(vector: Any) -> Any:
    """A generated vector, valid for the schema, made one the index takes: a list of numbers
    cycled or cut to the index's dimension, an empty one or none replaced by a vector of its
    own; anything else (invalid for the schema) as it is."""
    if vector is None or vector == []:
        return [0.25, -0.5][:DIMENSION]
    if isinstance(vector, list) and all(_number(v) for v in vector):
        return (vector * DIMENSION)[:DIMENSION]
    return vector


def _b64(rows: int) -> str:
    x = np.linspace(-1.0, 1.0, rows * DIMENSION, dtype="<f4") + 0.125
    return base64.b64encode(x.tobytes()).decode()


def _fit_columns(body: dict[str, Any], rows: int) -> None:
    """An upsert's ``metadata`` and ``contents`` lists (one entry per id) cut or padded with
    nulls to the rows: the generator draws their lengths apart from the ids'."""
    for name in ("metadata", "contents"):
        column = body.get(name)
        if isinstance(column, list) and len(column) != rows:
            body[name] = (column + [None] * rows)[:rows]


def fit_vectors(path: str, body: dict[str, Any]) -> None:
    """Give a body's vectors the real index's dimension, where the generator made them valid
    for the schema (a list of numbers, a base64 string with a valid dimension or shape), and
    an upsert's columns its rows, so queries and upserts reach the engine; invalid fields are
    left invalid."""
    if path == "/v1/vectors/query":
        vectors, text = body.get("query_vectors"), body.get("query_contents")
        if vectors is None and isinstance(text, str):
            return  # a text query (refused: the index has no embedding model)
        if isinstance(vectors, list) and vectors and all(isinstance(v, list) for v in vectors):
            body["query_vectors"] = [_fit(v) for v in vectors]
        else:
            body["query_vectors"] = _fit(vectors)
        if isinstance(text, str):
            del body["query_contents"]  # only one of the two may be given
    elif path == "/v1/vectors/upsert" and isinstance(body.get("items"), list):
        for item in body["items"]:
            if isinstance(item, dict):
                item["vector"] = _fit(item.get("vector"))
    elif path in ("/v1/vectors/upsert_binary", "/v1/vectors/query_binary"):
        batch = body.get("batch")
        if (
            isinstance(batch, dict)
            and _int(batch.get("dimension"))
            and 1 <= batch["dimension"] <= 65536
            and isinstance(batch.get("vectors_b64"), str)
        ):
            ids = batch.get("ids")
            rows = len(ids) if isinstance(ids, list) else 2
            batch["dimension"], batch["vectors_b64"] = DIMENSION, _b64(rows)
            _fit_columns(batch, rows)
    elif path in ("/v1/vectors/upsert_arrays", "/v1/vectors/query_arrays"):
        field = "vectors" if path.endswith("upsert_arrays") else "query_vectors"
        shape = body.get("shape")
        if (
            isinstance(shape, list)
            and len(shape) == 2
            and all(_int(n) for n in shape)
            and isinstance(body.get(field), str)
        ):
            ids = body.get("ids")
            rows = len(ids) if isinstance(ids, list) else 2
            body["shape"], body[field] = [rows, DIMENSION], _b64(rows)
            _fit_columns(body, rows)


def aim_at_index(case: schemathesis.Case, idx: Index) -> None:
    """Point half the bodies at the real index with its key (and their vectors fitted to it),
    a quarter at it with the generated key (a 401), and leave a quarter as generated (mostly a
    404). Seven creates in eight go to the index's name: a 409 after every other check, where
    a create that succeeds costs a second (it starts the index's shard actors). Only fields the
    generator made valid are replaced, so a body meant to be invalid (negative mode) stays
    invalid."""
    if case.path.startswith("/v1/indexes/{index_name}/users"):
        aim_users_route(case, idx)
        return
    body = case.body
    if not isinstance(body, dict) or not _valid_name(body.get("index_name")):
        return
    share = _share(body)
    if case.path == "/v1/indexes/create":
        if share < 7:
            body["index_name"] = idx.name
        elif not body.get("text_fields"):
            # BM25's parameters without a full-text field are a 422 (kept apart from the
            # other checks): the creates meant to succeed do not send valid ones (invalid ones
            # stay, so a body meant to be invalid stays invalid).
            for name, top in (("bm25_k1", 10), ("bm25_b", 1)):
                v = body.get(name)
                if type(v) in (int, float) and 0 <= v <= top:
                    body.pop(name)
        return
    if share < 6:
        body["index_name"] = idx.name
        if share < 4 and _valid_key(body.get("index_key")):
            body["index_key"] = idx.key
            fit_vectors(case.path, body)


def aim_users_route(case: schemathesis.Case, idx: Index) -> None:
    """The per-index user routes name the index in their path and carry its key in the body
    (create) or the X-Index-Key header: aimed as the bodies above are. A user deleted from the
    real index with its key is one minted for the request, so the delete can succeed."""
    params = case.path_parameters or {}
    if not _valid_name(params.get("index_name")):
        return
    share = _share([case.method, params, case.body, case.headers])
    if share >= 6:
        return
    params["index_name"] = idx.name
    if share >= 4:
        return
    if isinstance(case.body, dict) and _valid_key(case.body.get("index_key")):
        case.body["index_key"] = idx.key
    headers = case.headers or {}
    if _valid_key(headers.get("X-Index-Key")):
        headers["X-Index-Key"] = idx.key
        if case.method == "DELETE" and isinstance(params.get("user_id"), str):
            minted = ok(
                idx.client.post(
                    f"/v1/indexes/{idx.name}/users",
                    json={"permissions": ["read"], "index_key": idx.key},
                )
            )
            params["user_id"] = minted["user_id"]


def cap_shards(case: schemathesis.Case) -> None:
    """A create asks for at most MAX_SHARDS shards. Each shard is an actor process: the 256 the
    schema allows are beyond a 2-core test machine (the server answers 503 when Ray cannot
    place them within its shard start timeout, a minute)."""
    body = case.body
    if not isinstance(body, dict):
        return
    n = body.get("n_shards")
    if _int(n) and MAX_SHARDS < n <= 256:
        body["n_shards"] = MAX_SHARDS


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(
    case: schemathesis.Case,
    service: Service,
    served_document: None,
    fuzz_index: Index,
    http: httpx.Client,
) -> None:
    if case.path == "/v1/indexes/create":
        cap_shards(case)
    aim_at_index(case, fuzz_index)
    # An operation with header parameters gets the API key as an explicit header: otherwise
    # the auth check takes the configured one for a generated one and expects a refusal.
    explicit = {"X-API-Key": API_KEY} if case.path.startswith("/v1/indexes/{index_name}/") else None
    response = case.call_and_validate(base_url=service.url, headers=explicit)
    STATUSES.setdefault(f"{case.method} {case.path}", Counter())[response.status_code] += 1
    if response.status_code != 200 or not isinstance(case.body, dict):
        return
    if case.path == "/v1/indexes/create":  # keep the cluster small: drop what was created
        created = {k: case.body[k] for k in ("index_name", "index_key")}
        ok(http.post("/v1/indexes/delete", json=created))
    elif case.path == "/v1/indexes/rotate_key" and case.body.get("index_name") == fuzz_index.name:
        fuzz_index.key = case.body["new_index_key"]  # the index answers to the new key now
    elif case.path == "/v1/indexes/delete" and case.body.get("index_name") == fuzz_index.name:
        create_index(http, name=fuzz_index.name, key=fuzz_index.key, dimension=DIMENSION)
        fuzz_index.upsert(ITEMS)


# What a fuzzer cannot reach: a restore opens only with a configuration and chunks sealed by a
# real backup (AES-GCM: no generated body opens). tests/integration/test_api_backup.py runs them
# and their refusals; here they must still answer every generated body by the schema, no 5xx.
SEALED_INPUT = {
    "POST /v1/indexes/restore/begin",
    "POST /v1/indexes/restore/chunk",
    "POST /v1/indexes/restore/commit",
}


def test_fuzzing_got_past_auth_and_lookup() -> None:
    """Every documented operation the fuzzer ran (all of them, unless deselected; those that
    need sealed input aside) was answered 2xx at least once: the requests aimed at the real
    index reached the routes' work."""
    documented = {
        f"{method.upper()} {path}"
        for path, operations in openapi_document()["paths"].items()
        for method in operations
    }
    ran = sorted(documented & set(STATUSES))
    for op in ran:
        print(op, dict(sorted(STATUSES[op].items())))  # with -s: what each operation got
    assert ran, "runs after test_api_conforms_to_its_schema, on what it recorded"
    for op in ran:
        if op in SEALED_INPUT:
            assert sum(n for status, n in STATUSES[op].items() if status >= 500) == 0, op
            continue
        done = STATUSES[op][200] + STATUSES[op][204]
        assert done, f"{op} was never answered 2xx: {dict(STATUSES[op])}"
