"""The state of one gateway replica process: its settings, its API keys and their rate limits,
and the services its operations run with (serve_app.service.deps.Services).

Serve runs each replica in a process of its own and hands it a copy of the FastAPI app (app.state
is not a reliable place for it), so the Gateway deployment's constructor (serve_app.app) sets it
here once, and the HTTP layer and the routes read it through :func:`services`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from serve_app.access import keys
from serve_app.access.limits import RateLimiter
from serve_app.service.deps import Services
from serve_app.settings import NO_LIMITS, Settings


class Replica:
    settings: Settings | None = None
    keys: tuple[keys.ApiKey, ...] = ()
    limiter: RateLimiter = RateLimiter(lambda name: NO_LIMITS)
    services: Services | None = None


REPLICA = Replica()


def configure(settings: Settings | None, engine: Any = None, embedder: Any = None) -> None:
    """This process's replica: its settings and what its operations run with (None: back to
    unconfigured, as tests leave it)."""
    REPLICA.settings = settings
    if settings is None:
        REPLICA.keys, REPLICA.limiter, REPLICA.services = (), RateLimiter(lambda n: NO_LIMITS), None
        return
    REPLICA.keys = settings.api_keys()
    REPLICA.limiter = RateLimiter(settings.limits, settings.gateway_replicas)
    REPLICA.services = Services(engine, settings, embedder)


def services() -> Services:
    """The services of this replica (set by the Gateway's constructor)."""
    if REPLICA.services is None:
        raise RuntimeError("the gateway replica is not configured")
    return REPLICA.services


def settings() -> Settings:
    if REPLICA.settings is None:
        raise RuntimeError("the gateway replica is not configured")
    return REPLICA.settings


@contextlib.contextmanager
def configured(
    settings: Settings | None, engine: Any = None, embedder: Any = None
) -> Iterator[Replica]:
    """This replica configured as given for the block, as it was afterwards (tests: an app
    driven in-process)."""
    saved = (REPLICA.settings, REPLICA.keys, REPLICA.limiter, REPLICA.services)
    configure(settings, engine, embedder)
    try:
        yield REPLICA
    finally:
        REPLICA.settings, REPLICA.keys, REPLICA.limiter, REPLICA.services = saved
