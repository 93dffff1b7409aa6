"""Transports of the bulk driver: how a batch reaches the service.

``HttpTransport`` uses the async Python client (JSON or compact array routes).
``RayTransport`` calls the Gateway deployment's ``query_arrays``/``upsert_arrays`` through a
DeploymentHandle from a process that joined the Ray cluster: no HTTP. Anything with the
``Transport`` methods works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from cluster import constants
from cluster.bulk.files import Batch
from cluster.client import AsyncClient, QueryResult, Retry
from cluster.client.errors import ServerError, UnavailableError, from_server_exception
from cluster.client.results import scatter
from cluster.client.retry import apause


class Transport(Protocol):
    async def query(self, x: np.ndarray, opts: QueryOptions) -> QueryResult: ...

    async def upsert(self, batch: Batch, ids: list[str]) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class QueryOptions:
    top_k: int = 10
    n_probes: int | None = None
    filters: dict[str, Any] | None = None
    greedy: bool | None = None
    include: tuple[str, ...] = ("distance",)

    def as_dict(self) -> dict[str, Any]:
        return {
            "top_k": self.top_k,
            "n_probes": self.n_probes,
            "filters": self.filters,
            "greedy": self.greedy,
            "include": list(self.include),
        }


class HttpTransport:
    """The async client over HTTP; ``wire``: auto (the compact array routes from 64 vectors),
    json or binary (always the array routes). A batch goes in one request unless it exceeds
    ``max_request_bytes`` (default: cluster.constants.DRIVER_REQUEST_BYTES, above the client's
    own default, which would split a default batch in two; one request scans better on the
    shards, figures: docs/performance.md)."""

    def __init__(
        self, url: str, api_key: str, index: str, key: str, wire: str = "auto", **options: Any
    ) -> None:
        options.setdefault("max_request_bytes", constants.DRIVER_REQUEST_BYTES)
        self.client = AsyncClient(url, api_key, **options)
        self.index = self.client.index(index, key)
        self.binary = {"auto": None, "json": False, "binary": True}[wire]

    async def query(self, x: np.ndarray, opts: QueryOptions) -> QueryResult:
        return await self.index.query(
            x,
            opts.top_k,
            n_probes=opts.n_probes,
            filters=opts.filters,
            greedy=opts.greedy,
            include=opts.include,
            binary=self.binary,
        )

    async def upsert(self, batch: Batch, ids: list[str]) -> int:
        return await self.index.upsert(
            ids, batch.vectors, batch.metadata, batch.contents, binary=self.binary
        )

    async def close(self) -> None:
        await self.client.aclose()


class RayTransport:
    """Calls the Gateway deployment's ``query_arrays``/``upsert_arrays`` through a
    DeploymentHandle. The caller is inside the Ray cluster (it joined with Ray's token auth):
    no API key is used; the index key is verified as on every route. Server errors surface as
    the client's typed exceptions; 503s are retried like the HTTP client does."""

    def __init__(self, handle: Any, index: str, key: str, retry: Retry | None = None) -> None:
        self.handle = handle
        self.index_name = index
        self.key = key
        self.retry = retry or Retry()

    @classmethod
    def connect(cls, address: str | None, index: str, key: str) -> RayTransport:
        """Join the Ray cluster at ``address`` (unless this process already runs Ray)."""
        import ray
        from ray import serve

        from cluster import runtime

        if not ray.is_initialized():
            runtime.join(address)
        return cls(serve.get_app_handle(runtime.APP_NAME), index, key)

    async def _call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayActorError

        attempts = max(1, self.retry.attempts)
        for attempt in range(attempts):
            try:
                return await getattr(self.handle, method).remote(*args)
            except Exception as exc:
                typed = from_server_exception(exc)
                if typed is None:
                    if not isinstance(exc, RayActorError):
                        raise ServerError(f"{method}: {type(exc).__name__}") from exc
                    typed = UnavailableError("the gateway is unavailable", status_code=503)
                if typed.status_code != 503 or attempt == attempts - 1:
                    raise typed from None
            await apause(self.retry.delay(attempt))
        raise AssertionError("unreachable")

    async def query(self, x: np.ndarray, opts: QueryOptions) -> QueryResult:
        out = await self._call(
            "query_arrays",
            self.index_name,
            self.key,
            x,
            opts.top_k,
            opts.n_probes,
            opts.filters,
            opts.greedy,
            list(opts.include),
        )
        counts, k = out["counts"], int(out["top_k"])
        meta = out["metadata"]
        return QueryResult(
            scatter(orjson.loads(out["ids"]), counts, k),
            out["distances"],
            counts,
            None if meta is None else scatter(orjson.loads(meta), counts, k),
        )

    async def upsert(self, batch: Batch, ids: list[str]) -> int:
        n = await self._call(
            "upsert_arrays",
            self.index_name,
            self.key,
            ids,
            batch.vectors,
            batch.metadata,
            batch.contents,
        )
        return int(n)

    async def close(self) -> None:
        return None
