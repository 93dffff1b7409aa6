"""serve_app.coalesce: concurrent requests -> batched calls, closed when the function is free."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serve_app.coalesce import Coalescer


class SlowDouble:
    """A 'model' that takes ``delay_s`` per call and records the batches it saw."""

    def __init__(self, delay_s: float = 0.05, fail_on: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.batches: list[list[int]] = []
        self.running = 0
        self.max_running = 0

    async def __call__(self, xs: list[int]) -> list[int]:
        self.batches.append(list(xs))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail_on is not None and self.fail_on in xs:
                raise ValueError("bad input")
            return [2 * x for x in xs]
        finally:
            self.running -= 1


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_arriving_during_a_call_share_the_next_call():
    """The first call is held until the others have arrived (no timing: a slow machine would
    otherwise let it end before they come)."""

    async def main() -> tuple[list[int], SlowDouble]:
        model = SlowDouble(delay_s=0)
        gate = asyncio.Event()

        async def held(xs: list[int]) -> list[int]:
            if xs == [0]:
                await gate.wait()
            return await model(xs)

        c = Coalescer(held, max_batch_size=32)
        first = asyncio.create_task(c.submit(0))
        await asyncio.sleep(0)  # the first call is running now, held at the gate
        rest = [asyncio.create_task(c.submit(i)) for i in range(1, 11)]
        await asyncio.sleep(0)  # every other request is waiting
        gate.set()
        out = await asyncio.gather(first, *rest)
        return out, model

    out, model = run(main())
    assert out == [2 * i for i in range(11)]
    assert model.batches == [[0], list(range(1, 11))]
    assert model.max_running == 1


def test_steady_spread_out_load_still_batches():
    """Clients that each send one request after another: batches grow with the load."""

    async def main() -> SlowDouble:
        model = SlowDouble(delay_s=0.03)
        c = Coalescer(model, max_batch_size=32)

        async def client(k: int) -> None:
            await asyncio.sleep(0.004 * k)  # staggered starts
            for j in range(10):
                assert await c.submit(100 * k + j) == 2 * (100 * k + j)

        await asyncio.gather(*(client(k) for k in range(8)))
        return model

    model = run(main())
    assert sum(len(b) for b in model.batches) == 80
    assert len(model.batches) <= 25, [len(b) for b in model.batches]


def test_max_batch_size_is_respected():
    async def main() -> SlowDouble:
        model = SlowDouble(delay_s=0.01)
        c = Coalescer(model, max_batch_size=4, wait_s=0.01)
        out = await asyncio.gather(*(c.submit(i) for i in range(10)))
        assert out == [2 * i for i in range(10)]
        return model

    model = run(main())
    assert [len(b) for b in model.batches] == [4, 4, 2]


def test_a_failing_call_fails_only_its_own_batch():
    async def main() -> list[Any]:
        model = SlowDouble(delay_s=0.02, fail_on=3)
        c = Coalescer(model, max_batch_size=32, wait_s=0.005)
        bad = [asyncio.create_task(c.submit(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0.01)  # the first batch is running
        good = [asyncio.create_task(c.submit(i)) for i in (4, 5)]
        return await asyncio.gather(*bad, *good, return_exceptions=True)

    out = run(main())
    assert all(isinstance(r, ValueError) for r in out[:3])
    assert out[3:] == [8, 10]


def test_cancelled_callers_are_skipped_and_the_worker_restarts():
    async def main() -> SlowDouble:
        model = SlowDouble(delay_s=0.02)
        c = Coalescer(model, max_batch_size=32)
        first = asyncio.create_task(c.submit(1))
        await asyncio.sleep(0.005)
        gone = asyncio.create_task(c.submit(2))
        await asyncio.sleep(0)
        gone.cancel()
        assert await first == 2
        await asyncio.sleep(0.05)  # idle: the worker has finished
        assert await c.submit(3) == 6
        return model

    model = run(main())
    assert model.batches == [[1], [3]]


def test_up_to_concurrency_calls_run_at_once_and_the_rest_share_the_next():
    async def main() -> tuple[list[int], SlowDouble, Coalescer[int, int]]:
        model = SlowDouble(delay_s=0.05)
        c = Coalescer(model, max_batch_size=32, concurrency=2)
        first = asyncio.create_task(c.submit(0))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(c.submit(1))  # a second call starts at once
        await asyncio.sleep(0.01)
        rest = [asyncio.create_task(c.submit(i)) for i in range(2, 10)]
        out = await asyncio.gather(first, second, *rest)
        await asyncio.sleep(0)  # the workers' done callbacks
        return out, model, c

    out, model, c = run(main())
    assert out == [2 * i for i in range(10)]
    assert model.batches == [[0], [1], list(range(2, 10))]
    assert model.max_running == 2
    assert c.idle


def test_on_idle_is_called_when_the_last_run_ends_even_if_its_callers_went_away():
    async def main() -> list[int]:
        idle: list[int] = []
        c = Coalescer(SlowDouble(delay_s=0.03), concurrency=2, on_idle=lambda: idle.append(1))
        callers = [asyncio.create_task(c.submit(i)) for i in range(3)]
        await asyncio.sleep(0.01)  # both runs under way
        for task in callers:
            task.cancel()
        await asyncio.sleep(0.08)
        assert c.idle
        return idle

    assert run(main()) == [1]


def test_a_lone_request_runs_in_its_callers_task_and_company_waits_for_a_worker():
    """The lone query of a quiet service costs no task and no future; what arrives while it
    runs is batched as before."""

    async def main() -> None:
        tasks: list[asyncio.Task[Any] | None] = []
        model = SlowDouble(delay_s=0.02)

        async def run(xs: list[int]) -> list[int]:
            tasks.append(asyncio.current_task())
            return await model(xs)

        c = Coalescer(run, concurrency=1)
        me = asyncio.current_task()
        assert await c.submit(1) == 2
        assert tasks == [me]
        lone = asyncio.create_task(c.submit(2))
        await asyncio.sleep(0.005)
        company = [asyncio.create_task(c.submit(i)) for i in (3, 4)]
        assert await asyncio.gather(lone, *company) == [4, 6, 8]
        assert tasks[1] is lone and tasks[2] not in (lone, *company)
        assert model.batches == [[1], [2], [3, 4]]
        waiting = Coalescer(run, wait_s=0.001)  # waits for company: always a worker
        assert await waiting.submit(5) == 10
        assert tasks[3] is not me

    run(main())


def test_invalid_max_batch_size():
    with pytest.raises(ValueError):
        Coalescer(SlowDouble(), max_batch_size=0)
    with pytest.raises(ValueError):
        Coalescer(SlowDouble(), concurrency=0)
