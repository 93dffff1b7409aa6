"""Request and response models of the /v1 API (wire-compatible with CyborgDB's v0.12-0.14 service).

A field sent as JSON null means "use the default": every optional field is ``X | None = None``
and defaults are resolved by the engine. Unknown fields are ignored, as existing clients send
fields of later versions. Vectors are declared with their real JSON types for the OpenAPI schema
but validated by numpy (shape, finiteness), which is much faster than per-element validation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

IndexType = Literal["ivfflat", "ivf", "ivfpq"]
Metric = Literal["euclidean", "squared_euclidean", "cosine"]
QueryInclude = Literal["distance", "metadata"]
GetInclude = Literal["vector", "contents", "metadata"]

IndexName = Annotated[str, Field(min_length=1, max_length=255, description="Index name")]
IndexKey = Annotated[
    str, Field(description="The index's 32-byte key as 64 hex characters; never stored")
]
Vector = Annotated[list[float], SkipValidation]
Matrix = Annotated[list[list[float]], SkipValidation]


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class IndexRequest(Model):
    index_name: IndexName
    index_key: IndexKey


class IndexConfigIn(Model):
    type: IndexType | None = Field(None, description="ivfflat (default), ivf (SQ8) or ivfpq")
    dimension: int | None = Field(None, ge=1, le=65536)
    pq_dim: int | None = Field(None, ge=1, description="ivfpq: sub-quantizers; divides dimension")
    pq_bits: int | None = Field(None, ge=1, le=16, description="ivfpq: bits per sub-quantizer")
    metric: Metric | None = None


class CreateIndexRequest(IndexRequest):
    index_config: IndexConfigIn | None = None
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
        "default (VAULTVEC_SHARDS, or one per Ray node with CPUs, at least 2)",
    )


class TrainRequest(IndexRequest):
    n_lists: int | None = Field(None, ge=0, description="number of IVF lists; null/0 = automatic")
    batch_size: int | None = Field(
        None, ge=0, description="items per rebuild batch; null/0 = default"
    )
    max_iters: int | None = Field(
        None, ge=0, le=1000, description="k-means iterations; null/0 = 20"
    )
    tolerance: float | None = Field(None, ge=0)
    max_memory: int | None = Field(None, ge=0, description="bytes of training sample; 0 = no limit")


class Item(Model):
    id: str = Field(min_length=1, max_length=1024)
    vector: Vector | None = Field(
        None, description="omit to embed contents with the index's embedding_model"
    )
    contents: str | None = None
    metadata: dict[str, Any] | None = None


class UpsertRequest(IndexRequest):
    items: list[Item] = Field(min_length=1)


class QueryRequest(IndexRequest):
    query_vectors: Vector | Matrix | None = Field(
        None, description="one vector (flat results) or a list of vectors (a result list each)"
    )
    query_contents: str | None = Field(
        None, description="query text, embedded with the index's embedding_model (flat results)"
    )
    top_k: int | None = Field(None, description="default 100")
    n_probes: int | None = Field(None, ge=0, description="0 or null = automatic")
    greedy: bool | None = None
    filters: dict[str, Any] | None = None
    include: list[QueryInclude] | None = Field(None, description='default ["distance","metadata"]')


class GetRequest(IndexRequest):
    ids: list[str] = Field(min_length=1)
    include: list[GetInclude] | None = None


class DeleteRequest(IndexRequest):
    ids: list[str] = Field(min_length=1)


# -- responses ------------------------------------------------------------------------------
class StatusResponse(Model):
    status: str
    message: str


class HealthResponse(Model):
    status: str
    api_version: str
    version: str


class ListIndexesResponse(Model):
    indexes: list[str]


class IndexConfigOut(Model):
    type: IndexType
    dimension: int | None
    metric: Metric
    n_lists: int
    pq_dim: int | None = None
    pq_bits: int | None = None


class DescribeResponse(Model):
    index_name: str
    index_type: IndexType
    is_trained: bool
    index_config: IndexConfigOut
    embedding_model: str | None
    num_vectors: int


class TrainingStatusResponse(Model):
    training_indexes: list[str]
    retrain_threshold: int


class UpsertResponse(StatusResponse):
    upserted_count: int


class DeleteResponse(StatusResponse):
    deleted_count: int


class QueryResult(Model):
    id: str
    distance: float | None = None
    metadata: dict[str, Any] | None = None


class QueryResponse(Model):
    results: list[QueryResult] | list[list[QueryResult]]


class GetResult(Model):
    id: str
    vector: list[float] | None = None
    contents: str | None = None
    metadata: dict[str, Any] | None = None


class GetResponse(Model):
    results: list[GetResult]


class ListIdsResponse(Model):
    ids: list[str]
    count: int


class NumVectorsResponse(Model):
    result: int


class ErrorResponse(Model):
    status_code: int
    detail: str
    errors: list[dict[str, Any]] | None = None


# -- binary batch forms (/v1/vectors/query_binary, /v1/vectors/upsert_binary) ----------------
Shape = Annotated[
    list[int], Field(min_length=2, max_length=2, description="[rows, dimension] of the matrix")
]
Base64Matrix = Annotated[
    str,
    Field(
        description="base64 (standard alphabet, padded) of a row-major little-endian float32 "
        "matrix of the given shape: rows * dimension * 4 bytes"
    ),
]


class BinaryQueryRequest(IndexRequest):
    query_vectors: Base64Matrix
    shape: Shape
    top_k: int | None = Field(None, description="default 100")
    n_probes: int | None = Field(None, ge=0, description="0 or null = automatic")
    greedy: bool | None = None
    filters: dict[str, Any] | None = None
    include: list[QueryInclude] | None = Field(None, description='default ["distance","metadata"]')


class BinaryQueryResponse(Model):
    """Results of every query as compact arrays. Query q has ``counts[q]`` results (fewer than
    ``top_k`` only when fewer items match); ``ids`` (and ``metadata``) hold them flat, query
    after query, each query's results in ascending distance."""

    nq: int = Field(description="number of queries")
    top_k: int
    counts: list[int] = Field(description="results per query")
    ids: list[str] = Field(description="sum(counts) ids: query 0's, then query 1's, ...")
    distances: str | None = Field(
        None,
        description="with include distance: base64 of the (nq, top_k) little-endian float32 "
        "distance matrix, row-major; entries past counts[q] are +infinity",
    )
    metadata: list[dict[str, Any] | None] | None = Field(
        None, description="with include metadata: one document per entry of ids"
    )


class BinaryUpsertRequest(IndexRequest):
    ids: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        min_length=1, description="one id per row of vectors"
    )
    vectors: Base64Matrix
    shape: Shape
    metadata: list[dict[str, Any] | None] | None = Field(None, description="one per id, or null")
    contents: list[str | None] | None = Field(None, description="one per id, or null")
