"""/v1/health and /v1/indexes/*: response shapes, defaults, lifecycle, deletion of stored bytes."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

import serve_app
from cluster.client import generate_key
from tests.integration.conftest import API_KEY, AUTO_TRAIN_THRESHOLD
from tests.integration.support import create_index, error, ok, unique_name

ROUTES = [
    ("GET", "/v1/indexes/list"),
    ("GET", "/v1/indexes/training-status"),
    ("POST", "/v1/indexes/create"),
    ("POST", "/v1/indexes/describe"),
    ("POST", "/v1/indexes/delete"),
    ("POST", "/v1/indexes/train"),
    ("POST", "/v1/vectors/upsert"),
    ("POST", "/v1/vectors/query"),
    ("POST", "/v1/vectors/get"),
    ("POST", "/v1/vectors/delete"),
    ("POST", "/v1/vectors/list_ids"),
    ("POST", "/v1/vectors/num_vectors"),
]


def test_health_needs_no_api_key(service):
    r = httpx.get(f"{service.url}/v1/health")
    body = ok(r)
    assert set(body) == {"status", "api_version", "version", "vaultvec_version"}
    assert body["status"] == "healthy" and body["api_version"] == "v1"
    # CyborgDB's tools read version as the CyborgDB service release (cyborgdb-migrate 0.18
    # refuses any other than 0.18.*); vaultvec's own release is beside it.
    assert body["version"] == "0.18.0"
    assert body["vaultvec_version"] == serve_app.__version__


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("api_key", [None, "", "wrong-key", API_KEY + "x"])
def test_every_other_route_needs_a_valid_api_key(service, method, path, api_key):
    headers = {} if api_key is None else {"X-API-Key": api_key}
    # A well-formed body for an index that exists nowhere: auth must be checked first (not 404).
    body = {"index_name": unique_name(), "index_key": generate_key(), "ids": ["a"]}
    r = httpx.request(
        method, f"{service.url}{path}", headers=headers, json=body if method == "POST" else None
    )
    err = error(r, 401)
    if api_key:
        assert api_key not in err["detail"]


def test_any_configured_api_key_is_accepted(service):
    for key in (API_KEY, "second-key"):
        body = ok(httpx.get(f"{service.url}/v1/indexes/list", headers={"X-API-Key": key}))
        assert set(body) == {"indexes"} and isinstance(body["indexes"], list)


def test_create_list_describe_delete_lifecycle(http):
    name, key = unique_name(), generate_key()
    body = {
        "index_name": name,
        "index_key": key,
        "index_config": {"type": "ivfflat", "dimension": 8},
        "metric": "cosine",
    }
    created = ok(http.post("/v1/indexes/create", json=body))
    assert set(created) == {"status", "message"} and created["status"] == "success"
    try:
        assert name in ok(http.get("/v1/indexes/list"))["indexes"]

        # The name is taken whatever key or config the second request brings.
        error(http.post("/v1/indexes/create", json=body), 409)
        error(
            http.post("/v1/indexes/create", json={"index_name": name, "index_key": generate_key()}),
            409,
        )

        ident = {"index_name": name, "index_key": key}
        desc = ok(http.post("/v1/indexes/describe", json=ident))
        memory = desc.pop("memory")  # vaultvec's own (test_index_capacity checks it)
        assert [p["shard"] for p in memory["partitions"]] == [0]  # one per Ray node by default
        # CyborgDB's shape: its SDKs read index_config["index_type"] (0.11-0.16) and the
        # top-level dimension/metric/n_lists (0.17+), all ints, 0 for unknown or unused.
        assert desc == {
            "index_name": name,
            "index_type": "ivfflat",
            "storage_precision": "float32",  # vaultvec's: what its ivfflat storage is
            "is_trained": False,
            "dimension": 8,
            "metric": "cosine",
            "n_lists": 1,
            "index_config": {
                "index_type": "ivfflat",
                "type": "ivfflat",
                "dimension": 8,
                "metric": "cosine",
                "n_lists": 1,
                "pq_dim": 0,
                "pq_bits": 0,
            },
            "embedding_model": None,
            "metadata_schema": {},  # CyborgDB 0.18's: the policies given at create (none here)
            "bm25": None,  # CyborgDB 0.18's: no full_text field
            "num_vectors": 0,
            "recall": None,  # vaultvec's live recall estimate: none until trained
        }

        items = [{"id": f"v{i}", "vector": [float(i + 1)] * 8} for i in range(5)]
        ok(http.post("/v1/vectors/upsert", json={**ident, "items": items}))
        assert ok(http.post("/v1/indexes/describe", json=ident))["num_vectors"] == 5

        deleted = ok(http.post("/v1/indexes/delete", json=ident))
        assert set(deleted) == {"status", "message"} and deleted["status"] == "success"
        assert name not in ok(http.get("/v1/indexes/list"))["indexes"]
        for route in (
            "indexes/describe",
            "vectors/num_vectors",
            "vectors/list_ids",
            "indexes/delete",
        ):
            error(http.post(f"/v1/{route}", json=ident), 404)
        error(http.post("/v1/vectors/query", json={**ident, "query_vectors": [1.0] * 8}), 404)

        # The name is free again: a new index under it starts empty, with a new key.
        key2 = generate_key()
        ok(http.post("/v1/indexes/create", json={"index_name": name, "index_key": key2}))
        key = key2
        ident = {"index_name": name, "index_key": key2}
        assert ok(http.post("/v1/vectors/num_vectors", json=ident)) == {
            "status": "success",
            "message": "The index holds 0 vectors",
            "result": 0,
        }
        error(
            http.post("/v1/indexes/describe", json={**ident, "index_key": body["index_key"]}), 401
        )
    finally:
        http.post("/v1/indexes/delete", json={"index_name": name, "index_key": key})


def test_create_with_explicit_nulls_uses_defaults(http):
    name, key = unique_name(), generate_key()
    body = {
        "index_name": name,
        "index_key": key,
        "index_config": None,
        "metric": None,
        "embedding_model": None,
    }
    ok(http.post("/v1/indexes/create", json=body))
    try:
        desc = ok(http.post("/v1/indexes/describe", json={"index_name": name, "index_key": key}))
        assert desc["index_type"] == "ivfflat"
        assert desc["index_config"]["type"] == "ivfflat"
        assert desc["index_config"]["metric"] == "euclidean"
        assert desc["index_config"]["dimension"] == 0 and desc["dimension"] == 0
        assert desc["is_trained"] is False and desc["num_vectors"] == 0
        # The first upsert fixes the dimension.
        item = {"id": "a", "vector": [1.0, 2.0, 3.0, 4.0, 5.0]}
        ok(
            http.post(
                "/v1/vectors/upsert", json={"index_name": name, "index_key": key, "items": [item]}
            )
        )
        desc = ok(http.post("/v1/indexes/describe", json={"index_name": name, "index_key": key}))
        assert desc["index_config"]["dimension"] == 5 and desc["num_vectors"] == 1
        bad = {"id": "b", "vector": [1.0, 2.0, 3.0]}
        error(
            http.post(
                "/v1/vectors/upsert", json={"index_name": name, "index_key": key, "items": [bad]}
            ),
            422,
        )
    finally:
        http.post("/v1/indexes/delete", json={"index_name": name, "index_key": key})


@pytest.mark.parametrize("index_type", ["ivfflat", "ivf", "ivfpq"])
def test_describe_reports_each_index_type(make_index, index_type):
    extra = {"pq_dim": 4, "pq_bits": 6} if index_type == "ivfpq" else {}
    idx = make_index(index_type=index_type, dimension=16, metric="squared_euclidean", **extra)
    desc = idx.describe()
    assert desc["index_type"] == index_type
    cfg = desc["index_config"]
    assert (
        cfg["type"] == index_type
        and cfg["dimension"] == 16
        and cfg["metric"] == "squared_euclidean"
    )
    if index_type == "ivfpq":
        assert cfg["pq_dim"] == 4 and cfg["pq_bits"] == 6
    else:
        assert cfg["pq_dim"] == 0 and cfg["pq_bits"] == 0  # unused, as CyborgDB answers


def test_metric_may_be_given_inside_index_config(http):
    name, key = unique_name(), generate_key()
    body = {
        "index_name": name,
        "index_key": key,
        "index_config": {"type": "ivf", "metric": "cosine"},
    }
    ok(http.post("/v1/indexes/create", json=body))
    try:
        desc = ok(http.post("/v1/indexes/describe", json={"index_name": name, "index_key": key}))
        assert desc["index_config"]["metric"] == "cosine" and desc["index_type"] == "ivf"
    finally:
        http.post("/v1/indexes/delete", json={"index_name": name, "index_key": key})


@pytest.mark.parametrize(
    "config",
    [
        {"type": "ivfpq", "dimension": 10, "pq_dim": 3},  # pq_dim must divide the dimension
        {"type": "ivfpq", "dimension": 8, "pq_dim": 2, "pq_bits": -1},
        {"type": "ivfpq", "dimension": 8, "pq_dim": 2, "pq_bits": 17},
        {"type": "hnsw", "dimension": 8},
        {"type": "ivfflat", "dimension": 0},
    ],
)
def test_invalid_index_config_is_422_and_creates_nothing(http, config):
    name = unique_name()
    r = http.post(
        "/v1/indexes/create",
        json={"index_name": name, "index_key": generate_key(), "index_config": config},
    )
    error(r, 422)
    assert name not in ok(http.get("/v1/indexes/list"))["indexes"]


@pytest.mark.parametrize("name", ["", "n" * 256])
def test_invalid_index_name_is_422(http, name):
    error(
        http.post("/v1/indexes/create", json={"index_name": name, "index_key": generate_key()}), 422
    )
    assert name not in ok(http.get("/v1/indexes/list"))["indexes"]


def test_index_names_are_opaque_strings(service, http):
    """Any name works and never becomes a path (the store uses random index ids)."""
    names = [f"../../escape-{uuid.uuid4().hex[:8]}", f"ünï cödé/{uuid.uuid4().hex[:8]} ✓", " "]
    outside = service.storage.parent.parent / names[0].rsplit("/", 1)[1]
    for name in names:
        idx = create_index(http, name=name, dimension=2)
        try:
            assert name in ok(http.get("/v1/indexes/list"))["indexes"]
            idx.upsert([{"id": "a", "vector": [1.0, 2.0]}])
            assert idx.describe()["index_name"] == name
            assert idx.get(["a"], include=[]) == [{"id": "a"}]
            assert not outside.exists()
        finally:
            ok(idx.post("indexes/delete"))
        assert name not in ok(http.get("/v1/indexes/list"))["indexes"]


def test_unknown_metric_is_422(http):
    name = unique_name()
    r = http.post(
        "/v1/indexes/create",
        json={"index_name": name, "index_key": generate_key(), "metric": "manhattan"},
    )
    error(r, 422)
    assert name not in ok(http.get("/v1/indexes/list"))["indexes"]


def test_pq_dim_checked_against_dimension_fixed_by_first_upsert(make_index):
    idx = make_index(index_type="ivfpq", pq_dim=3)
    r = idx.post("vectors/upsert", items=[{"id": "a", "vector": [1.0] * 8}])
    error(r, 422)
    assert idx.count() == 0
    idx.upsert([{"id": "a", "vector": [1.0] * 9}])
    assert idx.describe()["index_config"]["dimension"] == 9


def test_training_status_shape(http):
    """Every field CyborgDB's SDK response models require, with their types."""
    body = ok(http.get("/v1/indexes/training-status"))
    assert body == {
        "training_indexes": [],
        "retrain_threshold": AUTO_TRAIN_THRESHOLD,
        "worker_pid": body["worker_pid"],
        "global_training": {},
        "currently_training": None,
        "queued_indexes": [],
        "worker_running": False,
    }
    assert isinstance(body["worker_pid"], int) and body["worker_pid"] > 0


@pytest.mark.parametrize(
    ("body", "index_type", "pq_dim", "pq_bits"),
    [
        # 0.9-era form: n_lists and metric inside index_config
        ({"index_config": {"type": "ivfflat", "dimension": 8, "n_lists": 3}}, "ivfflat", 0, 0),
        ({"index_config": {"index_type": "ivfpq", "pq_dim": 4, "pq_bits": 8}}, "ivfpq", 4, 8),
        ({"index_config": {"type": "ivfsq", "sq_bits": 16}}, "ivf", 0, 0),
        # 0.17+: top-level fields, CyborgDB's DiskIVF and its storage precision
        ({"dimension": 8, "index_type": "diskivf"}, "ivfflat", 0, 0),
        ({"dimension": 8, "storage_precision": "float16"}, "ivf", 0, 0),
        ({"dimension": 8, "storage_precision": "float32", "n_lists": 3}, "ivfflat", 0, 0),
    ],
)
def test_create_accepts_every_sdk_generation(http, body, index_type, pq_dim, pq_bits):
    name, key = unique_name(), generate_key()
    ok(http.post("/v1/indexes/create", json={"index_name": name, "index_key": key, **body}))
    ident = {"index_name": name, "index_key": key}
    try:
        x = np.random.default_rng(1).normal(size=(300, 8)).astype(np.float32)
        items = [{"id": f"v{i}", "vector": row} for i, row in enumerate(x.tolist())]
        ok(http.post("/v1/vectors/upsert", json={**ident, "items": items}))
        desc = ok(http.post("/v1/indexes/describe", json=ident))
        assert desc["index_type"] == desc["index_config"]["index_type"] == index_type
        assert (desc["index_config"]["pq_dim"], desc["index_config"]["pq_bits"]) == (
            pq_dim,
            pq_bits,
        )
        ok(http.post("/v1/indexes/train", json=ident))
        desc = ok(http.post("/v1/indexes/describe", json=ident))
        if (body.get("index_config") or body).get("n_lists") == 3:  # honoured, not dropped
            assert desc["n_lists"] == desc["index_config"]["n_lists"] == 3
        query = {**ident, "query_vectors": items[7]["vector"], "top_k": 3, "greedy": True}
        hits = ok(http.post("/v1/vectors/query", json=query))["results"]
        assert "v7" in [h["id"] for h in hits]  # quantised types: among the nearest
    finally:
        http.post("/v1/indexes/delete", json=ident)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"dimension": 8, "index_type": "ivfpq", "storage_precision": "tq4"}, "diskivf"),
        ({"dimension": 8, "kms_name": "aws"}, "KMS"),
        ({"dimension": 8, "kms_name": "aws", "index_key": None}, "KMS"),  # as 0.17+ send it
        ({"dimension": 8, "index_key": None}, "index_key is required"),
        (
            {
                "dimension": 8,
                "text_fields": ["body"],
                "metadata_schema": {"body": {"pattern": True}},
            },
            "full_text excludes pattern",
        ),
        ({"dimension": 8, "bm25_b": 0.5}, "need a full_text field"),
        ({"index_config": {"type": "ivfflat", "sq_bits": 16}}, "sq_bits"),
    ],
)
def test_unsupported_cyborgdb_features_are_named_422s(http, body, named):
    name = unique_name()
    r = http.post(
        "/v1/indexes/create", json={"index_name": name, "index_key": generate_key(), **body}
    )
    assert named in error(r, 422)["detail"]
    assert name not in ok(http.get("/v1/indexes/list"))["indexes"]


def _files(root: Path) -> tuple[set[Path], set[Path]]:
    """The store's files and directories; not the audit log, which the service keeps beside
    them (its records of the index's requests, names and counts, outlive the index by design:
    docs/security.md, Audit log)."""
    files, dirs = set(), set()
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root and "audit" in dirnames:
            dirnames.remove("audit")
        dirs.update(Path(dirpath) / d for d in dirnames)
        files.update(Path(dirpath) / f for f in filenames)
    return files, dirs


def test_delete_index_removes_every_stored_byte(service, make_index):
    files_before, dirs_before = _files(service.storage)
    idx = make_index(dimension=8)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(80, 8)).astype(np.float32)
    # Single-item upserts: each shard's WAL rolls (every 16 records) into a snapshot.
    for j in range(40):
        idx.upsert(
            [{"id": f"d{j}", "vector": vectors[j].tolist(), "contents": "x", "metadata": {"j": j}}]
        )
    idx.upsert_arrays([f"d{j}" for j in range(40, 80)], vectors[40:])
    idx.train(n_lists=2)
    idx.delete_ids(["d0", "d1"])

    files_during, _ = _files(service.storage)
    new_files = files_during - files_before
    assert any("snap" in p.parts for p in new_files), sorted(map(str, new_files))
    assert any("wal" in p.parts for p in new_files)
    assert any("template" in p.parts for p in new_files)

    ok(idx.post("indexes/delete"))
    files_after, dirs_after = _files(service.storage)
    assert not (files_after & new_files), "files of the deleted index remain"
    assert not (files_after - files_before), sorted(map(str, files_after - files_before))
    assert not (dirs_after - dirs_before), sorted(map(str, dirs_after - dirs_before))
    needle = idx.name.encode()
    for path in files_after:
        assert needle not in path.read_bytes(), f"{path} still names the deleted index"


def test_deleted_index_cannot_be_reached_with_its_old_key_after_recreation(make_index, http):
    idx = make_index(dimension=4)
    idx.upsert([{"id": "old", "vector": [1.0, 2.0, 3.0, 4.0], "contents": "old contents"}])
    ok(idx.post("indexes/delete"))
    again = create_index(http, name=idx.name, dimension=4)
    try:
        error(idx.post("vectors/get", ids=["old"]), 401)
        assert again.get(["old"]) == []
        assert again.count() == 0
    finally:
        again.drop()
