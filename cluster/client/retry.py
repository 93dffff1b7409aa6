"""The clients' retry policy (503 answers and connection failures) and its waits."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass


def pause(seconds: float) -> None:
    """The sync client's backoff wait (a seam for tests)."""
    time.sleep(seconds)


async def apause(seconds: float) -> None:
    """The async client's backoff wait (a seam for tests)."""
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Retry:
    """Retries for 503 answers and connection failures only: ``attempts`` tries in all, waiting
    a uniformly random time in [0, min(max_backoff_s, backoff_s * 2**n)] before retry n+1
    (full jitter), at least a 503's Retry-After when it gives one (capped at max_backoff_s)."""

    attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        cap = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        wait = random.uniform(0, cap)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_backoff_s))
        return wait
