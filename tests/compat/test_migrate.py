"""CyborgDB's own migration tool, ``cyborgdb-migrate``, importing a ChromaDB collection into a
live vaultvec server.

The pinned release (``support.MIGRATE_REQUIREMENTS``) runs headless (``--config``) in its own
environment against a local persistent ChromaDB collection of ``N_ITEMS`` items (metadata
of ints, floats, strings and booleans, documents, some items without either); afterwards every
item is read back over HTTP and compared. The tool maps a ChromaDB item to a CyborgDB one as
``{id, vector, metadata (left out when None or empty), contents = the document (left out when
None)}`` and creates the index with ``dimension`` and ChromaDB's metric (``cosine``) only, with
an index key it generates and prints (``Generated encryption key (hex): ...``).

The resume test stops the tool for good in the middle of a run (``migrate_tool.py run
--hold-after``), kills it, and resumes it with ``--resume`` as the tool documents, against the
index it created (``create_index = false`` and its key: with ``create_index = true`` a resume
would create the index again).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.compat.support import ROOT, migrate_python
from tests.integration.conftest import API_KEY, Service

N_ITEMS = 3_000
DIM = 64
BATCH = 100  # the tool's default
CHECKPOINT_EVERY = 10  # the tool's default: a checkpoint when 10, 20, ... batches are done
SPOT_CHECK_PER_BATCH = 4  # the tool's default
HOLD_AFTER = 14  # batches on the server when the resume test kills the tool
MIGRATE_TIMEOUT_S = 300
TOOL = ROOT / "tests" / "compat" / "migrate_tool.py"
COLLECTION = "vaultvec-compat-source"
KEY_LINE = re.compile(r"Generated encryption key \(hex\):\s*([0-9a-f]{64})")


@dataclass(frozen=True)
class Source:
    """The ChromaDB collection the tool reads, and what it holds."""

    path: Path
    ids: list[str]
    vectors: np.ndarray
    metadatas: list[dict[str, Any] | None]
    documents: list[str | None]


def source_items(n: int) -> tuple[list[str], np.ndarray, list[dict[str, Any] | None], list[Any]]:
    rng = np.random.default_rng(20_180)
    vectors = (rng.normal(size=(n, DIM)) * rng.uniform(0.1, 10, size=(n, 1))).astype(np.float32)
    ids = [f"chroma-{i:05d}" if i % 11 else f"chroma/é {i}" for i in range(n)]
    tags = ("alpha", "beta", "γάμμα", "")
    metadatas: list[dict[str, Any] | None] = [
        None
        if i % 17 == 0
        else {
            "n": i,
            "big": i * 1_000_003 - 2**40,
            "score": i / 7,
            "tag": tags[i % len(tags)],
            "even": i % 2 == 0,
        }
        for i in range(n)
    ]
    documents = [
        None if i % 13 == 0 else f"document {i}: " + "naïve text ✓ " * (i % 5) for i in range(n)
    ]
    return ids, vectors, metadatas, documents


def env() -> dict[str, str]:
    # ChromaDB's telemetry off; COLUMNS wide enough that rich keeps the key on one line.
    return dict(os.environ, ANONYMIZED_TELEMETRY="False", COLUMNS="200")


@pytest.fixture(scope="module")
def migrate() -> Path:
    return migrate_python()


@pytest.fixture(scope="module")
def source(migrate: Path, tmp_path_factory: pytest.TempPathFactory) -> Source:
    ids, vectors, metadatas, documents = source_items(N_ITEMS)
    data = tmp_path_factory.mktemp("chroma-data")
    np.save(data / "vectors.npy", vectors)
    (data / "items.json").write_text(
        json.dumps({"ids": ids, "metadatas": metadatas, "documents": documents})
    )
    path = data / "chroma"
    proc = subprocess.run(
        [str(migrate), "-I", str(TOOL), "build", str(data), str(path), COLLECTION],
        capture_output=True,
        text=True,
        timeout=MIGRATE_TIMEOUT_S,
        env=env(),
    )
    assert proc.returncode == 0, f"building the ChromaDB collection failed:\n{proc.stderr[-3000:]}"
    assert json.loads(proc.stdout.splitlines()[-1]) == {"count": N_ITEMS}
    # The items as ChromaDB holds them are what the tool reads. It keeps documents exactly, but
    # vectors and float metadata only to about the last bit (0.21208432 reads 0.21208431,
    # 90.28571428571429 reads 90.28571428571428).
    held_vectors = np.load(data / "held.npy")
    held = json.loads((data / "held.json").read_text())
    assert np.allclose(held_vectors, vectors, rtol=1e-6, atol=0)
    assert held["documents"] == documents
    for sent, kept in zip(metadatas, held["metadatas"]):
        assert sent == kept or (
            sent is not None
            and kept is not None
            and sent.keys() == kept.keys()
            and all(
                v == kept[k] or (isinstance(v, float) and math.isclose(v, kept[k], rel_tol=1e-15))
                for k, v in sent.items()
            )
        ), (sent, kept)
    return Source(path, ids, held_vectors, held["metadatas"], held["documents"])


@pytest.fixture()
def http(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}, timeout=120) as c:
        yield c


def write_config(
    directory: Path, source: Source, url: str, index: str, index_key: str | None = None
) -> Path:
    """The tool's TOML config: create ``index``, or (``index_key`` given) use the existing one."""
    destination = (
        "create_index = true"
        if index_key is None
        else f'create_index = false\nindex_key = "{index_key}"'
    )
    config = directory / ("resume.toml" if index_key else "migrate.toml")
    config.write_text(
        f"""[source]
type = "chromadb"
mode = "Local"
path = "{source.path}"
index = "{COLLECTION}"

[destination]
host = "{url}"
api_key = "{API_KEY}"
index_name = "{index}"
{destination}

[options]
batch_size = {BATCH}
checkpoint_every = {CHECKPOINT_EVERY}
spot_check_per_batch = {SPOT_CHECK_PER_BATCH}
"""
    )
    return config


def tool_command(migrate: Path, config: Path, *args: str) -> list[str]:
    log = str(config.with_suffix(".log"))
    return [
        str(migrate),
        "-I",
        str(TOOL),
        "run",
        *args,
        "--",
        "--config",
        str(config),
        "--log-file",
        log,
    ]


def run_tool(migrate: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cyborgdb-migrate --config config [args]`` to its end, in the config's directory (where
    it keeps its checkpoints)."""
    cmd = tool_command(migrate, config) + list(args)
    return subprocess.run(
        cmd,
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=MIGRATE_TIMEOUT_S,
        env=env(),
    )


def outcome(proc: subprocess.CompletedProcess[str], config: Path) -> dict[str, Any]:
    """The figures of the tool's final report (on stderr); fails with its output otherwise."""
    log = config.with_suffix(".log")
    detail = (
        f"stderr:\n{proc.stderr[-3000:]}\nlog:\n{log.read_text()[-3000:] if log.exists() else ''}"
    )
    assert proc.returncode == 0, f"cyborgdb-migrate exited {proc.returncode}; {detail}"
    vectors = re.search(r"Vectors: ([\d,]+) / ([\d,]+)", proc.stderr)
    spot = re.search(r"Spot check: (PASSED|FAILED)", proc.stderr)
    details = re.search(r"Details: (.*)", proc.stderr)
    assert vectors and spot and details, f"no final report; {detail}"
    return {
        "migrated": int(vectors[1].replace(",", "")),
        "expected": int(vectors[2].replace(",", "")),
        "spot_check": spot[1],
        "details": details[1].strip(),
    }


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, f"{r.request.url.path} -> {r.status_code}: {r.text[:500]}"
    return r.json()


def check_index(http: httpx.Client, name: str, key: str, source: Source) -> int:
    """Every item of ``source`` in the index ``name``, exactly once and as the tool maps it;
    the number of items checked."""
    body = {"index_name": name, "index_key": key}
    described = ok(http.post("/v1/indexes/describe", json=body))
    # The 0.18 SDK creates a DiskIVF index, at float32 unless told: vaultvec's ivfflat.
    assert (described["index_type"], described["dimension"], described["metric"]) == (
        "ivfflat",
        DIM,
        "cosine",
    ), described
    listed = ok(http.post("/v1/vectors/list_ids", json=body))
    assert listed["count"] == N_ITEMS == len(listed["ids"]), listed["count"]
    assert sorted(listed["ids"]) == sorted(source.ids)
    assert ok(http.post("/v1/vectors/num_vectors", json=body))["result"] == N_ITEMS

    got: dict[str, dict[str, Any]] = {}
    for start in range(0, N_ITEMS, 1_000):
        ids = source.ids[start : start + 1_000]
        answer = ok(
            http.post(
                "/v1/vectors/get",
                json={**body, "ids": ids, "include": ["vector", "metadata", "contents"]},
            )
        )
        assert [r["id"] for r in answer["results"]] == ids
        got.update((r["id"], r) for r in answer["results"])
    assert len(got) == N_ITEMS

    wrong: list[str] = []
    for i, item_id in enumerate(source.ids):
        item = got[item_id]
        vector = np.asarray(item["vector"], dtype=np.float32)
        expected_vector = source.vectors[i]
        # A cosine index keeps the unit vector and the norm: the vector as sent, to float32
        # rounding.
        if vector.shape != expected_vector.shape or not np.allclose(
            vector, expected_vector, rtol=1e-5, atol=1e-6
        ):
            wrong.append(f"{item_id}: vector differs by {np.abs(vector - expected_vector).max()}")
        if item["metadata"] != (source.metadatas[i] or {}):
            wrong.append(f"{item_id}: metadata {item['metadata']!r} != {source.metadatas[i]!r}")
        if item.get("contents") != source.documents[i]:
            wrong.append(f"{item_id}: contents {item.get('contents')!r} != {source.documents[i]!r}")
    assert not wrong, f"{len(wrong)} differences:\n" + "\n".join(wrong[:20])
    return len(got)


def drop(http: httpx.Client, name: str, key: str | None) -> None:
    if key is not None:
        http.post("/v1/indexes/delete", json={"index_name": name, "index_key": key})


def test_migrate_chromadb(
    service: Service, migrate: Path, source: Source, http: httpx.Client, tmp_path: Path
) -> None:
    index = f"migrated-{uuid.uuid4().hex[:10]}"
    config = write_config(tmp_path, source, service.url, index)
    proc = run_tool(migrate, config)
    key = m[1] if (m := KEY_LINE.search(proc.stderr)) else None
    try:
        result = outcome(proc, config)
        assert key is not None, proc.stderr
        assert result["migrated"] == result["expected"] == N_ITEMS, result
        samples = SPOT_CHECK_PER_BATCH * N_ITEMS // BATCH
        assert result["spot_check"] == "PASSED", result
        assert result["details"] == (
            f"Count check: {N_ITEMS:,}/{N_ITEMS:,} vectors. "
            f"Spot check: {samples}/{samples} verified"
        ), result
        assert check_index(http, index, key, source) == N_ITEMS
        assert not list((tmp_path / "cyborgdb-migrate-checkpoints").glob("*.json"))
    finally:
        drop(http, index, key)


def test_migrate_resume(
    service: Service, migrate: Path, source: Source, http: httpx.Client, tmp_path: Path
) -> None:
    index = f"resumed-{uuid.uuid4().hex[:10]}"
    config = write_config(tmp_path, source, service.url, index)
    marker = tmp_path / "held"
    stderr = tmp_path / "first-run.err"
    cmd = tool_command(migrate, config, "--hold-after", str(HOLD_AFTER), "--marker", str(marker))
    key: str | None = None
    with stderr.open("w") as err:
        first = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env()
        )
    try:
        deadline = time.monotonic() + MIGRATE_TIMEOUT_S
        while not marker.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        key = m[1] if (m := KEY_LINE.search(stderr.read_text())) else None
        assert marker.exists(), (
            f"the first run never reached batch {HOLD_AFTER + 1} (exit {first.poll()}):\n"
            f"{stderr.read_text()[-3000:]}"
        )
        assert key is not None, stderr.read_text()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    try:
        # The tool saved its checkpoint when 10 batches were done and the 11th was sent: it
        # resumes after the 11th. The server holds the 14 batches sent before the kill.
        checkpoints = list((tmp_path / "cyborgdb-migrate-checkpoints").glob("*.json"))
        assert len(checkpoints) == 1, checkpoints
        checkpoint = json.loads(checkpoints[0].read_text())
        done = HOLD_AFTER // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        assert (checkpoint["cursor"], checkpoint["vectors_migrated"]) == (
            str((done + 1) * BATCH),
            done * BATCH,
        ), checkpoint
        body = {"index_name": index, "index_key": key}
        held = ok(http.post("/v1/vectors/num_vectors", json=body))["result"]
        assert held == HOLD_AFTER * BATCH

        # Resumed with the config that created the index, the tool creates it again: refused
        # (409), the index as it was.
        again = run_tool(migrate, config, "--resume")
        assert again.returncode == 1 and "ConflictError" in again.stderr, again.stderr[-3000:]
        assert ok(http.post("/v1/vectors/num_vectors", json=body))["result"] == held

        resumed = write_config(tmp_path, source, service.url, index, index_key=key)
        # The tool finds its checkpoint by source, collection and index, not by config file.
        proc = run_tool(migrate, resumed, "--resume")
        result = outcome(proc, resumed)
        sent_again = N_ITEMS - int(checkpoint["cursor"])
        assert "Generated encryption key" not in proc.stderr
        assert result["expected"] == N_ITEMS, result
        # Its count starts from the checkpoint's, which leaves out the batch in flight.
        assert result["migrated"] == checkpoint["vectors_migrated"] + sent_again, result
        assert result["spot_check"] == "PASSED", result
        assert result["details"].startswith(f"Count check: {N_ITEMS:,}/{N_ITEMS:,} vectors."), (
            result
        )
        # Items upserted both before the kill and again after it are there once.
        assert check_index(http, index, key, source) == N_ITEMS
        assert not checkpoints[0].exists(), "the checkpoint outlived a finished migration"
    finally:
        drop(http, index, key)
