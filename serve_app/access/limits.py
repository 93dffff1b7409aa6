"""Per-API-key request rates: a token bucket per key name in each gateway replica.

Each replica enforces its share of a key's rate (``rate_limit_rps`` / gateway replicas; HAProxy
spreads requests over the replicas, least connections first), so the whole service lets a key
through at about its rate. A request over it is answered 429 with ``Retry-After`` (whole
seconds until the bucket holds a token again) before its body is read. The health check is
never limited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.settings import Limits


@dataclass
class Bucket:
    rate: float  # tokens per second
    burst: float  # the most it holds
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """0 if a token was taken, else the seconds until one is there."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """The limits and buckets of one gateway replica (its event loop's: no locking)."""

    def __init__(
        self,
        limits: Callable[[str], Limits],
        replicas: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._known: dict[str, Limits] = {}
        self.share = 1.0 / max(1, replicas)
        self.clock = clock
        self.buckets: dict[str, Bucket | None] = {}

    def limits(self, key_name: str) -> Limits:
        found = self._known.get(key_name)
        if found is None:
            found = self._known[key_name] = self._limits(key_name)
        return found

    def wait(self, key_name: str) -> int:
        """0 to let a request of ``key_name`` through now, else the seconds to tell it to wait
        (Retry-After)."""
        bucket = self.buckets.get(key_name, ...)
        if bucket is ...:
            bucket = self.buckets[key_name] = self._bucket(key_name)
        if bucket is None:
            return 0
        wait = bucket.take(self.clock())
        return 0 if wait == 0.0 else max(1, math.ceil(wait))

    def _bucket(self, key_name: str) -> Bucket | None:
        limits = self.limits(key_name)
        if limits.rate_limit_rps <= 0:
            return None
        rate = limits.rate_limit_rps * self.share
        burst = max(1.0, limits.rate_limit_burst * self.share)
        return Bucket(rate, burst, burst, self.clock())
