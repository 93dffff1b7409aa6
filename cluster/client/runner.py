"""What an index handle knows of its client: the protocols ``Client`` and ``AsyncClient``
satisfy (cluster.client.index)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from cluster.client.calls import Call, Plan

T = TypeVar("T")


class Limits(Protocol):
    """The two client settings that shape a plan."""

    @property
    def binary_threshold(self) -> int: ...

    @property
    def max_request_bytes(self) -> int: ...


class Runner(Limits, Protocol):
    """What an ``Index`` needs of its client (``Client``): one call, or a plan of calls."""

    def call(self, call: Call) -> Any: ...

    def run(self, plan: Plan[T]) -> T: ...


class AsyncRunner(Limits, Protocol):
    """What an ``AsyncIndex`` needs of its client (``AsyncClient``): ``Runner``, awaitable."""

    async def call(self, call: Call) -> Any: ...

    async def run(self, plan: Plan[T]) -> T: ...
