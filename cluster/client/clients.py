"""Python client of the vaultvec HTTP API: ``Client`` (sync) and ``AsyncClient`` (asyncio).

    from cluster.client import Client, generate_key

    with Client("http://127.0.0.1:8000", api_key) as vv:
        idx = vv.create_index("docs", generate_key(), dimension=128)
        idx.upsert(ids, vectors)                      # numpy (n, d); array route for n >= 64
        res = idx.query(queries, top_k=10)            # res.ids (nq, k), res.distances (nq, k)
        hits = idx.query(contents="chest pain", top_k=5)  # text (embedding_model indexes)

Connections are pooled (one httpx client per Client); bodies are orjson. Errors raise the typed
exceptions of ``cluster.client.errors`` carrying the server's detail. Only 503 answers and
connection failures are retried, with full-jitter exponential backoff (``Retry``).
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
import orjson

from cluster.client.calls import Call, Plan, drop_none
from cluster.client.errors import ConnectionFailedError, VaultvecClientError, error_for
from cluster.client.index import AsyncIndex, Index
from cluster.client.retry import Retry, apause, pause

__all__ = ["AsyncClient", "Client", "create_call", "generate_key"]

T = TypeVar("T")
RETRY_EXCEPTIONS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
JSON_HEADERS = {"Content-Type": "application/json"}


def generate_key() -> str:
    """A fresh random 32-byte index key as 64 hex characters. Keep it: it is never stored."""
    return secrets.token_hex(32)


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 300.0,
        retry: Retry | None = None,
        binary_threshold: int = 64,
        max_request_bytes: int = 4 << 20,
        max_connections: int = 16,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # https: True checks the server's certificate against the system's CAs (or the file
        # SSL_CERT_FILE names), a path against the CA certificates in that PEM file
        self._verify = (
            ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
        )
        self.retry = retry or Retry()
        self.binary_threshold = binary_threshold
        self.max_request_bytes = max_request_bytes
        self._headers = {"X-API-Key": api_key}
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))

    def _prepare(self, call: Call) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"method": call.method, "url": call.path}
        if call.body is not None:
            kwargs["content"] = orjson.dumps(call.body, option=orjson.OPT_SERIALIZE_NUMPY)
            kwargs["headers"] = JSON_HEADERS
        return kwargs

    def _outcome(self, call: Call, r: httpx.Response) -> tuple[Any, VaultvecClientError | None]:
        if r.status_code == 200:
            return call.decode(orjson.loads(r.content)), None
        try:
            body = orjson.loads(r.content)
            detail, errors = str(body.get("detail", "")), body.get("errors")
        except (orjson.JSONDecodeError, AttributeError):
            detail, errors = r.text[:500], None
        return None, error_for(r.status_code, detail, errors)

    @staticmethod
    def _retry_after(r: httpx.Response | None) -> float | None:
        value = r.headers.get("retry-after") if r is not None else None
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


class Client(_Base):
    """Synchronous client; one pooled ``httpx.Client``. Use as a context manager or ``close()``."""

    def __init__(self, base_url: str, api_key: str, **options: Any) -> None:
        transport = options.pop("transport", None)
        super().__init__(base_url, api_key, **options)
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers,
            timeout=self._timeout,
            limits=self._limits,
            transport=transport,
            verify=self._verify,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def call(self, call: Call) -> Any:
        """One HTTP call with the retry policy; the decoded answer or a typed exception."""
        kwargs = self._prepare(call)
        attempts = max(1, self.retry.attempts)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                r = self.http.request(**kwargs)
            except RETRY_EXCEPTIONS as exc:
                if last:
                    raise ConnectionFailedError(f"{call.path}: {exc!r}") from exc
                pause(self.retry.delay(attempt))
                continue
            value, error = self._outcome(call, r)
            if error is None:
                return value
            if error.status_code != 503 or last:
                raise error
            pause(self.retry.delay(attempt, self._retry_after(r)))
        raise AssertionError("unreachable")

    def run(self, plan: Plan[T]) -> T:
        return plan.combine([self.call(c) for c in plan.calls])

    # -- service-level operations -----------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return dict(self.call(Call("/v1/health", method="GET")))

    def list_indexes(self) -> list[str]:
        return list(self.call(Call("/v1/indexes/list", method="GET"))["indexes"])

    def training_status(self) -> dict[str, Any]:
        return dict(self.call(Call("/v1/indexes/training-status", method="GET")))

    def create_index(
        self,
        name: str,
        key: str,
        *,
        index_type: str | None = None,
        dimension: int | None = None,
        metric: str | None = None,
        pq_dim: int | None = None,
        pq_bits: int | None = None,
        sq_bits: int | None = None,
        n_lists: int | None = None,
        embedding_model: str | None = None,
        n_shards: int | None = None,
        metadata_schema: dict[str, dict[str, bool]] | None = None,
        text_fields: Sequence[str] | None = None,
        bm25_k1: float | None = None,
        bm25_b: float | None = None,
    ) -> Index:
        """A new index; None = the server's default. ``index_type`` ivfflat (default), ivf
        (``sq_bits`` 8 or 16) or ivfpq (``pq_dim``, ``pq_bits``); ``metric`` euclidean
        (default), squared_euclidean or cosine; ``n_lists`` IVF lists to train (automatic);
        ``embedding_model`` lets items and queries be text embedded on the server (it fixes
        the dimension); ``n_shards`` shard actors; ``metadata_schema`` CyborgDB's per-field
        policies (filterable, pattern, full_text); ``text_fields`` the metadata fields searched
        by BM25 (``bm25_k1``, ``bm25_b`` its parameters). Raises IndexExistsError if the name
        is taken."""
        self.call(
            create_call(
                name,
                key,
                index_type=index_type,
                dimension=dimension,
                metric=metric,
                pq_dim=pq_dim,
                pq_bits=pq_bits,
                sq_bits=sq_bits,
                n_lists=n_lists,
                embedding_model=embedding_model,
                n_shards=n_shards,
                metadata_schema=metadata_schema,
                text_fields=text_fields,
                bm25_k1=bm25_k1,
                bm25_b=bm25_b,
            )
        )
        return Index(self, name, key)

    def index(self, name: str, key: str) -> Index:
        """A handle on an existing index (no request is made)."""
        return Index(self, name, key)

    def delete_index(self, name: str, key: str) -> None:
        self.call(Call("/v1/indexes/delete", {"index_name": name, "index_key": key}))


class AsyncClient(_Base):
    """The asyncio twin of ``Client``; the calls of a large batch run ``concurrency`` at a time."""

    def __init__(self, base_url: str, api_key: str, *, concurrency: int = 4, **options: Any):
        transport = options.pop("transport", None)
        super().__init__(base_url, api_key, **options)
        self.concurrency = max(1, concurrency)
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=self._timeout,
            limits=self._limits,
            transport=transport,
            verify=self._verify,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(self, call: Call) -> Any:
        kwargs = self._prepare(call)
        attempts = max(1, self.retry.attempts)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                r = await self.http.request(**kwargs)
            except RETRY_EXCEPTIONS as exc:
                if last:
                    raise ConnectionFailedError(f"{call.path}: {exc!r}") from exc
                await apause(self.retry.delay(attempt))
                continue
            value, error = self._outcome(call, r)
            if error is None:
                return value
            if error.status_code != 503 or last:
                raise error
            await apause(self.retry.delay(attempt, self._retry_after(r)))
        raise AssertionError("unreachable")

    async def run(self, plan: Plan[T]) -> T:
        if len(plan.calls) == 1:
            return plan.combine([await self.call(plan.calls[0])])
        gate = asyncio.Semaphore(self.concurrency)

        async def one(c: Call) -> Any:
            async with gate:
                return await self.call(c)

        return plan.combine(list(await asyncio.gather(*(one(c) for c in plan.calls))))

    async def health(self) -> dict[str, Any]:
        return dict(await self.call(Call("/v1/health", method="GET")))

    async def list_indexes(self) -> list[str]:
        return list((await self.call(Call("/v1/indexes/list", method="GET")))["indexes"])

    async def training_status(self) -> dict[str, Any]:
        return dict(await self.call(Call("/v1/indexes/training-status", method="GET")))

    async def create_index(
        self,
        name: str,
        key: str,
        *,
        index_type: str | None = None,
        dimension: int | None = None,
        metric: str | None = None,
        pq_dim: int | None = None,
        pq_bits: int | None = None,
        sq_bits: int | None = None,
        n_lists: int | None = None,
        embedding_model: str | None = None,
        n_shards: int | None = None,
        metadata_schema: dict[str, dict[str, bool]] | None = None,
        text_fields: Sequence[str] | None = None,
        bm25_k1: float | None = None,
        bm25_b: float | None = None,
    ) -> AsyncIndex:
        await self.call(
            create_call(
                name,
                key,
                index_type=index_type,
                dimension=dimension,
                metric=metric,
                pq_dim=pq_dim,
                pq_bits=pq_bits,
                sq_bits=sq_bits,
                n_lists=n_lists,
                embedding_model=embedding_model,
                n_shards=n_shards,
                metadata_schema=metadata_schema,
                text_fields=text_fields,
                bm25_k1=bm25_k1,
                bm25_b=bm25_b,
            )
        )
        return AsyncIndex(self, name, key)

    def index(self, name: str, key: str) -> AsyncIndex:
        return AsyncIndex(self, name, key)

    async def delete_index(self, name: str, key: str) -> None:
        await self.call(Call("/v1/indexes/delete", {"index_name": name, "index_key": key}))


def create_call(
    name: str,
    key: str,
    *,
    index_type: str | None = None,
    dimension: int | None = None,
    metric: str | None = None,
    pq_dim: int | None = None,
    pq_bits: int | None = None,
    sq_bits: int | None = None,
    n_lists: int | None = None,
    embedding_model: str | None = None,
    n_shards: int | None = None,
    metadata_schema: dict[str, dict[str, bool]] | None = None,
    text_fields: Sequence[str] | None = None,
    bm25_k1: float | None = None,
    bm25_b: float | None = None,
) -> Call:
    """The create request: the index's shape in ``index_config``, the rest top-level."""
    config = drop_none(
        type=index_type,
        dimension=dimension,
        pq_dim=pq_dim,
        pq_bits=pq_bits,
        sq_bits=sq_bits,
        n_lists=n_lists,
    )
    body: dict[str, Any] = {"index_name": name, "index_key": key, "index_config": config}
    body.update(drop_none(metric=metric, embedding_model=embedding_model, n_shards=n_shards))
    body.update(
        drop_none(
            metadata_schema=metadata_schema,
            text_fields=None if text_fields is None else list(text_fields),
            bm25_k1=bm25_k1,
            bm25_b=bm25_b,
        )
    )
    return Call("/v1/indexes/create", body)
