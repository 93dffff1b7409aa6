"""Continuous micro-batching: concurrent single requests -> batched calls of one function.

Serve's ``@serve.batch`` closes a batch after ``batch_wait_timeout_s`` even while the previous
batch is still running, so under steady concurrent load (requests spread out in time, each
model call far longer than the wait) its batches stay at about one request. Here a batch is
closed when the function becomes free: everything that arrived during a call goes into the next
one (up to ``max_batch_size``), so the busier the model, the larger its batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Coalescer(Generic[In, Out]):
    """``await submit(x)`` returns ``run([.., x, ..])[i]``; at most ``concurrency`` runs at a
    time, each taking what has arrived since a run last became free.

    ``wait_s``: when ``run`` is idle, how long a new request waits for company before its
    batch starts (0 = at once). A failing ``run`` fails every request of that batch only.

    With ``wait_s`` 0, a request that finds nothing waiting and a run free goes alone, in its
    caller's task: no worker task and no future for the lone request of a quiet service (its
    run ends if its caller is cancelled, as nobody else is in it).
    """

    def __init__(
        self,
        run: Callable[[list[In]], Awaitable[list[Out]]],
        max_batch_size: int = 32,
        wait_s: float = 0.0,
        concurrency: int = 1,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._run = run
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.concurrency = concurrency
        self.on_idle = on_idle  # called when the last run ends with nothing waiting
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._workers: set[asyncio.Task[None]] = set()
        self._alone = 0  # lone requests running in their callers' tasks

    @property
    def idle(self) -> bool:
        """Nothing waiting and no run under way."""
        return not self._pending and self._running() == 0

    def _running(self) -> int:
        # A finished worker leaves the set by a callback, a loop turn after it is done.
        return self._alone + sum(not w.done() for w in self._workers)

    async def submit(self, item: In) -> Out:
        if self.wait_s <= 0 and not self._pending and self._running() < self.concurrency:
            return await self._run_alone(item)
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._running() < self.concurrency:
            self._start_worker()
        return await future

    async def _run_alone(self, item: In) -> Out:
        self._alone += 1
        try:
            results = await self._run([item])
        finally:
            self._alone -= 1
            self._ended()
        if len(results) != 1:
            raise RuntimeError(f"{len(results)} results for a batch of 1")
        return results[0]

    def _start_worker(self) -> None:
        worker = asyncio.create_task(self._drain())
        self._workers.add(worker)
        worker.add_done_callback(self._finished)

    def _finished(self, worker: asyncio.Task[None]) -> None:
        self._workers.discard(worker)
        self._ended()

    def _ended(self) -> None:
        """A run ended: what arrived meanwhile gets a worker if none took it; else, with
        nothing waiting or running, the batcher is idle."""
        if self._pending and self._running() < self.concurrency:
            self._start_worker()
        elif self.on_idle is not None and not (self._pending or self._workers or self._alone):
            self.on_idle()  # once: a worker done but not yet called back is still in the set

    async def _drain(self) -> None:
        if self.wait_s > 0:
            await asyncio.sleep(self.wait_s)
        while self._pending:
            batch = [(x, f) for x, f in self._pending[: self.max_batch_size] if not f.done()]
            del self._pending[: self.max_batch_size]
            if not batch:  # every caller of this slice went away
                continue
            try:
                results = await self._run([x for x, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
            except Exception as exc:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), result in zip(batch, results):
                if not f.done():
                    f.set_result(result)
