"""The bulk driver without a server: input formats, output sinks, ordered commits, interruption
and resume, with an in-memory brute-force transport."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from cluster import bulk
from cluster.bulk import transports
from cluster.bulk.files import Batch, Source
from cluster.client import QueryResult
from cluster.client.errors import InvalidRequestError
from tests.helpers import exact_knn, write_fvecs


class FakeTransport:
    """Exact euclidean search over ``data`` (ids "0".."n-1"), with random latency."""

    def __init__(
        self, data: np.ndarray, fail_at_row: int | None = None, latency: float = 0.004
    ) -> None:
        self.data = data
        self.latency = latency
        self.fail_at_row = fail_at_row
        self.calls = 0
        self.upserted: dict[str, np.ndarray] = {}
        self.metadata: dict[str, Any] = {}

    async def query(self, x: np.ndarray, opts: bulk.QueryOptions) -> QueryResult:
        self.calls += 1
        await asyncio.sleep(random.uniform(0, self.latency))
        if self.fail_at_row is not None and np.any(
            np.all(x == self.data[self.fail_at_row], axis=1)
        ):
            raise InvalidRequestError("query_vectors is bad", status_code=422)
        d, order = exact_knn(self.data, x, opts.top_k)
        k = order.shape[1]
        ids = np.empty((len(x), opts.top_k), dtype=object)
        ids[:, :k] = order.astype(str)
        dist = np.full((len(x), opts.top_k), np.inf, dtype=np.float32)
        dist[:, :k] = d
        return QueryResult(ids, dist, np.full(len(x), k))

    async def upsert(self, batch: Batch, ids: list[str]) -> int:
        await asyncio.sleep(random.uniform(0, 0.004))
        for i, row in zip(ids, batch.vectors):
            self.upserted[i] = row
        for i, m in zip(ids, batch.metadata or [None] * len(ids)):
            self.metadata[i] = m
        return len(ids)

    async def close(self) -> None:
        return None


class StopAfter:
    """Wraps a transport and sets ``stop`` (as a first Ctrl-C does) after ``n`` batches."""

    def __init__(self, inner: FakeTransport, stop: asyncio.Event, n: int) -> None:
        self.inner, self.stop, self.n = inner, stop, n

    async def query(self, x: np.ndarray, opts: bulk.QueryOptions) -> QueryResult:
        self.n -= 1
        if self.n <= 0:
            self.stop.set()
        return await self.inner.query(x, opts)

    async def upsert(self, batch: Batch, ids: list[str]) -> int:
        self.n -= 1
        if self.n <= 0:
            self.stop.set()
        return await self.inner.upsert(batch, ids)

    async def close(self) -> None:
        return None


@pytest.fixture()
def vecs() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(230, 6)).astype(np.float32)


def write_input(path: Path, x: np.ndarray) -> Path:
    if path.suffix == ".npy":
        np.save(path, x)
    elif path.suffix == ".fvecs":
        write_fvecs(path, x)
    elif path.suffix == ".jsonl":
        path.write_bytes(b"".join(orjson.dumps(r.tolist()) + b"\n" for r in x))
    else:
        path.write_text("".join("\t".join(repr(float(v)) for v in r) + "\n" for r in x))
    return path


def query(inp: Path, out: Path, t: Any, **kw: Any) -> bulk.Report:
    kw.setdefault("batch_size", 17)
    kw.setdefault("concurrency", 4)
    kw.setdefault("show_progress", False)
    return asyncio.run(bulk.bulk_query(inp, out, t, bulk.QueryOptions(top_k=5), index="i", **kw))


def expected(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    return exact_knn(x, q, 5)[1].astype(str)


@pytest.mark.parametrize("fmt", [".npy", ".fvecs", ".jsonl", ".tsv"])
def test_every_input_format_reads_the_same(tmp_path: Path, vecs: np.ndarray, fmt: str) -> None:
    src = Source(write_input(tmp_path / f"in{fmt}", vecs))
    assert src.rows == len(vecs)
    batches = list(src.batches(50))
    assert [b.no for b in batches] == [0, 1, 2, 3, 4] and [b.start for b in batches][-1] == 200
    np.testing.assert_allclose(np.concatenate([b.vectors for b in batches]), vecs, rtol=1e-6)
    later = list(src.batches(50, first_batch=3))  # resuming skips whole batches
    assert [b.no for b in later] == [3, 4]
    np.testing.assert_allclose(later[0].vectors, vecs[150:200], rtol=1e-6)


def test_jsonl_objects_and_tsv_id_column(tmp_path: Path) -> None:
    docs = [
        {"id": f"d{i}", "vector": [i, 1.0], "metadata": {"n": i}, "contents": "t"} for i in range(5)
    ]
    p = tmp_path / "in.jsonl"
    p.write_bytes(b"\n".join(orjson.dumps(d) for d in docs) + b"\n\n")
    (b,) = Source(p).batches(10)
    assert b.ids == [f"d{i}" for i in range(5)] and b.metadata == [{"n": i} for i in range(5)]
    assert b.contents == ["t"] * 5 and b.vectors.shape == (5, 2)
    t = tmp_path / "in.tsv"
    t.write_text("1\t2\tx\n3\t4\ty\n")
    (b,) = Source(t, id_column=-1).batches(10)
    assert b.ids == ["x", "y"] and b.vectors.tolist() == [[1, 2], [3, 4]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n[3]\n")
    with pytest.raises(ValueError, match="rows 1-2"):
        list(Source(bad).batches(10))


@pytest.mark.parametrize("out_fmt", [".npy", ".jsonl"])
def test_query_output_is_complete_and_in_order(
    tmp_path: Path, vecs: np.ndarray, out_fmt: str
) -> None:
    inp = write_input(tmp_path / "q.npy", vecs[:100])
    out = tmp_path / f"r{out_fmt}"
    report = query(inp, out, FakeTransport(vecs))
    assert report.ok and report.rows_done == 100 and "done: all 100 queries" in report.summary()
    assert read_ids(out) == expected(vecs, vecs[:100]).tolist()
    assert not (tmp_path / f"r{out_fmt}.progress.json").exists()
    assert not (tmp_path / "r.npy.parts").exists()
    with pytest.raises(FileExistsError):
        query(inp, out, FakeTransport(vecs))


def read_ids(out: Path) -> list[list[str]]:
    if out.suffix == ".npy":
        res = np.load(out)
        assert res.dtype.names == ("ids", "distances")
        return [list(r) for r in res["ids"]]
    return [orjson.loads(line)["ids"] for line in out.read_bytes().splitlines()]


@pytest.mark.parametrize("out_fmt", [".npy", ".jsonl"])
def test_interrupt_then_resume(tmp_path: Path, vecs: np.ndarray, out_fmt: str) -> None:
    inp = write_input(tmp_path / "q.fvecs", vecs)
    out = tmp_path / f"r{out_fmt}"

    async def interrupted() -> bulk.Report:
        stop = asyncio.Event()
        t = StopAfter(FakeTransport(vecs), stop, 5)
        return await bulk.bulk_query(
            inp, out, t, bulk.QueryOptions(top_k=5), index="i", batch_size=17, concurrency=3,
            chunk_rows=34, show_progress=False, stop=stop,
        )  # fmt: skip

    first = asyncio.run(interrupted())
    assert first.interrupted and not first.complete
    assert first.rows_done % 17 == 0 and 5 * 17 <= first.rows_done < len(vecs)
    text = first.summary()
    assert f"rows 0-{first.rows_done - 1}" in text and "resume at row" in text
    state = orjson.loads((tmp_path / f"r{out_fmt}.progress.json").read_bytes())
    assert state["done"]["rows"] == first.rows_done and not state["complete"]
    if out_fmt == ".jsonl":  # the file holds exactly the recorded rows
        lines = out.read_bytes().splitlines()
        assert len(lines) == first.rows_done and out.stat().st_size == state["done"]["bytes"]
        with open(out, "ab") as f:  # a torn write after the record is cut on resume
            f.write(b'{"query": 9999, "ids": [')
    with pytest.raises(ValueError, match="different job"):
        query(inp, out, FakeTransport(vecs), batch_size=10)
    t = FakeTransport(vecs)
    second = query(inp, out, t)
    assert second.ok and second.resumed_from == first.rows_done
    assert t.calls == -(-(len(vecs) - first.rows_done) // 17)  # only the remaining batches
    assert read_ids(out) == expected(vecs, vecs).tolist()


def test_hard_abort_keeps_a_consistent_prefix(tmp_path: Path, vecs: np.ndarray) -> None:
    inp = write_input(tmp_path / "q.npy", vecs)
    out = tmp_path / "r.jsonl"

    async def aborted() -> bulk.Report:
        job = asyncio.ensure_future(
            bulk.bulk_query(
                inp,
                out,
                FakeTransport(vecs, latency=0.03),
                bulk.QueryOptions(top_k=5),
                index="i",
                batch_size=5,
                concurrency=4,
                show_progress=False,
            )
        )
        await asyncio.sleep(0.05)
        job.cancel()  # what a second Ctrl-C does
        return await job

    report = asyncio.run(aborted())
    assert report.interrupted and 0 < report.rows_done < len(vecs)
    assert len(out.read_bytes().splitlines()) == report.rows_done
    assert query(inp, out, FakeTransport(vecs), batch_size=5).ok
    assert read_ids(out) == expected(vecs, vecs).tolist()


def test_error_stops_at_the_failing_batch(tmp_path: Path, vecs: np.ndarray) -> None:
    inp = write_input(tmp_path / "q.npy", vecs)
    out = tmp_path / "r.npy"
    report = query(inp, out, FakeTransport(vecs, fail_at_row=60), batch_size=20)
    assert isinstance(report.error, InvalidRequestError) and not report.complete
    assert report.rows_done == 60 and "query_vectors is bad" in report.summary()
    assert bulk.exit_code(report) == 1
    assert query(inp, out, FakeTransport(vecs), batch_size=20).ok  # resumes after the fix
    assert read_ids(out) == expected(vecs, vecs).tolist()


def test_int_ids_output(tmp_path: Path, vecs: np.ndarray) -> None:
    inp = write_input(tmp_path / "q.npy", vecs[:30])
    out = tmp_path / "r.npy"
    assert query(inp, out, FakeTransport(vecs[:3]), int_ids=True).ok
    res = np.load(out)
    assert res["ids"].dtype == np.int64 and (res["ids"][:, 3:] == -1).all()
    assert np.isinf(res["distances"][:, 3:]).all()


def test_bulk_upsert_resumes(tmp_path: Path) -> None:
    docs = [{"id": f"d{i}", "vector": [float(i), 0.0], "metadata": {"i": i}} for i in range(50)]
    inp = tmp_path / "items.jsonl"
    inp.write_bytes(b"\n".join(orjson.dumps(d) for d in docs))
    fake = FakeTransport(np.zeros((1, 2), np.float32))

    async def interrupted() -> bulk.Report:
        stop = asyncio.Event()
        return await bulk.bulk_upsert(
            inp, StopAfter(fake, stop, 2), index="i", batch_size=7, concurrency=2,
            show_progress=False, stop=stop,
        )  # fmt: skip

    first = asyncio.run(interrupted())
    assert first.interrupted and 14 <= first.rows_done < 50 and first.rows_done % 7 == 0
    assert "acknowledged" in first.summary()
    second = asyncio.run(bulk.bulk_upsert(inp, fake, index="i", batch_size=7, show_progress=False))
    assert second.ok and second.resumed_from == first.rows_done
    assert sorted(fake.upserted) == sorted(d["id"] for d in docs)
    assert fake.metadata["d3"] == {"i": 3}
    again = asyncio.run(bulk.bulk_upsert(inp, fake, index="i", batch_size=7, show_progress=False))
    assert again.complete and "already complete" in again.notes[0]


def test_row_number_ids(tmp_path: Path, vecs: np.ndarray) -> None:
    fake = FakeTransport(vecs)
    inp = write_input(tmp_path / "x.npy", vecs[:12])
    report = asyncio.run(
        bulk.bulk_upsert(inp, fake, index="i", batch_size=5, id_start=100, show_progress=False)
    )
    assert report.ok and sorted(fake.upserted, key=int) == [str(100 + i) for i in range(12)]


def test_unreadable_input_keeps_the_rows_before(tmp_path: Path, vecs: np.ndarray) -> None:
    lines = [orjson.dumps(r.tolist()) for r in vecs[:40]]
    lines[25] = b"[1, 2"  # a torn line
    inp = tmp_path / "q.jsonl"
    inp.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "r.jsonl"
    report = query(inp, out, FakeTransport(vecs), batch_size=10)
    assert report.error is not None and report.rows_done == 20
    assert len(out.read_bytes().splitlines()) == 20


class FakeHandle:
    """A DeploymentHandle stand-in: ``handle.<method>.remote(...)`` awaitables."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            def remote(self, *args: Any) -> Any:
                handle.calls.append((method, args))
                answer = handle.answers.pop(0)

                async def result() -> Any:
                    if isinstance(answer, BaseException):
                        raise answer
                    return answer

                return result()

        return Method()


def test_ray_transport_decodes_and_maps_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.exceptions import RayActorError

    from actors.errors import IndexNotFound, Unavailable
    from cluster.client import Retry
    from cluster.client.errors import IndexNotFoundError, UnavailableError

    monkeypatch.setattr(transports, "apause", _no_sleep)
    answer = {
        "top_k": 3,
        "counts": np.array([3, 1]),
        "ids": orjson.dumps(["a", "b", "c", "d"]),
        "distances": np.array([[0, 1, 2], [5, np.inf, np.inf]], dtype=np.float32),
        "metadata": orjson.dumps([{"m": 1}, {}, {}, {"m": 4}]),
    }
    handle = FakeHandle([Unavailable("shard down"), RayActorError(), answer])
    t = bulk.RayTransport(handle, "idx", "ab" * 32, retry=Retry(attempts=3))
    opts = bulk.QueryOptions(top_k=3, include=("distance", "metadata"))
    r = asyncio.run(t.query(np.ones((2, 4), np.float32), opts))
    assert [c[0] for c in handle.calls] == ["query_arrays"] * 3  # 503 and actor death retried
    assert r.ids.tolist() == [["a", "b", "c"], ["d", None, None]]
    assert r.metadata is not None and r.metadata[1, 0] == {"m": 4} and r.metadata[1, 1] is None
    name, key, x, top_k = handle.calls[0][1][:4]
    assert (name, key, x.shape, top_k) == ("idx", "ab" * 32, (2, 4), 3)

    t = bulk.RayTransport(FakeHandle([IndexNotFound("index 'idx' not found")]), "idx", "k")
    with pytest.raises(IndexNotFoundError, match="not found") as info:
        asyncio.run(t.query(np.ones((1, 4), np.float32), opts))
    assert info.value.status_code == 404
    down = [Unavailable("shard down")] * 2
    t = bulk.RayTransport(FakeHandle(down), "idx", "k", retry=Retry(attempts=2))
    with pytest.raises(UnavailableError, match="shard down"):
        asyncio.run(t.query(np.ones((1, 4), np.float32), opts))


async def _no_sleep(_: float) -> None:
    return None


class Recording(FakeTransport):
    """Records each query batch's size and the most batches in flight at once."""

    def __init__(self, data: np.ndarray) -> None:
        super().__init__(data, latency=0.0)
        self.sizes: list[int] = []
        self.in_flight = self.most_in_flight = 0

    async def query(self, x: np.ndarray, opts: bulk.QueryOptions) -> QueryResult:
        self.sizes.append(len(x))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            return await super().query(x, opts)
        finally:
            self.in_flight -= 1


@pytest.mark.parametrize(
    ("rows", "concurrency", "sizes"), [(230, 2, [115, 115]), (7, 3, [3, 3, 1])]
)
def test_a_small_query_input_fills_the_requests_in_flight(
    tmp_path: Path, vecs: np.ndarray, rows: int, concurrency: int, sizes: list[int]
) -> None:
    """Without --batch-size, an input of fewer than DEFAULT_BATCH x concurrency rows is cut into
    ``concurrency`` batches sent together (one request would leave the gateway and the shards
    waiting on each other); the answers are the same."""
    inp = write_input(tmp_path / "q.npy", vecs[:rows])
    t = Recording(vecs)
    report = query(inp, tmp_path / "r.npy", t, batch_size=None, concurrency=concurrency)
    assert report.ok and sorted(t.sizes, reverse=True) == sizes
    assert t.most_in_flight == concurrency
    assert read_ids(tmp_path / "r.npy") == expected(vecs, vecs[:rows]).tolist()
    assert bulk.query_batch(10**6, 2) == bulk.DEFAULT_BATCH  # a large input: the default batch
    assert bulk.query_batch(10**6, 2, 500) == 500


def test_a_query_with_the_automatic_batch_resumes(tmp_path: Path, vecs: np.ndarray) -> None:
    """A job begun with the automatic batch resumes with its own batches, whatever
    --concurrency the re-run has (the automatic batch follows it); --restart recomputes it."""
    inp = write_input(tmp_path / "q.npy", vecs)
    out = tmp_path / "r.jsonl"
    first = query(inp, out, FakeTransport(vecs, fail_at_row=150), batch_size=None, concurrency=2)
    assert first.error is not None and first.rows_done == 115 and first.batch_size == 115
    second = query(inp, out, FakeTransport(vecs), batch_size=None, concurrency=3)
    assert second.ok and second.resumed_from == 115 and second.batch_size == 115
    assert read_ids(out) == expected(vecs, vecs).tolist()
    t = Recording(vecs)
    again = query(inp, out, t, batch_size=None, concurrency=3, restart=True)
    assert again.ok and sorted(t.sizes, reverse=True) == [77, 77, 76]


@pytest.mark.parametrize("value", ["0", "-3", "ten"])
def test_the_cli_refuses_a_batch_or_concurrency_below_one(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cluster.cli import main

    for option in ("--batch-size", "--concurrency"):
        with pytest.raises(SystemExit) as exit:
            main(["bulk-query", "q.npy", "r.npy", "--index", "i", option, value])
        assert exit.value.code == 2
        assert option in capsys.readouterr().err
