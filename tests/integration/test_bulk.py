"""The bulk driver against the session server: HTTP (JSON and binary) and the Ray transport
(in-process DeploymentHandle on the session's Serve app), every input and output format,
resume after an interruption, and the CLI interrupted by a real SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from cluster import bulk
from cluster.bulk.files import Batch
from cluster.client import Client, QueryResult, generate_key
from cluster.client.errors import AuthenticationError, IndexNotFoundError, InvalidRequestError
from tests.helpers import clustered, write_fvecs
from tests.integration.conftest import API_KEY, Service
from tests.integration.support import unique_name

N, D, NQ, K = 1500, 16, 240, 5
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return clustered(N + NQ, D, n_clusters=10, seed=9)


@pytest.fixture(scope="module")
def ray_handle(service: Service) -> Any:
    from ray import serve

    return serve.get_app_handle("vaultvec")


@pytest.fixture(scope="module")
def loaded(
    service: Service, data: np.ndarray, ray_handle: Any, tmp_path_factory: Any
) -> Iterator[Any]:
    """An index filled by bulk-upsert: half over HTTP (binary), half over the Ray transport."""
    name, key = unique_name("bulk"), generate_key()
    tmp = tmp_path_factory.mktemp("bulk-in")
    with Client(service.url, API_KEY) as c:
        idx = c.create_index(name, key, dimension=D)
        half = N // 2
        np.save(tmp / "a.npy", data[:half])
        docs = [
            {"id": str(half + i), "vector": v.tolist(), "metadata": {"row": half + i}}
            for i, v in enumerate(data[half:N])
        ]
        (tmp / "b.jsonl").write_bytes(b"\n".join(orjson.dumps(d) for d in docs))

        async def fill() -> tuple[bulk.Report, bulk.Report]:
            http = bulk.HttpTransport(service.url, API_KEY, name, key, wire="binary")
            a = await bulk.bulk_upsert(
                tmp / "a.npy", http, index=name, batch_size=200, show_progress=False
            )
            await http.close()
            ray_t = bulk.RayTransport(ray_handle, name, key)
            b = await bulk.bulk_upsert(
                tmp / "b.jsonl", ray_t, index=name, batch_size=200, show_progress=False
            )
            return a, b

        a, b = asyncio.run(fill())
        assert a.ok and b.ok and a.rows_done == half and b.rows_done == N - half
        assert idx.num_vectors() == N
        assert idx.get([str(N - 1)])[0]["metadata"] == {"row": N - 1}
        yield idx
        idx.drop()


@pytest.fixture(scope="module")
def expected(loaded: Any, data: np.ndarray) -> QueryResult:
    return loaded.query(data[N:], top_k=K, include=["distance"])


def write_input(path: Path, q: np.ndarray) -> Path:
    if path.suffix == ".npy":
        np.save(path, q)
    elif path.suffix == ".fvecs":
        write_fvecs(path, q)
    elif path.suffix == ".jsonl":
        path.write_bytes(
            b"".join(
                orjson.dumps({"id": f"q{i}", "vector": r.tolist()}) + b"\n" for i, r in enumerate(q)
            )
        )
    else:
        path.write_text("".join("\t".join(repr(float(v)) for v in r) + "\n" for r in q))
    return path


def read_output(out: Path) -> tuple[list[list[str]], np.ndarray]:
    if out.suffix == ".npy":
        res = np.load(out)
        return [list(r) for r in res["ids"]], res["distances"]
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return [r["ids"] for r in rows], np.array([r["distances"] for r in rows], dtype=np.float32)


def run(coro: Any) -> bulk.Report:
    report: bulk.Report = asyncio.run(coro)
    return report


def transport(kind: str, service: Service, idx: Any, ray_handle: Any) -> Any:
    if kind == "ray":
        return bulk.RayTransport(ray_handle, idx.name, idx.key)
    return bulk.HttpTransport(service.url, API_KEY, idx.name, idx.key, wire=kind)


async def query_with(
    kind: str, service: Service, idx: Any, ray_handle: Any, inp: Path, out: Path, **kw: Any
) -> bulk.Report:
    t = transport(kind, service, idx, ray_handle)
    try:
        kw.setdefault("batch_size", 64)
        return await bulk.bulk_query(
            inp, out, t, bulk.QueryOptions(top_k=K), index=idx.name, show_progress=False, **kw
        )
    finally:
        await t.close()


@pytest.mark.parametrize("kind", ["json", "binary", "ray"])
def test_every_transport_gives_the_client_results(
    kind: str,
    service: Service,
    loaded: Any,
    ray_handle: Any,
    data: np.ndarray,
    expected: QueryResult,
    tmp_path: Path,
) -> None:
    inp = write_input(tmp_path / "q.npy", data[N:])
    out = tmp_path / "r.npy"
    report = run(query_with(kind, service, loaded, ray_handle, inp, out, concurrency=3))
    assert report.ok and report.rows_done == NQ
    ids, dist = read_output(out)
    assert ids == expected.ids.tolist()
    assert expected.distances is not None
    np.testing.assert_allclose(dist, expected.distances, rtol=1e-6)


@pytest.mark.parametrize(
    ("in_fmt", "out_fmt"),
    [(".npy", ".jsonl"), (".fvecs", ".npy"), (".jsonl", ".jsonl"), (".tsv", ".npy")],
)
def test_input_and_output_formats(
    in_fmt: str,
    out_fmt: str,
    service: Service,
    loaded: Any,
    ray_handle: Any,
    data: np.ndarray,
    expected: QueryResult,
    tmp_path: Path,
) -> None:
    inp = write_input(tmp_path / f"q{in_fmt}", data[N:])
    out = tmp_path / f"r{out_fmt}"
    assert run(query_with("auto", service, loaded, ray_handle, inp, out)).ok
    ids, dist = read_output(out)
    assert ids == expected.ids.tolist()
    assert expected.distances is not None
    np.testing.assert_allclose(dist, expected.distances, rtol=1e-4)
    if in_fmt == ".jsonl" and out_fmt == ".jsonl":  # the input's ids name the queries
        first = orjson.loads(out.read_bytes().splitlines()[0])
        assert first["query"] == "q0"


class StopAfter:
    """Sets ``stop`` after ``n`` batches, as a first Ctrl-C does."""

    def __init__(self, inner: Any, stop: asyncio.Event, n: int) -> None:
        self.inner, self.stop, self.n = inner, stop, n

    async def query(self, x: np.ndarray, opts: bulk.QueryOptions) -> QueryResult:
        self.n -= 1
        if self.n <= 0:
            self.stop.set()
        return await self.inner.query(x, opts)

    async def upsert(self, batch: Batch, ids: list[str]) -> int:
        return await self.inner.upsert(batch, ids)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("kind", ["binary", "ray"])
def test_resume_after_interruption(
    kind: str,
    service: Service,
    loaded: Any,
    ray_handle: Any,
    data: np.ndarray,
    expected: QueryResult,
    tmp_path: Path,
) -> None:
    inp = write_input(tmp_path / "q.npy", data[N:])
    out = tmp_path / "r.npy"

    async def interrupted() -> bulk.Report:
        stop = asyncio.Event()
        t = StopAfter(transport(kind, service, loaded, ray_handle), stop, 2)
        try:
            return await bulk.bulk_query(
                inp, out, t, bulk.QueryOptions(top_k=K), index=loaded.name, batch_size=20,
                concurrency=2, chunk_rows=40, show_progress=False, stop=stop,
            )  # fmt: skip
        finally:
            await t.close()

    first = run(interrupted())
    assert first.interrupted and 40 <= first.rows_done < NQ and first.rows_done % 20 == 0
    assert f"rows 0-{first.rows_done - 1}" in first.summary()
    assert not out.exists() and (tmp_path / "r.npy.parts").is_dir()
    second = run(query_with(kind, service, loaded, ray_handle, inp, out, batch_size=20))
    assert second.ok and second.resumed_from == first.rows_done
    assert read_output(out)[0] == expected.ids.tolist()


def test_ray_transport_errors_are_typed(loaded: Any, ray_handle: Any) -> None:
    async def go() -> None:
        good = bulk.RayTransport(ray_handle, loaded.name, loaded.key)
        with pytest.raises(InvalidRequestError) as bad:
            await good.query(np.ones((2, D + 1), np.float32), bulk.QueryOptions(top_k=3))
        assert (
            bad.value.detail == f"query_vectors has dimension {D + 1}, the index has dimension {D}"
        )
        with pytest.raises(InvalidRequestError, match="NaN"):
            await good.query(np.full((2, D), np.nan, np.float32), bulk.QueryOptions())
        with pytest.raises(InvalidRequestError, match="top_k"):
            await good.query(np.ones((2, D), np.float32), bulk.QueryOptions(top_k=0))
        batch = Batch(0, 0, np.ones((2, D), np.float32), None)
        with pytest.raises(InvalidRequestError, match="more than once"):
            await good.upsert(batch, ["x", "x"])
        with pytest.raises(AuthenticationError):
            await bulk.RayTransport(ray_handle, loaded.name, generate_key()).query(
                np.ones((1, D), np.float32), bulk.QueryOptions()
            )
        with pytest.raises(IndexNotFoundError):
            await bulk.RayTransport(ray_handle, unique_name("nope"), loaded.key).query(
                np.ones((1, D), np.float32), bulk.QueryOptions()
            )

    asyncio.run(go())


def test_ray_transport_metadata(loaded: Any, ray_handle: Any, data: np.ndarray) -> None:
    async def go() -> QueryResult:
        t = bulk.RayTransport(ray_handle, loaded.name, loaded.key)
        return await t.query(
            data[N - 3 : N], bulk.QueryOptions(top_k=2, include=("distance", "metadata"))
        )

    r = asyncio.run(go())
    assert r.ids[:, 0].tolist() == [str(N - 3), str(N - 2), str(N - 1)]
    assert r.metadata is not None and r.metadata[2, 0] == {"row": N - 1}


def test_ray_transport_takes_batches_over_4_mib(
    loaded: Any, ray_handle: Any, data: np.ndarray
) -> None:
    """Serve's throughput mode (the default) sends handle calls over gRPC, whose servers take
    messages of 4 MiB unless told otherwise: a bulk batch of vectors is often larger."""
    rows = (5 << 20) // data[:N].itemsize // D + 1
    queries = np.resize(data[:N], (rows, D))
    assert queries.nbytes > 5 << 20

    async def go() -> QueryResult:
        t = bulk.RayTransport(ray_handle, loaded.name, loaded.key)
        return await t.query(queries, bulk.QueryOptions(top_k=1))

    r = asyncio.run(go())
    assert r.ids[:, 0].tolist() == [str(i % N) for i in range(rows)]


AWKWARD_IDS = ['say "hi"', "back\\slash", "tab\there", "é中😀", "nul\x00byte", "x" * 1024, "plain"]


@pytest.mark.parametrize("kind", ["json", "binary", "ray"])
def test_ids_that_json_escapes_come_back_intact(
    kind: str, service: Service, ray_handle: Any, data: np.ndarray
) -> None:
    """Result ids travel packed (one byte buffer per block) from the shards to the answer:
    quotes, backslashes, control characters, multi-byte UTF-8 and the longest id allowed
    arrive as they were stored, over every transport, with and without padding."""
    name, key = unique_name("ids"), generate_key()
    with Client(service.url, API_KEY) as c:
        idx = c.create_index(name, key, dimension=D)
        try:
            idx.upsert(AWKWARD_IDS, data[: len(AWKWARD_IDS)])

            async def go(q: np.ndarray, k: int) -> QueryResult:
                t = transport(kind, service, idx, ray_handle)
                try:
                    return await t.query(q, bulk.QueryOptions(top_k=k, include=("distance",)))
                finally:
                    await t.close()

            q = data[: len(AWKWARD_IDS)]
            full = asyncio.run(go(q, 1))  # every row full: the fast JSON array
            assert full.ids[:, 0].tolist() == AWKWARD_IDS
            padded = asyncio.run(go(q[:2], len(AWKWARD_IDS) + 3))  # padding dropped first
            assert padded.counts.tolist() == [len(AWKWARD_IDS)] * 2
            assert sorted(padded.ids[0, : len(AWKWARD_IDS)].tolist()) == sorted(AWKWARD_IDS)
            assert padded.ids[0, 0] == AWKWARD_IDS[0] and padded.ids[1, 0] == AWKWARD_IDS[1]
            assert padded.ids[:, len(AWKWARD_IDS) :].tolist() == [[None] * 3] * 2
        finally:
            idx.drop()


def cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_sigint_then_resume(
    service: Service, loaded: Any, data: np.ndarray, expected: QueryResult, tmp_path: Path
) -> None:
    reps = 3  # 720 queries in batches of 4: long enough to interrupt
    inp = write_input(tmp_path / "q.npy", np.tile(data[N:], (reps, 1)))
    out = tmp_path / "r.jsonl"
    env = {
        **os.environ,
        "VAULTVEC_API_KEY": API_KEY,
        "VAULTVEC_INDEX_KEY": loaded.key,
        "VAULTVEC_URL": service.url,
    }
    args = ["bulk-query", str(inp), str(out), "--index", loaded.name, "--top-k", str(K),
            "--batch-size", "4", "--concurrency", "2", "--chunk-rows", "4"]  # fmt: skip
    proc = cli(*args, env=env)
    deadline = time.monotonic() + 60
    while (not out.exists() or out.stat().st_size < 1000) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupt" in err and "re-run the same command to resume" in err
    state = orjson.loads((tmp_path / "r.jsonl.progress.json").read_bytes())
    rows = state["done"]["rows"]
    assert 0 < rows < NQ * reps and f"rows 0-{rows - 1:,}" in err
    assert (
        len(out.read_bytes().splitlines()) == rows and out.stat().st_size == state["done"]["bytes"]
    )

    proc = cli(*args, "--no-progress", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"resumed at row {rows:,}" in err
    ids, _ = read_output(out)
    assert ids == expected.ids.tolist() * reps
    assert not (tmp_path / "r.jsonl.progress.json").exists()


def test_cli_ray_transport_joins_the_cluster(
    loaded: Any, data: np.ndarray, expected: QueryResult, tmp_path: Path
) -> None:
    """The CLI in its own process joins the session's Ray cluster (``--ray-address``) and
    calls the Serve app through a DeploymentHandle: no URL, no API key."""
    import ray

    inp = write_input(tmp_path / "q.fvecs", data[N:])
    out = tmp_path / "r.npy"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VAULTVEC_")}
    env["VAULTVEC_INDEX_KEY"] = loaded.key
    address = ray.get_runtime_context().gcs_address
    proc = cli(
        "bulk-query", str(inp), str(out), "--index", loaded.name, "--top-k", str(K),
        "--transport", "ray", "--ray-address", address, "--no-progress", "--batch-size", "100",
        env=env,
    )  # fmt: skip
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"done: all {NQ} queries" in err
    assert read_output(out)[0] == expected.ids.tolist()
