"""The serve_app package's tunables: knobs a maintainer may turn, each with why it has its value.

What an operator sets belongs in serve_app.settings; these are fixed. Modules read them as
``constants.NAME`` where they use them, so a test patches them here (the http.trim.IDLE_TRIM
instance keeps the values it was made with). This module imports nothing. The measurements
behind the values are in docs/performance.md.
"""

# -- metrics (serve_app.telemetry) -------------------------------------------------------------
#: How often a gateway replica pushes its series to the control plane and Ray's export.
METRICS_EXPORT_S = 5.0

# -- the event loop ----------------------------------------------------------------------------
#: Ids hashed on the event loop at most; more go to a worker thread so other requests get turns.
INLINE_HASHES = 4096

# -- the gateway engine (serve_app.gateway.engine) ---------------------------------------------
#: A view is reloaded at most this often while shards report another training version (a swap
#: under way): shards answer correctly meanwhile, and each reload is a control-plane call.
REFRESH_S = 0.5
#: Concurrent single queries searched in one batch at most (a shard scans a batch of
#: actors.constants.BATCH_THREADS_MIN or more on all its threads).
SINGLES_PER_BATCH = 64
#: A JSON body larger than this is parsed in a worker thread, off the event loop.
INLINE_PARSE_BYTES = 1 << 20
#: A get answer of up to this many items is encoded on the event loop; more in a worker thread.
INLINE_GET_RESULTS = 4096
#: Up to this many results a query answer is built as dicts; past it the laid-out body is quicker.
FEW_RESULTS = 256

# -- recall measurement (serve_app.gateway.probing) --------------------------------------------
#: Sampled queries in one exact search at most: the check stays small beside the served load.
RECALL_MAX_ROWS = 16
#: An index measures every automatically probed query of a kind (unfiltered, broad or selective
#: filter) until it has measured this many of it (at most RECALL_WINDOW): its estimate and
#: scales settle early. One exact search then takes up to RECALL_EARLY_ROWS queries
#: of a batch, fewer on a large index: rows x items at most RECALL_EARLY_WORK (128 rows up to
#: 390k items, 50 at 1M, 5 at 10M), so that it stays a small load beside the live queries.
RECALL_EARLY = 400
RECALL_EARLY_ROWS = 128
RECALL_EARLY_WORK = 50_000_000
#: Early batches sampled while a measurement runs wait for it, this many at most per replica.
RECALL_EARLY_WAITING = 8
#: After each background measurement the gateway rests this many times as long as it took, so
#: that measurements take at most a quarter of the shards' time (an exact search of a 1M-item
#: index costs tens of milliseconds of CPU per query).
RECALL_REST = 3.0
#: Filtered batches measured before being answered (RecallMonitor.warm_rows) whose kind turned
#: out to have a scale already, after which filtered batches are answered first.
RECALL_WARM_IN_VAIN = 2
#: A gateway hands an index's learned probing state to the control plane, which keeps it sealed
#: with the index, at most this often (seconds) and after its early measurements.
RECALL_SAVE_S = 30.0
#: Sampled queries with a larger top_k are skipped: their exact search would cost too much.
RECALL_MAX_K = 100
#: A kind of query keeps probing scale 1 until this many of its sampled queries were checked.
RECALL_MIN_SAMPLES = 20
#: Sampled queries per estimate and per kind: recent enough to follow the data, enough to be stable.
RECALL_WINDOW = 400
#: A kind's rule aims at the recall target plus this many standard errors of the difference
#: between its measured recall and the recall to come (serve_app.gateway.probing._fitted).
RECALL_MARGIN_SE = 2.0
#: A kind is probed with a fixed count of lists only where that scans less than this share of
#: the lists the adaptive rule does on the measured queries: a fixed count does not follow a
#: drift in how hard the queries are (each query's k-th distance widens the adaptive rule's
#: probe), so that robustness is given up only for a clear saving (for queries to come: a batch
#: answered with what its own measured rows fit takes whichever costs fewer).
RECALL_FIXED_SAVING = 0.9
#: Indexes whose recall state a gateway replica keeps, bounding its memory.
RECALL_MAX_INDEXES = 1024

# -- memory (serve_app.http.trim) --------------------------------------------------------------
#: The gateway gives its heap's free pages back once requests read this much since the last trim...
IDLE_TRIM_AFTER_BYTES = 1 << 20
#: ...and none began for this long: a steady load never waits for a trim.
IDLE_TRIM_QUIET_S = 1.0

# -- the audit log (serve_app.audit) -----------------------------------------------------------
#: Records waiting for the audit writer before new ones are dropped (requests never block on it).
AUDIT_QUEUE_SIZE = 50_000
#: Audit records written at once, one write per batch.
AUDIT_BATCH = 1_000
#: Dropped audit records are logged at most this often, not once per record.
AUDIT_WARN_EVERY_S = 60.0
