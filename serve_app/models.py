"""Request and response models of the /v1 API (a drop-in for CyborgDB's service, SDKs 0.11-0.18).

A field sent as JSON null means "use the default": every optional field is ``X | None = None``
and defaults are resolved by the engine. Unknown fields are ignored, as existing clients send
fields of later versions. Validation is strict: vectors hold JSON numbers only, counts are
integers and flags booleans (no coercion from strings or booleans); numpy then checks a vector's
shape, finiteness and norm (serve_app.service.checks).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from actors.constants import KMEANS_ITERS

IndexType = Literal["ivfflat", "ivf", "ivfpq"]
# What create accepts: vaultvec's names plus CyborgDB's newer ones (serve_app.routes.indexes).
IndexTypeIn = Literal["ivfflat", "ivf", "ivfpq", "ivfsq", "diskivf"]
StoragePrecision = Literal["float32", "float16", "tq12", "tq8", "tq6", "tq4"]
Metric = Literal["euclidean", "squared_euclidean", "cosine"]
QueryInclude = Literal["distance", "metadata", "vector", "contents"]
GetInclude = Literal["vector", "contents", "metadata"]

IndexName = Annotated[str, Field(min_length=1, max_length=255, description="Index name")]
IndexKey = Annotated[
    str,
    Field(
        pattern="^[0-9a-fA-F]{64}$",
        description="The index's 32-byte key as 64 hex characters; never stored",
    ),
]
Vector = list[float]
Matrix = list[list[float]]
RerankMult = Annotated[
    int | None,
    Field(
        ge=1,
        le=100,
        description="ivf/ivfpq: candidates per result the codes give for reranking by the full "
        "vectors; default 10 (1 = no rerank)",
    ),
]
PAGE_LIMIT = 10_000  # items a cursor's page may ask for


def read_vectors(value: Any, strict: ValidatorFunctionWrapHandler) -> Any:
    """One vector or a list of them, read by numpy when it can be, else validated by
    ``strict`` (the field's own validation: JSON numbers only, no booleans or strings).

    A query batch holds many numbers: numpy reads the lists in one pass, in about the time
    pydantic's check of them alone would take, so the batch is not read twice. numpy takes a
    JSON ``true`` for 1 and ``false`` for 0, so the entries it read as exactly 0 or 1 are
    looked at one by one; anything else that numpy does not read as plain numbers in one or two
    dimensions (strings, nulls, ragged or nested lists, integers beyond 64 bits), or where more
    than one entry in eight is 0 or 1, goes through ``strict``, whose errors name the entry as
    for every other field. Integers come back as float64, as JSON numbers read by pydantic
    do."""
    if isinstance(value, list) and value:
        try:
            arr = np.array(value)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is not None and arr.dtype.kind in "fi" and arr.ndim in (1, 2):
            rows, cols = np.nonzero(np.atleast_2d((arr == 0) | (arr == 1)))
            if len(rows) <= arr.size // 8:
                listed = value if arr.ndim == 2 else [value]
                pairs = zip(rows.tolist(), cols.tolist(), strict=True)
                if not any(type(listed[r][c]) is bool for r, c in pairs):
                    return arr.astype(np.float64, copy=False)
    return strict(value)


# One vector or a list of them; tried left to right, a matrix fails the first form at its first
# element, so it is validated once.
Vectors = Annotated[Vector | Matrix, Field(union_mode="left_to_right"), WrapValidator(read_vectors)]


class Model(BaseModel):
    # Strict: a number is a JSON number (no "1.5", no true), a flag a JSON boolean, a count an
    # integer; unknown fields are ignored (newer clients send more).
    model_config = ConfigDict(extra="ignore", strict=True)


class IndexRequest(Model):
    index_name: IndexName
    # Required with an API key; a per-index user key opens the index without it (null).
    index_key: IndexKey | None = None


class IndexConfigIn(Model):
    type: IndexTypeIn | None = Field(
        None, description="ivfflat (default), ivf (scalar-quantised) or ivfpq; ivfsq = ivf"
    )
    index_type: IndexTypeIn | None = Field(None, description="the same as type")
    dimension: int | None = Field(None, ge=1, le=65536)
    pq_dim: int | None = Field(None, ge=0, description="ivfpq: sub-quantizers; divides dimension")
    pq_bits: int | None = Field(None, ge=0, le=16, description="ivfpq: bits per sub-quantizer")
    sq_bits: int | None = Field(None, description="ivf/ivfsq: 8 (default) or 16 (half precision)")
    n_lists: int | None = Field(
        None, ge=0, description="IVF lists to train (null/0 = automatic, about 4*sqrt(N))"
    )
    metric: Metric | None = None


class CreateIndexRequest(IndexRequest):
    index_config: IndexConfigIn | None = None
    # The top-level forms newer CyborgDB clients send (they take precedence over index_config).
    index_type: IndexTypeIn | None = Field(None, description="as index_config.type")
    dimension: int | None = Field(None, ge=1, le=65536, description="as index_config.dimension")
    n_lists: int | None = Field(None, ge=0, description="as index_config.n_lists")
    storage_precision: StoragePrecision | None = Field(
        None,
        description="diskivf: float32 (default) keeps original vectors in memory (ivfflat); "
        "float16, tq12, tq8, tq6, tq4 scalar-quantised codes (ivf) of 16, 16, 8, 6 and 4 bits "
        "a dimension (tq12 is stored as fp16: faiss has no 12-bit quantizer), the originals "
        "on disk for reranking",
    )
    metric: Metric | None = Field(
        None, description="euclidean (default), squared_euclidean, cosine"
    )
    embedding_model: str | None = Field(
        None,
        description="embed text on the server with this model (e.g. all-MiniLM-L6-v2): it "
        "fixes the dimension, and the metric defaults to cosine",
    )
    n_shards: int | None = Field(
        None,
        ge=1,
        le=256,
        description="vaultvec extension: shard actors for this index; null = the server's "
        "default (VAULTVEC_SHARDS, or one per Ray node with CPUs)",
    )
    # CyborgDB features vaultvec does not offer: refused with a 422 naming them when used.
    kms_name: str | None = Field(None, description="not supported: send index_key")
    text_fields: list[str] | None = Field(
        None, description="metadata fields searched by BM25: shorthand for full_text in the schema"
    )
    bm25_k1: float | None = Field(
        None, ge=0, le=10, description="BM25 term-frequency saturation (default 1.2)"
    )
    bm25_b: float | None = Field(
        None, ge=0, le=1, description="BM25 length normalisation (default 0.75)"
    )
    metadata_schema: dict[str, Any] | None = Field(
        None,
        description="per field: filterable (default true; false for full_text), pattern "
        "($regex/$contains in query_metadata; needs filterable), full_text (BM25: its text is "
        "searched by query/query_metadata with text); fields left out are filterable",
    )


class TrainRequest(IndexRequest):
    n_lists: int | None = Field(None, ge=0, description="number of IVF lists; null/0 = automatic")
    batch_size: int | None = Field(
        None, ge=0, description="items per rebuild batch; null/0 = default"
    )
    max_iters: int | None = Field(
        None, ge=0, le=1000, description=f"k-means iterations; null/0 = {KMEANS_ITERS}"
    )
    tolerance: float | None = Field(None, ge=0)
    max_memory: int | None = Field(None, ge=0, description="bytes of training sample; 0 = no limit")


class RotateKeyRequest(IndexRequest):
    index_key: IndexKey  # the current key: a rotation is the index key holder's alone
    new_index_key: IndexKey = Field(
        description="the key to re-seal the index under, 64 hex characters (never stored): "
        "once the rotation answers, only it opens the index"
    )


class Item(Model):
    id: str = Field(min_length=1, description="at most VAULTVEC_MAX_ID_LENGTH (1024) characters")
    vector: Vector | None = Field(
        None, description="omit to embed contents with the index's embedding_model"
    )
    contents: str | None = None
    metadata: dict[str, Any] | None = None


class UpsertRequest(IndexRequest):
    items: list[Item] = Field(min_length=1)


class TextSearchFields(Model):
    """The BM25 leg of a query (CyborgDB 0.18): needs an index with a full_text field."""

    text: str | None = Field(
        None, max_length=65536, description="query text for BM25 over the full_text fields"
    )
    text_fields: list[str] | None = Field(
        None, min_length=1, description="the full_text fields searched; default all"
    )
    text_field_weights: list[float] | None = Field(
        None, description="a weight per searched field (parallel to text_fields); default 1.0"
    )
    require_all_terms: bool | None = Field(
        None, description="match only items holding every query term; default false (any)"
    )


class HybridFields(TextSearchFields):
    alpha: float | None = Field(
        None, ge=0, le=1, description="0 = BM25 only, 1 = vectors only; default 0.5"
    )
    rrf_k: float | None = Field(None, gt=0, description="rank smoothing of the fusion; default 60")
    window_mult: int | None = Field(
        None, ge=1, le=100, description="each leg's depth as a multiple of top_k; default 3"
    )


class QueryRequest(HybridFields, IndexRequest):
    query_vectors: Vectors | None = Field(
        None, description="one vector (flat results) or a list of vectors (a result list each)"
    )
    query_contents: str | None = Field(
        None, description="query text, embedded with the index's embedding_model (flat results)"
    )
    top_k: int | None = Field(None, description="default 100")
    n_probes: int | None = Field(None, ge=0, description="0 or null = automatic")
    rerank_mult: RerankMult = None
    greedy: bool | None = None
    filters: dict[str, Any] | None = None
    include: list[QueryInclude] | None = Field(
        None,
        description='default ["distance","metadata"]; distance is always returned',
    )


class GetRequest(IndexRequest):
    ids: list[str] = Field(description="unknown ids are omitted; a repeated id is returned once")
    include: list[GetInclude] | None = Field(None, description="default: every field")


class DeleteRequest(IndexRequest):
    ids: list[str] | None = Field(None, description="[] deletes nothing")
    filters: dict[str, Any] | None = Field(
        None,
        description="vaultvec: delete the items this filter matches (among ids, if given); "
        '{} needs "all": true',
    )
    all: bool | None = Field(
        None, description='vaultvec: with filters {} or none, delete every item ("all": true)'
    )


class UpdateRequest(IndexRequest):
    ids: list[str] | None = Field(
        None, description="the items to update (with filters: among them)"
    )
    filters: dict[str, Any] | None = Field(
        None, description='update the items this filter matches; {} needs "all": true'
    )
    all: bool | None = Field(None, description="with filters {} or none: every item")
    update: dict[str, Any] = Field(
        default_factory=dict,
        description='{"$set": {"a.b": value}, "$unset": ["c"]} on metadata (dot paths)',
    )
    contents: str | None = Field(None, description="replace the items' contents (null: keep)")


class CountRequest(IndexRequest):
    filters: dict[str, Any] | None = Field(None, description="null or {} counts every item")


class CountResponse(Model):
    count: int


class Paged(Model):
    """vaultvec: one page of a scan in id order (serve_app.service.cursors)."""

    limit: int | None = Field(
        None,
        ge=1,
        le=PAGE_LIMIT,
        description="one page of at most this many items, in id order, and a next_cursor; "
        "null = every item at once (no cursor)",
    )
    cursor: str | None = Field(
        None, description="the next_cursor of the previous page (needs limit); null = first page"
    )


class ListIdsRequest(Paged, IndexRequest):
    pass


class QueryMetadataRequest(Paged, TextSearchFields, IndexRequest):
    filters: dict[str, Any] | None = Field(None, description="null or {} matches every item")
    top_k: int | None = Field(None, ge=1, description="at most this many ids; null = all")
    include: list[GetInclude] | None = Field(
        None, description="fields to return with each id (as /v1/vectors/get); default none"
    )
    order_by: str | dict[str, int] | None = Field(
        None,
        description="sort the matches by this metadata field (dot path) before top_k; "
        '{"field": 1 | -1} sets the direction too',
    )
    ascending: bool | None = Field(None, description="with order_by as a name; default true")


# -- responses ------------------------------------------------------------------------------
class StatusResponse(Model):
    status: str
    message: str


class HealthResponse(Model):
    status: str
    api_version: str
    version: str = Field(description="the CyborgDB API release vaultvec implements")
    vaultvec_version: str


class ListIndexesResponse(Model):
    indexes: list[str]


class IndexConfigOut(Model):
    index_type: IndexType
    type: IndexType
    dimension: int = Field(description="0 while unknown (fixed by the first upsert)")
    metric: Metric
    n_lists: int
    pq_dim: int = Field(description="0 unless ivfpq")
    pq_bits: int = Field(description="0 unless ivfpq")


class RecallReport(Model):
    """Measured by this gateway replica on a share of the automatically probed queries
    (VAULTVEC_RECALL_SAMPLE_SHARE), each also answered exactly in the background."""

    estimate: float | None = Field(description="recall@top_k of the answers served; null: none")
    target: float
    sampled_queries: int
    probe_scale: dict[str, float] = Field(
        description="the calibrated slack's multiplier fitted to the measured queries: "
        "unfiltered (or a filter matching >= 95% of the items), broad_filter (>= 30%), "
        "selective_filter (a filter answered by an exact scan of its matches has no scale)"
    )
    probe_fixed: dict[str, float] = Field(
        default_factory=dict,
        description="the kinds probed with a fixed count of lists instead, where that reached "
        "the target in under 0.9 of the adaptive rule's lists on the measured queries (for a "
        "first batch answered with what its own measured rows fit: in fewer): the count as a "
        "multiple of the calibrated first pass",
    )
    auto_queries: int
    lists_scanned_per_query: float | None


class PartitionMemory(Model):
    shard: int
    pool_actor: str = Field(description="the shard pool actor hosting the partition")
    resident_bytes: int = Field(description="what the loaded partition holds (estimate)")


class MemoryReport(Model):
    resident_bytes: int = Field(description="the index's partitions, summed")
    idle_ttl_s: float = Field(description="partitions idle this long are unloaded (0 = never)")
    partitions: list[PartitionMemory]


class Bm25Config(Model):
    k1: float
    b: float
    analyzer_version: str


class DescribeResponse(Model):
    index_name: str
    index_type: IndexType
    storage_precision: str | None = Field(
        None, description="float32, float16, tq12, tq8, tq6 or tq4; null for ivfpq"
    )
    is_trained: bool
    dimension: int = Field(description="0 while unknown")
    metric: Metric
    n_lists: int
    index_config: IndexConfigOut
    embedding_model: str | None
    metadata_schema: dict[str, dict[str, bool]] = Field(
        default_factory=dict,
        description="per field named at create time: filterable, pattern, full_text",
    )
    bm25: Bm25Config | None = Field(None, description="with a full_text field; null otherwise")
    num_vectors: int
    recall: RecallReport | None = Field(
        None, description="vaultvec: automatic probing's live recall estimate (null untrained)"
    )
    memory: MemoryReport | None = Field(
        None, description="vaultvec: where the index's partitions live and what they hold"
    )


class TrainingStatusResponse(Model):
    training_indexes: list[str]
    retrain_threshold: int
    worker_pid: int
    global_training: dict[str, Any]
    currently_training: str | None
    queued_indexes: list[str]
    worker_running: bool


class EmbeddingModel(Model):
    name: str
    dimension: int | None
    max_seq_length: int | None


class EmbeddingModelsResponse(Model):
    models: list[EmbeddingModel]


class UpsertResponse(StatusResponse):
    upserted_count: int


class DeleteResponse(StatusResponse):
    deleted_count: int


class UpdateResponse(StatusResponse):
    updated_count: int


class QueryResult(Model):
    id: str
    distance: float | None = Field(None, description="vector queries (smaller is nearer)")
    score: float | None = Field(
        None, description="hybrid queries (text): the fused relevance, larger is better"
    )
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None
    contents: str | None = None


class QueryResponse(Model):
    results: list[QueryResult] | list[list[QueryResult]]


class GetResult(Model):
    id: str
    score: float | None = Field(None, description="query_metadata with text: the BM25 score")
    vector: list[float] | None = None
    contents: str | None = None
    metadata: dict[str, Any] | None = None


class GetResponse(Model):
    results: list[GetResult]


class ListIdsResponse(Model):
    ids: list[str]
    count: int
    next_cursor: str | None = Field(
        None, description="with limit: the cursor of the next page; null on the last page"
    )


class NumVectorsResponse(StatusResponse):
    result: int


class QueryMetadataResponse(Model):
    results: list[GetResult]
    ids: list[str]
    count: int
    next_cursor: str | None = Field(
        None, description="with limit: the cursor of the next page; null on the last page"
    )


class ErrorResponse(Model):
    status_code: int
    detail: str
    errors: list[dict[str, Any]] | None = None
