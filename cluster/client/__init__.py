"""The Python SDK of the vaultvec HTTP API; it imports nothing of the server.

    from cluster.client import Client, generate_key

    with Client("http://127.0.0.1:8000", api_key) as vv:
        idx = vv.create_index("docs", generate_key(), dimension=128)
        idx.upsert(ids, vectors)
        res = idx.query(queries, top_k=10)

Modules: ``clients`` (``Client``, ``AsyncClient``), ``index`` (``Index``, ``AsyncIndex``),
``plans`` (what their calls send), ``runner`` (the protocols they run on), ``calls``
(requests, without I/O), ``results``
(``QueryResult`` and answer decoding), ``retry`` (``Retry``), ``errors`` (typed exceptions).
"""

from cluster.client.clients import AsyncClient, Client, generate_key
from cluster.client.index import AsyncIndex, Index
from cluster.client.results import QueryResult
from cluster.client.retry import Retry

__all__ = ["AsyncClient", "AsyncIndex", "Client", "Index", "QueryResult", "Retry", "generate_key"]
