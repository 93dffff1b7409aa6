"""How the bulk driver runs batches: ``concurrency`` at a time, committed in input order, and
under Ctrl-C handling from the command line."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from cluster.bulk.files import Batch, Source
from cluster.bulk.progress import Report


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
