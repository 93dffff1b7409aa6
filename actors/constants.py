"""The actors package's tunables: knobs a maintainer may turn, each with why it has its value.

Modules read them as ``constants.NAME`` where they use them, so a test patches them here (values
taken at import, such as default arguments and heap.ENV, keep the value they saw). This module
imports nothing: any module of actors, serve_app or cluster may import it. The measurements
behind the values are in docs/performance.md.
"""

# -- the allocator (actors.process.heap) -------------------------------------------------------
#: glibc's mmap threshold, pinned: request-sized buffers are recycled in the heap, not mapped.
MMAP_THRESHOLD = 16 << 20
#: One malloc arena per process: memory one thread frees is reused by the next.
ARENA_MAX = 1
#: glibc's default trim threshold: free memory above it at the heap top is given back.
TRIM_THRESHOLD = 128 << 10
#: A gateway keeps this much free memory at its heap top: the next request reuses resident pages.
GATEWAY_TRIM_THRESHOLD = 64 << 20

# -- metrics (actors.metrics) ------------------------------------------------------------------
#: Request latency buckets (seconds): from a fast single query to a slow bulk call.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: Stage buckets (seconds): a request's stages are finer than whole requests.
STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 5.0,
)  # fmt: skip
#: Training run buckets (seconds): from a small index's seconds to a large one's hour.
TRAINING_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0)
#: Observations replayed to Ray between yields of the GIL: requests never wait out a whole pass.
EXPORT_YIELD_EVERY = 256
#: A gateway replica silent this long is gone: its counts leave the control plane's sum.
GATEWAY_STALE_S = 60.0

# -- a shard's engine (actors.engine) ----------------------------------------------------------
#: A removal touching up to this many lists goes list by list; past it faiss's threaded scan wins.
PER_LIST_REMOVE_MAX = 64
#: Filter evaluations a shard keeps for queries that repeat a filter (actors.engine.selection):
#: each holds one bit per label and a count per list (about 130 KB at 1M items).
SELECTION_CACHE_ENTRIES = 32
#: Reconstructing at least this many items at once looks their places up in a map of every
#: label's place (PartitionIndex._places, 8 bytes per item, kept until the lists change).
RECONSTRUCT_MAP_MIN = 1024
#: A partition that keeps full vectors beside compressed codes (actors.engine.fullvectors)
#: takes this many candidates per result from the codes and reranks them by exact distance,
#: unless a query sets rerank_mult (CyborgDB's default, 10).
RERANK_MULT = 10
#: ... but never more than this many candidates a query: a top_k of 1,000 reranks 10 a result,
#: one of 10,000 none (each candidate is one record read from disk and opened).
RERANK_MAX_CANDIDATES = 10_000
#: A filter matching few enough items is answered by an exact scan of them (Selection.
#: scan_exactly): at most this many vector values (items x dimension; 31,250 items of 128
#: dimensions), gathered at once for a batch of EXACT_SCAN_BATCH queries or when at most
#: EXACT_SCAN_LISTS lists hold them, else from the filter's second use on; the gathered vectors
#: of a shard's kept selections take at most SELECTION_GATHER_BYTES.
EXACT_SCAN_WORK = 4_000_000
EXACT_SCAN_BATCH = 8
EXACT_SCAN_LISTS = 32
SELECTION_GATHER_BYTES = 64 << 20
#: Lists are laid out afresh once entries added or removed since reach this share of the partition.
LISTS_COMPACT_SHARE = 0.25
#: ...and at least this many entries: a small partition is not laid out again after every write.
LISTS_COMPACT_MIN = 4096
#: Smaller query batches are searched as they come: too few queries share lists to reorder them.
LOCALITY_MIN_QUERIES = 32
#: Compact a shard once dead rows are this share: the copy is paid once per live/3 replacements.
COMPACT_DEAD_SHARE = 0.25
#: ...and at least this many dead rows: a small shard is not copied after every pause in writes.
COMPACT_DEAD_MIN = 4096
#: Up to this many labels a StringColumn gathers one by one, cheaper than the vectorised gather.
STRINGS_SMALL_GET = 64
#: Cursors (actors.engine.idorder): items written since a shard sorted its ids are sorted per
#: page until they outnumber this or an eighth of the sorted ones; then the order is rebuilt.
ID_ORDER_TAIL_MIN = 4096
#: A shard's snapshot larger than this is stored in chunks of this size, each sealed on its own
#: (actors.storage.persistence): no stored value grows with the shard (PostgreSQL's bytea holds
#: at most 1 GiB). Snapshots are sealed, written, read and opened a chunk at a time: a snapshot
#: needs one serialised copy of the shard's state and a few chunks beyond it, a load a few
#: chunks beyond the state it builds.
SNAPSHOT_CHUNK_BYTES = 64 << 20
#: A shard whose last snapshot is larger than its WAL byte bound (``wal_max_bytes``) rolls its
#: WAL into a new snapshot once the WAL holds this share of that snapshot's bytes (or
#: WAL_RECORDS_LARGE records) instead: growing to S bytes then writes about (1 + share) / share
#: × S of snapshots in all, not S² / (2 × bound) (at 10M × 768 a shard's 15 GB would be written
#: some 600 GB over), and a restart replays at most this share of the state as WAL
#: (actors.engine.shard_log).
WAL_SNAPSHOT_SHARE = 0.25
WAL_RECORDS_LARGE = 4096
#: A shard's part of a backup is sealed in chunks of this size (actors.engine.shard_backup).
BACKUP_CHUNK_BYTES = 2 << 20
#: A restored shard state may hand out this many labels beyond four per item it holds (the
#: dead rows a shard keeps until compaction): a bound on what a restore allocates.
RESTORE_SPARE_LABELS = 1 << 20
#: A restore's chunks a partition received are dropped when none came for this long (seconds).
RESTORE_IDLE_S = 600.0
#: Dead bytes a StringColumn tolerates beyond the live ones: a small column is not compacted.
STRINGS_COMPACT_SLACK = 1 << 16
#: Recent id-map entries always tolerated before a merge: a small shard does not merge per write.
IDMAP_MERGE_MIN = 4096
#: A write of more ids, and more than 1/IDMAP_RECENT_SHARE of the ids the id map's sorted
#: arrays hold, goes straight into them: one merge, not many small.
IDMAP_BULK = 1024
#: Recent id-map entries (a dict) are merged into the sorted arrays past this share of them.
IDMAP_RECENT_SHARE = 8

# -- training (actors.control) -----------------------------------------------------------------
#: The top_k values automatic probing is calibrated for: the common ones, 1 to the default 100.
CALIBRATION_TOPKS = (1, 10, 100)
#: k-means training points per list: bounds a training's sample and time (docs/performance.md,
#: scale: lists trained on 128 scan no more at 0.95 recall than on faiss's default 256).
MAX_POINTS_PER_LIST = 128
#: k-means iterations when the request names none (faiss's own for IVF training).
KMEANS_ITERS = 10
#: Items re-inserted per rebuild step when the request names no batch size: bounds a step's memory.
REBUILD_BATCH = 65536

# -- storage (actors.storage) ------------------------------------------------------------------
#: PostgreSQL background reconnects give up this soon: a later request then tries afresh at once.
POSTGRES_RECONNECT_S = 5.0
#: Pooled PostgreSQL connections per process kept open (store URL ``pool_min`` overrides).
POSTGRES_POOL_MIN = 1
#: Pooled PostgreSQL connections per process at most (store URL ``pool_max`` overrides).
POSTGRES_POOL_MAX = 8
#: Seconds an operation waits for a pooled PostgreSQL connection (store URL ``pool_timeout``).
POSTGRES_POOL_TIMEOUT_S = 10.0
#: Derived index keys and ciphers cached per process: key derivation is kept off hot paths.
KEY_CACHE_SIZE = 256
#: Attempts of a directory store write: a concurrent delete may remove a fresh empty directory.
LOCAL_STORE_RETRIES = 3

# -- the same-node channel (actors.pool.channel) -----------------------------------------------
#: A channel request or answer past this is refused: the frames it carries are far smaller.
CHANNEL_MAX_PAYLOAD = 64 << 20
#: Channel connections per gateway process and actor: as many as its Ray calls run at once.
CHANNEL_MAX_CONNECTIONS = 16
#: Channel connections kept open between calls: enough for the usual load, not one per burst.
CHANNEL_MAX_IDLE = 8
#: Channel connections a pool actor serves at once, a thread each.
CHANNEL_MAX_PEERS = 256
#: After a channel failure, calls go through Ray this long before the channel is tried again.
CHANNEL_RETRY_S = 1.0

# -- pool actors (actors.pool) -----------------------------------------------------------------
#: How often a pool actor evicts and checks for a trim: a whole period without calls is quiet.
HOUSEKEEPING_PERIOD_S = 1.0
#: A quiet pool actor trims once its memory grew this much: a trim walks the whole heap.
TRIM_GROWTH_BYTES = 1 << 20
#: Eviction goes this far below the memory budget, so that the next load does not evict at once.
BUDGET_HEADROOM = 0.9
#: Call threads for large upserts: few, so Ray's buffers of their pieces stay on few threads.
UPSERT_THREADS = 2
#: From this size a request sent to several shards is stored once in Ray's object store.
SHARED_ARG_BYTES = 512 << 10
#: Most bulk data per call: under Ray's in-call limit (cluster.constants) with framing's room.
CALL_BYTES = 768 << 10
#: Upsert pieces in flight per shard: one travels while one is written; more would only wait.
UPSERT_PIECES_IN_FLIGHT = 2
#: Upserts larger than this run on the upsert threads (UPSERT_THREADS), leaving reads the rest.
LARGE_UPSERT_BYTES = 64 << 10
#: A get of up to this many ids goes framed and comes back as bytes, which Ray passes cheaper.
PACKED_GET_IDS = 256
#: Search requests up to this size travel inside their frame; larger ones beside it, shareable.
FRAMED_BYTES = 64 << 10
#: The pool's membership (actors, their nodes) is trusted this long: calls do not each ask Ray.
MEMBERSHIP_TTL_S = 10.0

# -- a partition (actors.engine.shard, shard_state) --------------------------------------------
#: A shard tidies its memory (compaction, list layout, heap trim) once writes pause this long.
TRIM_AFTER_WRITES_S = 1.0
#: Batches of at least this many queries search on all the shard's threads; smaller ones on one
#: (starting OpenMP's team costs more than a small batch's scan).
BATCH_THREADS_MIN = 32
#: Memory per item beside its lists, metadata and contents (ids, id map, norms, liveness, list
#: map, filter columns): the fixed columns of actors.engine.items.ItemTable, for the estimate.
ROW_BYTES = 96
#: Users one index may have: every user request looks its grant up among them.
MAX_USERS_PER_INDEX = 1000
