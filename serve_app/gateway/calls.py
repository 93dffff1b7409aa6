"""How the gateway calls shards: a bounded wait, the errors that mean a shard is restarting or
gone, a request run again when its index was re-created meanwhile, and ids hashed to shards."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.errors import Unavailable
from actors.types import shard_assignment
from serve_app import constants

T = TypeVar("T")
SHARD_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError)


class StaleIndex(Unavailable):
    """The index was deleted and re-created under the same name while a request ran on the old
    one. The view is dropped; the request is run again once (:func:`retry_stale`)."""

    default_detail = "the index was re-created while the request ran; retry"


async def retry_stale(run: Callable[[], Awaitable[T]]) -> T:
    """Run a request; if it met a re-created index, run it once more against the new one."""
    try:
        return await run()
    except StaleIndex:
        return await run()


_TIMEOUT: Any = getattr(asyncio, "timeout", None)  # Python 3.11+


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, or asyncio.TimeoutError after ``seconds``. On Python 3.11+ without
    the task that ``asyncio.wait_for`` wraps a coroutine in (a task costs a single query a turn
    of the event loop more)."""
    if _TIMEOUT is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _TIMEOUT(seconds):
        return await awaitable


async def assign_shards(ids: list[str], n_shards: int) -> np.ndarray:
    """Each id's shard (actors.types.shard_assignment), off the event loop when many: hashing
    a large batch there would hold every other request (the loop keeps its turns of the GIL)."""
    if len(ids) <= constants.INLINE_HASHES:
        return shard_assignment(ids, n_shards)
    return await asyncio.to_thread(shard_assignment, ids, n_shards)
