"""The cluster package's tunables: knobs a maintainer may turn, each with why it has its value.

Standard library only, importing nothing: cluster.haproxy_guard, which runs without
site-packages at every HAProxy start, reads it too. The measurements behind the values are in
docs/performance.md.
"""

# -- bulk jobs (cluster.bulk) ------------------------------------------------------------------
#: A bulk job saves its progress (and flushes its output) at least this often.
FLUSH_EVERY_S = 10.0
#: Vectors per bulk batch: amortises per-call costs and lets shards scan in locality order.
DEFAULT_BATCH = 10_000
#: Bulk requests in flight: two overlap the gateway's coarse step with the shards' scan.
DEFAULT_CONCURRENCY = 2
#: The bulk driver sends a batch as one request up to this size: one scans better than parts.
DRIVER_REQUEST_BYTES = 64 << 20

# -- Serve's fast path and HAProxy (cluster.fastpath, cluster.haproxy_guard) -------------------
#: Ray passes call data up to this size inside the call; more leaves ingests resident in shards.
RAY_DIRECT_CALL_BYTES = 1 << 20
#: Ports picked for HAProxy's listeners start here: above Ray's worker ports (10002-19999).
PORTS_FROM = 20_000
#: Idle server connections are all purged in log2(maxconn 4096) + 1 = 13 periods; 16 for margin.
PURGE_PERIODS = 16
