"""Text on the gateway: item contents and query text -> vectors, through the Embedder deployment.

serve_app.service calls these with the Embedder's DeploymentHandle (``http.embedder_of``), then
runs the vectors as any others. Error messages never quote the text itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.errors import InvalidRequest
from actors.types import IndexConfig
from serve_app.service.checks import as_matrix, check_dimension
from serve_app.service.params import UpsertRows, unique_ids
from serve_app.telemetry import lap, now

NO_EMBEDDER = "text embedding is not enabled on this server"


def _handle(embedder: Any) -> Any:
    if embedder is None:
        raise InvalidRequest(NO_EMBEDDER)
    return embedder


def index_model(cfg: IndexConfig, what: str) -> str:
    """The index's embedding model, or a 422 saying ``what`` needs one."""
    if not cfg.embedding_model:
        raise InvalidRequest(f"{what} needs an index created with an embedding_model")
    return cfg.embedding_model


async def model_dimension(embedder: Any, model: str) -> int:
    """The model's output dimension; 422 naming the available models if it is unknown."""
    return int(await _handle(embedder).dimension.remote(model))


async def embed_query(embedder: Any, model: str, text: str) -> np.ndarray:
    """One query text -> (1, d) float32 (the Embedder coalesces concurrent calls)."""
    if not text.strip():
        raise InvalidRequest("query_contents is empty")
    t = now()
    vec = await _handle(embedder).embed_query.remote(model, text)
    lap("embed", t)
    return np.asarray(vec, dtype=np.float32).reshape(1, -1)


async def item_vectors(embedder: Any, cfg: IndexConfig, rows: UpsertRows) -> np.ndarray:
    """The (n, d) float32 matrix of the JSON items ``rows``: items that carry a vector keep it;
    the others are embedded from their contents, all in one model call (the request's embed
    stage; reading the given vectors is part of its parse stage)."""
    t = now()
    ids, vectors, contents = rows.ids, rows.vectors, rows.contents
    text_rows = [i for i, v in enumerate(vectors) if v is None]
    if not text_rows:
        x = as_matrix(list(vectors), "items vectors")[0]
        lap("parse", t)
        return x
    if not cfg.embedding_model:
        raise InvalidRequest(
            f"item {ids[text_rows[0]]!r} has no vector and the index has no embedding model"
        )
    empty = next((i for i in text_rows if not (contents[i] or "").strip()), None)
    if empty is not None:
        raise InvalidRequest(f"item {ids[empty]!r} has neither a vector nor contents to embed")
    unique_ids(ids, "items ids")  # everything cheap is checked before the model runs
    vec_rows = [i for i, v in enumerate(vectors) if v is not None]
    given = None
    if vec_rows:
        given, _ = as_matrix([vectors[i] for i in vec_rows], "items vectors")
        check_dimension(given, cfg.dimension, "items vectors")
    texts = [str(contents[i]) for i in text_rows]
    t = lap("parse", t)
    emb = await _handle(embedder).embed_batch.remote(cfg.embedding_model, texts)
    t = lap("embed", t)
    emb = np.asarray(emb, dtype=np.float32)
    if given is None:
        return emb
    check_dimension(given, emb.shape[1], "items vectors")
    x = np.empty((len(ids), emb.shape[1]), dtype=np.float32)
    x[vec_rows] = given
    x[text_rows] = emb
    lap("parse", t)
    return x
