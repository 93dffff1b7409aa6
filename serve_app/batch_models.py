"""Request and answer models of the batch routes: vaultvec's compact arrays
(/v1/vectors/query_arrays, /v1/vectors/upsert_arrays) and CyborgDB's binary forms
(/v1/vectors/upsert_binary, /v1/vectors/query_binary); the rest are in serve_app.models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from serve_app.models import HybridFields, IndexRequest, Model, QueryInclude, RerankMult

# -- compact array forms (/v1/vectors/query_arrays, /v1/vectors/upsert_arrays) -------------
Shape = Annotated[
    list[int], Field(min_length=2, max_length=2, description="[rows, dimension] of the matrix")
]
ArraysInclude = Literal["distance", "metadata"]
Base64Matrix = Annotated[
    str,
    Field(
        description="base64 (standard alphabet, padded) of a row-major little-endian float32 "
        "matrix of the given shape: rows * dimension * 4 bytes"
    ),
]


class ArraysQueryRequest(IndexRequest):
    query_vectors: Base64Matrix
    shape: Shape
    top_k: int | None = Field(None, description="default 100")
    n_probes: int | None = Field(None, ge=0, description="0 or null = automatic")
    rerank_mult: RerankMult = None
    greedy: bool | None = None
    filters: dict[str, Any] | None = None
    include: list[ArraysInclude] | None = Field(None, description='default ["distance","metadata"]')


class ArraysQueryResponse(Model):
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


class ArraysUpsertRequest(IndexRequest):
    ids: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="one id per row of vectors"
    )
    vectors: Base64Matrix
    shape: Shape
    metadata: list[dict[str, Any] | None] | None = Field(None, description="one per id, or null")
    contents: list[str | None] | None = Field(None, description="one per id, or null")


# -- CyborgDB's binary forms (/v1/vectors/upsert_binary, /v1/vectors/query_binary) -----------
Base64Rows = Annotated[
    str,
    Field(
        description="base64 of a row-major little-endian float32 matrix with `dimension` "
        "columns: rows * dimension * 4 bytes"
    ),
]


class BinaryVectorBatch(Model):
    ids: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="one id per row"
    )
    vectors_b64: Base64Rows
    dimension: int = Field(ge=1, le=65536)
    metadata: list[dict[str, Any] | None] | None = Field(None, description="one per id, or null")
    contents: list[str | None] | None = Field(
        None, description='one per id, or null; "" means no contents'
    )


class BinaryUpsertRequest(IndexRequest):
    batch: BinaryVectorBatch


class BinaryQueryBatch(Model):
    vectors_b64: Base64Rows
    dimension: int = Field(ge=1, le=65536)


class BinaryQueryRequest(HybridFields, IndexRequest):
    batch: BinaryQueryBatch
    top_k: int | None = Field(None, description="default 100")
    n_probes: int | None = Field(None, ge=0, description="0 or null = automatic")
    rerank_mult: RerankMult = None
    greedy: bool | None = None
    filters: dict[str, Any] | None = None
    include: list[QueryInclude] | None = Field(
        None, description='as /v1/vectors/query; default ["distance","metadata"]'
    )
