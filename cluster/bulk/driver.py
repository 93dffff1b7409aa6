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
import os
import shutil
import time
from pathlib import Path
from typing import Any

from cluster import constants
from cluster.bulk.files import OUTPUT_SUFFIXES, Batch, JsonlSink, NpySink, Source, suffix_of
from cluster.bulk.pipeline import run_batches
from cluster.bulk.progress import Progress, Report
from cluster.bulk.transports import QueryOptions, Transport
from cluster.client import QueryResult

__all__ = ["bulk_query", "bulk_upsert", "query_batch"]


def query_batch(rows: int, concurrency: int, batch_size: int | None = None) -> int:
    """A bulk query's batch: ``batch_size`` when given, else
    :data:`cluster.constants.DEFAULT_BATCH` (larger batches amortise the per-call cost and let
    the shards scan in locality order, actors.engine.locality.locality_order), or fewer
    rows, ``ceil(rows / concurrency)``, so that a smaller input is still several requests under
    way together: one request for a whole small input leaves the gateway's coarse step and the
    shards' scan waiting on each other (docs/performance.md, bulk query)."""
    if batch_size is not None:
        return batch_size
    return max(1, min(constants.DEFAULT_BATCH, -(-rows // max(1, concurrency))))


# -- bulk query -----------------------------------------------------------------------------
async def bulk_query(
    input_path: Path,
    output: Path,
    transport: Transport,
    options: QueryOptions,
    *,
    index: str,
    batch_size: int | None = None,
    concurrency: int = constants.DEFAULT_CONCURRENCY,
    chunk_rows: int = 100_000,
    int_ids: bool = False,
    restart: bool = False,
    overwrite: bool = False,
    show_progress: bool = True,
    stop: asyncio.Event | None = None,
) -> Report:
    """Query every vector of ``input_path``; results to ``output`` (.npy or .jsonl), in
    batches of ``batch_size`` (default: :func:`query_batch`)."""
    stop = stop or asyncio.Event()
    fmt = suffix_of(output, OUTPUT_SUFFIXES, "output")
    if fmt == ".npy" and "distance" not in options.include:
        options = QueryOptions(**{**options.__dict__, "include": (*options.include, "distance")})
    source = Source(input_path)
    progress_path = output.with_name(output.name + ".progress.json")
    if batch_size is None and not restart:
        # A job under way keeps its batches (the automatic batch follows --concurrency, and a
        # job may have begun with another default): the rows written are whole batches of it.
        recorded = Progress.recorded(progress_path, "batch_size")
        batch_size = recorded if isinstance(recorded, int) and recorded > 0 else None
    batch_size = query_batch(source.rows, concurrency, batch_size)
    progress = Progress(
        progress_path,
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
        if sink.buffered >= chunk_rows or time.monotonic() - last_flush > constants.FLUSH_EVERY_S:
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
    batch_size: int = constants.DEFAULT_BATCH,
    concurrency: int = constants.DEFAULT_CONCURRENCY,
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
        if time.monotonic() - last_save > constants.FLUSH_EVERY_S:
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
