"""The bulk driver behind ``vaultvec bulk-query`` and ``vaultvec bulk-upsert``.

Its core takes a *transport*: ``HttpTransport`` (the async Python client: JSON or compact array
routes) or ``RayTransport`` (a DeploymentHandle on the running Serve app: no HTTP). Batches run
``concurrency`` at a time but are committed in input order, so the output (or, for upserts, the
progress record) always covers a prefix of the input. A sidecar progress file records that
prefix; re-running the same command resumes after it. A first Ctrl-C (or SIGTERM) stops
sending batches, lets those in flight finish and writes them; a second aborts those in flight.
Either way the driver prints exactly which rows were written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cluster.bulk.files import (
    OUTPUT_SUFFIXES,
    Batch,
    JsonlSink,
    NpySink,
    Source,
    atomic_write,
    suffix_of,
)
from cluster.bulk.transports import HttpTransport, QueryOptions, RayTransport, Transport
from cluster.client import QueryResult

__all__ = [
    "HttpTransport",
    "QueryOptions",
    "RayTransport",
    "Report",
    "Transport",
    "bulk_query",
    "bulk_upsert",
    "run_interruptible",
]

FLUSH_EVERY_S = 10.0
# Vectors per batch. Larger batches amortise the per-call cost and let the shards scan in
# locality order (actors.partition.locality_order), which pays off with batch size: 40,000
# queries on 100k x 128 (benchmarks/bench_bulk.py --queries 40000 --batch-size N), concurrency 2,
# 5,000 -> 10,000 per batch took binary HTTP from 38k to 43k QPS and Ray from 46k to 55k.
DEFAULT_BATCH = 10_000
DEFAULT_CONCURRENCY = 2


# -- progress file --------------------------------------------------------------------------
class Progress:
    """The sidecar ``*.progress.json``: what the job is and how far it got (atomic rewrites)."""

    def __init__(self, path: Path, job: dict[str, Any]) -> None:
        self.path = path
        self.job = job

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        state = orjson.loads(self.path.read_bytes())
        if state.get("job") != self.job:
            diff = sorted(
                k
                for k in set(self.job) | set(state.get("job", {}))
                if self.job.get(k) != state.get("job", {}).get(k)
            )
            raise ValueError(
                f"{self.path} belongs to a different job (differs in: {', '.join(diff)}); "
                "re-run with the same options to resume, or pass --restart to start over"
            )
        return dict(state)

    def save(self, done: dict[str, Any], complete: bool = False) -> None:
        state = {"job": self.job, "done": done, "complete": complete, "saved": time.time()}
        atomic_write(self.path, orjson.dumps(state, option=orjson.OPT_INDENT_2))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# -- reports --------------------------------------------------------------------------------
@dataclass
class Report:
    kind: str  # "query" or "upsert"
    rows_total: int
    rows_done: int = 0  # a prefix of the input, written (query) or acknowledged (upsert)
    batches_done: int = 0
    batch_size: int = 0
    resumed_from: int = 0
    complete: bool = False
    interrupted: bool = False
    error: BaseException | None = None
    where: str = ""
    progress_file: str = ""
    seconds: float = 0.0
    extra_acknowledged: int = 0  # upsert rows acknowledged beyond the recorded prefix
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.complete and self.error is None

    def summary(self) -> str:
        unit = "queries" if self.kind == "query" else "vectors"
        new = self.rows_done - self.resumed_from
        rate = new / self.seconds if self.seconds > 0 else 0.0
        timing = f"{new:,} {unit} in {self.seconds:.1f}s ({rate:,.0f}/s)"
        if self.complete:
            start = f" (resumed at row {self.resumed_from:,})" if self.resumed_from else ""
            return f"done: all {self.rows_total:,} {unit} -> {self.where}{start}; {timing}"
        written = "written" if self.kind == "query" else "acknowledged"
        if self.rows_done:
            rows = f"rows 0-{self.rows_done - 1:,} ({self.batches_done:,} batches of {self.batch_size:,}) are {written}"
        else:
            rows = f"no rows are {written}"
        why = "interrupted" if self.error is None else f"stopped by an error: {self.error}"
        lines = [
            f"{why}",
            f"{rows} of {self.rows_total:,}: {self.where}; recorded in {self.progress_file}",
        ]
        if self.extra_acknowledged:
            lines.append(
                f"{self.extra_acknowledged:,} more rows of later batches were acknowledged too; "
                "a resumed run sends them again (upserts replace by id, so this is safe)"
            )
        lines.append(f"re-run the same command to resume at row {self.rows_done:,}; {timing}")
        return "\n".join(lines)


# -- the pipeline ---------------------------------------------------------------------------
async def pipeline(
    batches: Iterator[Batch],
    work: Callable[[Batch], Awaitable[Any]],
    commit: Callable[[Batch, Any], None],
    concurrency: int,
    stop: asyncio.Event,
    on_done: Callable[[Batch], None],
) -> tuple[BaseException | None, bool, int]:
    """Run ``work`` on batches ``concurrency`` at a time; ``commit`` them in order.

    Returns (first error, aborted by cancellation, rows completed but not committed)."""
    window = max(1, concurrency) * 4
    in_flight: dict[asyncio.Task[Any], Batch] = {}
    ready: dict[int, tuple[Batch, Any]] = {}
    next_no: int | None = None
    error: BaseException | None = None
    error_no = 0
    exhausted = False
    try:
        while True:
            while (
                not exhausted
                and error is None
                and not stop.is_set()
                and len(in_flight) < concurrency
            ):
                if next_no is not None and len(ready) + len(in_flight) >= window:
                    break
                try:
                    batch = next(batches, None)
                except ValueError as bad:  # unreadable input: stop there, keep what is done
                    error, error_no, exhausted = bad, 1 << 62, True
                    break
                if batch is None:
                    exhausted = True
                    break
                if next_no is None:
                    next_no = batch.no
                in_flight[asyncio.ensure_future(work(batch))] = batch
            if not in_flight:
                break
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                batch = in_flight.pop(task)
                failed = task.exception()
                if failed is not None:
                    if error is None or batch.no < error_no:  # the earliest failing batch
                        error, error_no = failed, batch.no
                    continue
                ready[batch.no] = (batch, task.result())
                on_done(batch)
            while next_no is not None and next_no in ready:
                commit(*ready.pop(next_no))
                next_no += 1
        return error, False, sum(len(b.vectors) for b, _ in ready.values())
    except asyncio.CancelledError:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        while next_no is not None and next_no in ready:
            commit(*ready.pop(next_no))
            next_no += 1
        return error, True, sum(len(b.vectors) for b, _ in ready.values())


async def run_batches(
    source: Source,
    batch_size: int,
    rows_before: int,
    work: Callable[[Batch], Awaitable[Any]],
    commit: Callable[[Batch, Any], None],
    concurrency: int,
    stop: asyncio.Event,
    *,
    unit: str,
    show_progress: bool,
) -> tuple[BaseException | None, bool, int]:
    """:func:`pipeline` over ``source`` from row ``rows_before`` on, with a progress bar
    (rate and ETA) on stderr."""
    from tqdm import tqdm

    bar = tqdm(
        total=source.rows,
        initial=rows_before,
        unit=unit,
        unit_scale=True,
        smoothing=0.05,
        dynamic_ncols=True,
        disable=not show_progress,
        file=sys.stderr,
    )
    try:
        return await pipeline(
            source.batches(batch_size, rows_before // batch_size),
            work,
            commit,
            concurrency,
            stop,
            lambda b: bar.update(len(b.vectors)),
        )
    finally:
        bar.close()


# -- bulk query -----------------------------------------------------------------------------
async def bulk_query(
    input_path: Path,
    output: Path,
    transport: Transport,
    options: QueryOptions,
    *,
    index: str,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    chunk_rows: int = 100_000,
    int_ids: bool = False,
    restart: bool = False,
    overwrite: bool = False,
    show_progress: bool = True,
    stop: asyncio.Event | None = None,
) -> Report:
    """Query every vector of ``input_path``; results to ``output`` (.npy or .jsonl)."""
    stop = stop or asyncio.Event()
    fmt = suffix_of(output, OUTPUT_SUFFIXES, "output")
    if fmt == ".npy" and "distance" not in options.include:
        options = QueryOptions(**{**options.__dict__, "include": (*options.include, "distance")})
    source = Source(input_path)
    progress = Progress(
        output.with_name(output.name + ".progress.json"),
        job_of("query", source, batch_size, index, options.as_dict(), int_ids=int_ids),
    )
    sink: NpySink | JsonlSink = (
        NpySink(output, int_ids)
        if fmt == ".npy"
        else JsonlSink(output, "metadata" in options.include)
    )
    if restart:
        progress.remove()
        if isinstance(sink, NpySink) and sink.parts.exists():
            shutil.rmtree(sink.parts)
    state = progress.load()
    if state is None:
        if output.exists() and not (overwrite or restart):
            raise FileExistsError(f"{output} exists (pass --overwrite to replace it)")
        sink.start()
        rows_before = 0
    else:
        sink.resume(state["done"])
        rows_before = int(state["done"]["rows"])
    report = Report(
        "query",
        source.rows,
        rows_before,
        rows_before // batch_size,
        batch_size,
        rows_before,
        where=sink.where(),
        progress_file=str(progress.path),
    )
    last_flush = time.monotonic()

    def commit(batch: Batch, result: QueryResult) -> None:
        nonlocal last_flush
        sink.write(batch, result)
        if sink.buffered >= chunk_rows or time.monotonic() - last_flush > FLUSH_EVERY_S:
            progress.save(sink.flush())
            last_flush = time.monotonic()

    async def work(batch: Batch) -> QueryResult:
        return await transport.query(batch.vectors, options)

    t0 = time.perf_counter()
    error, aborted, _ = await run_batches(
        source,
        batch_size,
        rows_before,
        work,
        commit,
        concurrency,
        stop,
        unit="q",
        show_progress=show_progress,
    )
    state_done = sink.flush()
    report.rows_done = int(state_done["rows"])
    report.batches_done = -(-report.rows_done // batch_size)
    report.seconds = time.perf_counter() - t0
    report.error = error
    if report.rows_done >= source.rows and error is None:
        sink.finish()
        progress.remove()
        report.complete = True
        report.where = str(output)
    else:
        progress.save(state_done)
        if isinstance(sink, JsonlSink):
            sink.close()
            report.where = f"{output} (the first {state_done['bytes']:,} bytes)"
        else:
            report.where = sink.where()
        report.interrupted = aborted or stop.is_set()
    return report


# -- bulk upsert ----------------------------------------------------------------------------
async def bulk_upsert(
    input_path: Path,
    transport: Transport,
    *,
    index: str,
    progress_file: Path | None = None,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    id_column: int | None = None,
    id_start: int = 0,
    restart: bool = False,
    show_progress: bool = True,
    stop: asyncio.Event | None = None,
) -> Report:
    """Upsert every vector of ``input_path``; ids from the input (jsonl ``id``, a tsv id
    column) or ``id_start + row number``."""
    stop = stop or asyncio.Event()
    source = Source(input_path, id_column)
    path = progress_file or input_path.with_name(f"{input_path.name}.upsert-{index}.progress.json")
    progress = Progress(
        path,
        job_of("upsert", source, batch_size, index, {"id_column": id_column, "id_start": id_start}),
    )
    if restart:
        progress.remove()
    state = progress.load()
    rows_before = int(state["done"]["rows"]) if state else 0
    report = Report(
        "upsert",
        source.rows,
        rows_before,
        rows_before // batch_size,
        batch_size,
        rows_before,
        where=f"index {index!r}",
        progress_file=str(path),
    )
    if state and state.get("complete"):
        report.complete = True
        report.notes.append(f"already complete according to {path} (--restart to run again)")
        return report
    rows = rows_before
    last_save = time.monotonic()

    def commit(batch: Batch, n: int) -> None:
        nonlocal rows, last_save
        rows = batch.start + len(batch.vectors)
        if time.monotonic() - last_save > FLUSH_EVERY_S:
            progress.save({"rows": rows})
            last_save = time.monotonic()

    async def work(batch: Batch) -> int:
        return await transport.upsert(batch, batch.row_ids(id_start))

    t0 = time.perf_counter()
    error, aborted, extra = await run_batches(
        source,
        batch_size,
        rows_before,
        work,
        commit,
        concurrency,
        stop,
        unit="vec",
        show_progress=show_progress,
    )
    report.rows_done, report.batches_done = rows, -(-rows // batch_size)
    report.seconds = time.perf_counter() - t0
    report.error, report.extra_acknowledged = error, extra
    report.complete = rows >= source.rows and error is None
    report.interrupted = not report.complete and (aborted or stop.is_set())
    progress.save({"rows": rows}, complete=report.complete)
    return report


def job_of(
    kind: str, source: Source, batch_size: int, index: str, params: dict[str, Any], **more: Any
) -> dict[str, Any]:
    st = os.stat(source.path)
    return {
        "kind": kind,
        "input": str(source.path.resolve()),
        "input_bytes": st.st_size,
        "rows": source.rows,
        "batch_size": batch_size,
        "index": index,
        "params": params,
        **more,
    }


# -- running from the command line ----------------------------------------------------------
def run_interruptible(make: Callable[[asyncio.Event], Awaitable[Report]]) -> Report:
    """Run a bulk job with Ctrl-C handling: the first SIGINT/SIGTERM stops new batches and
    lets the ones in flight finish; a second SIGINT aborts them."""

    async def main() -> Report:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None
        job = asyncio.ensure_future(make(stop))
        hits = 0

        def on_signal() -> None:
            nonlocal hits
            hits += 1
            if hits == 1:
                stop.set()
                print(
                    "\ninterrupt: finishing the batches in flight (Ctrl-C again to abort them)",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                job.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
        try:
            return await job
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)

    return asyncio.run(main())


def exit_code(report: Report) -> int:
    if report.ok:
        return 0
    return 1 if report.error is not None else 130
