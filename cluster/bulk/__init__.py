"""The bulk driver (``vaultvec bulk-query``, ``vaultvec bulk-upsert``), built on cluster.client.

Modules: ``driver`` (``bulk_query``, ``bulk_upsert``), ``transports`` (``HttpTransport``,
``RayTransport``), ``pipeline`` (batches in flight, committed in order; Ctrl-C handling),
``progress`` (the progress file, ``Report``), ``files`` (input and output formats), ``cli``
(the subcommands).
"""

from cluster.bulk.driver import bulk_query, bulk_upsert, query_batch
from cluster.bulk.pipeline import exit_code, run_interruptible
from cluster.bulk.progress import Report
from cluster.bulk.transports import HttpTransport, QueryOptions, RayTransport, Transport
from cluster.constants import DEFAULT_BATCH, DEFAULT_CONCURRENCY

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CONCURRENCY",
    "HttpTransport",
    "QueryOptions",
    "RayTransport",
    "Report",
    "Transport",
    "bulk_query",
    "bulk_upsert",
    "exit_code",
    "query_batch",
    "run_interruptible",
]
