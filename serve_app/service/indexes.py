"""The operations on indexes: create, describe, delete, train, rotate a key, list them, the
training status and the embedding models. Each returns the answer's document; the routes
(serve_app.routes.indexes) only translate HTTP."""

from __future__ import annotations

from typing import Any

from actors.control.options import new_index_id
from actors.control.training import TrainParams
from actors.engine.ivf import default_pq_dim
from actors.errors import IndexRestoring, InvalidRequest
from actors.storage.crypto import derive_keys, new_salt, parse_index_key
from actors.types import IndexConfig, IndexMeta
from serve_app.access import context, rights
from serve_app.access.rights import Right
from serve_app.gateway.probing import IndexProbing
from serve_app.models import (
    CreateIndexRequest,
    IndexConfigIn,
    IndexRequest,
    IndexType,
    RotateKeyRequest,
    TrainRequest,
)
from serve_app.service import schema, text
from serve_app.service.deps import Services
from serve_app.service.unlock import open_index


async def list_indexes(svc: Services) -> list[str]:
    rights.require(Right.MANAGE)  # the service's catalog: API keys, not one index's users
    return await svc.engine.control.list_indexes()


async def training_status(svc: Services) -> dict[str, Any]:
    rights.require(Right.MANAGE)  # names the indexes training
    return await svc.engine.control.training_status()


async def embedding_models(svc: Services) -> list[dict[str, Any]]:
    """The models ``embedding_model`` accepts on create: name, dimension, max_seq_length."""
    return [] if svc.embedder is None else list(await svc.embedder.models.remote())


# CyborgDB's storage_precision -> (vaultvec index type, sq_bits), and back for describe.
# The tq* tiers are faiss scalar quantizers of that many bits a dimension (tq12: fp16 codes,
# as faiss has no 12-bit quantizer; actors.engine.ivf.SQ_TYPES).
PRECISIONS: dict[str, tuple[IndexType, int | None]] = {
    "float32": ("ivfflat", None),
    "float16": ("ivf", 16),
    "tq12": ("ivf", 12),
    "tq8": ("ivf", 8),
    "tq6": ("ivf", 6),
    "tq4": ("ivf", 4),
}


def precision_of(cfg: IndexConfig) -> str | None:
    """The storage_precision an index's storage is (an ``ivfsq`` index of 8 bits is ``tq8``);
    None for ``ivfpq``, which has none."""
    stored = (cfg.index_type, (cfg.sq_bits or 8) if cfg.index_type == "ivf" else None)
    return next((name for name, kind in PRECISIONS.items() if kind == stored), None)


def resolve_type(
    body: CreateIndexRequest, cfg_in: IndexConfigIn
) -> tuple[str, int | None, int | None, int | None]:
    """(vaultvec index type, pq_dim, pq_bits, sq_bits) of a create request in any client's form.

    CyborgDB's newer names map onto vaultvec's types: ``ivfsq`` is ``ivf`` (scalar quantised,
    ``sq_bits`` 8 or 16); ``diskivf`` (also what a request with only ``storage_precision``
    means) is ``ivfflat`` at float32 and ``ivf`` at the others (PRECISIONS: sq_bits 16, 12,
    8, 6 or 4)."""
    requested = body.index_type or cfg_in.index_type or cfg_in.type
    precision = body.storage_precision
    pq_dim, pq_bits, sq_bits = cfg_in.pq_dim or None, cfg_in.pq_bits or None, cfg_in.sq_bits
    if precision is not None and requested not in (None, "diskivf"):
        raise InvalidRequest("storage_precision applies only to diskivf indexes")
    if sq_bits is not None and sq_bits not in (8, 16):  # the public ivfsq contract
        raise InvalidRequest("sq_bits applies only to ivf/ivfsq indexes and must be 8 or 16")
    if requested == "diskivf" or precision is not None:
        requested, sq_bits = PRECISIONS[precision or "float32"]
    index_type = "ivf" if requested == "ivfsq" else requested or "ivfflat"
    if index_type != "ivfpq" and (pq_dim or pq_bits):
        raise InvalidRequest("pq_dim and pq_bits apply only to ivfpq indexes")
    if sq_bits is not None and index_type != "ivf":
        raise InvalidRequest("sq_bits applies only to ivf/ivfsq indexes and must be 8 or 16")
    if index_type == "ivfpq":
        pq_bits = pq_bits or 8
    return index_type, pq_dim, pq_bits, sq_bits


def refuse_unsupported(body: CreateIndexRequest) -> None:
    """CyborgDB features vaultvec does not offer: a clear 422, never silently ignored."""
    if body.kms_name:
        raise InvalidRequest("KMS-backed index keys are not supported: send index_key")


async def create(svc: Services, body: CreateIndexRequest) -> dict[str, Any]:
    rights.require(Right.MANAGE)
    engine, settings = svc.engine, svc.settings
    ctx = context.current()
    context.note(index=body.index_name)
    refuse_unsupported(body)
    if body.index_key is None:
        raise InvalidRequest("index_key is required: 64 hex characters (32 bytes)")
    key = parse_index_key(body.index_key)
    cfg_in = body.index_config or IndexConfigIn.model_validate({})
    index_type, pq_dim, pq_bits, sq_bits = resolve_type(body, cfg_in)
    metric = body.metric or cfg_in.metric
    dimension = body.dimension or cfg_in.dimension
    model = body.embedding_model or None
    if model:  # the model fixes the dimension; such indexes default to cosine
        model_dim = await text.model_dimension(svc.embedder, model)
        if dimension is not None and dimension != model_dim:
            raise InvalidRequest(
                f"dimension {dimension} conflicts with embedding_model {model!r}, "
                f"which produces {model_dim}-dimensional vectors"
            )
        dimension = model_dim
    metric = metric or ("cosine" if model else "euclidean")
    if pq_dim is not None and dimension is not None and dimension % pq_dim:
        raise InvalidRequest(f"pq_dim {pq_dim} must divide the dimension {dimension}")
    fields = schema.parse(body.metadata_schema, body.text_fields)
    bm25 = schema.bm25(fields, body.bm25_k1, body.bm25_b)
    salt = new_salt()
    keys = derive_keys(key, body.index_name, salt)
    owner = (ctx.key or "") if ctx is not None else ""
    meta = IndexMeta(body.index_name, new_index_id(), salt, keys.verifier, owner=owner)
    cfg = IndexConfig(
        name=body.index_name,
        index_id=meta.index_id,
        index_type=index_type,
        metric=metric,
        n_shards=body.n_shards or settings.shards,  # 0: the control plane picks
        dimension=dimension,
        pq_dim=pq_dim,
        pq_bits=pq_bits,
        sq_bits=sq_bits,
        embedding_model=model,
        recall_target=settings.recall_target,
        n_lists_requested=body.n_lists or cfg_in.n_lists or None,
        metadata_schema=fields,
        bm25=bm25,
    )
    max_per_owner = ctx.limits.max_indexes_per_key if ctx is not None and ctx.limits else 0
    await engine.control.create_index(meta, keys.data_key, cfg, max_per_owner)
    engine.forget(body.index_name)
    return {"status": "success", "message": f"Index '{body.index_name}' created"}


async def describe(svc: Services, body: IndexRequest) -> dict[str, Any]:
    engine = svc.engine
    # Any user of the index may describe it (CyborgDB's clients describe on load).
    cv = await open_index(engine, body.index_name, body.index_key, rights.OPEN)
    stats, pools = await engine.memory(cv)
    num = sum(st.count for st in stats)
    cv = await engine.refresh_if_stale(cv, [st.version for st in stats], now=True)
    cfg = cv.config
    # As CyborgDB answers: every field an int (0 = unknown or unused) in both places.
    dimension = cfg.dimension or 0
    n_lists = cfg.n_lists if cfg.is_trained else cfg.n_lists_requested or 1
    ivfpq = cfg.index_type == "ivfpq"
    return {
        "index_name": cfg.name,
        "index_type": cfg.index_type,
        "storage_precision": precision_of(cfg),
        "is_trained": cfg.is_trained,
        "dimension": dimension,
        "metric": cfg.metric,
        "n_lists": n_lists,
        "index_config": {
            "index_type": cfg.index_type,
            "type": cfg.index_type,
            "dimension": dimension,
            "metric": cfg.metric,
            "n_lists": n_lists,
            # as created, also while the dimension is unknown (fixed by the first upsert)
            "pq_dim": (cfg.pq_dim or (default_pq_dim(dimension) if dimension else 0))
            if ivfpq
            else 0,
            "pq_bits": (cfg.pq_bits or 8) if ivfpq else 0,
        },
        "embedding_model": cfg.embedding_model,
        "metadata_schema": schema.describe(cfg),
        "bm25": schema.describe_bm25(cfg),
        "num_vectors": num,
        "recall": recall_report(engine, cfg, cv.view.probing),
        # The index's own bytes only: the pool actors' memory moves with every index they
        # host, so their figures would show one key holder the others' activity. They are
        # the operator's, in GET /v1/metrics.
        "memory": {
            "resident_bytes": sum(st.resident_bytes for st in stats),
            "idle_ttl_s": pools[0].idle_ttl_s if pools else 0.0,
            "partitions": [
                {
                    "shard": s,
                    "pool_actor": pool.name,
                    "resident_bytes": st.resident_bytes,
                }
                for s, (st, pool) in enumerate(zip(stats, pools))
            ],
        },
    }


def recall_report(
    engine: Any, cfg: IndexConfig, probing: bytes | None = None
) -> dict[str, Any] | None:
    """The live recall estimate of automatic probing at this gateway replica
    (serve_app.gateway.probing); None until the index is trained."""
    if not cfg.is_trained:
        return None
    state = engine.monitor.peek(cfg.index_id, cfg.version)
    if state is None and probing is not None:  # what was learned before a restart
        state = IndexProbing.unpack(probing)
    if state is None or state.version != cfg.version:
        state = IndexProbing(cfg.version, cfg.recall_target)
    return state.report()


async def delete(svc: Services, body: IndexRequest) -> dict[str, Any]:
    engine = svc.engine
    cv = await open_index(engine, body.index_name, body.index_key, Right.MANAGE, restore=True)
    await engine.control.delete_index(body.index_name, cv.key)
    engine.forget(body.index_name)
    return {"status": "success", "message": f"Index '{body.index_name}' deleted"}


async def train(svc: Services, body: TrainRequest) -> dict[str, Any]:
    engine = svc.engine
    cv = await open_index(engine, body.index_name, body.index_key, Right.MANAGE)
    params = TrainParams(
        n_lists=body.n_lists or None,
        batch_size=body.batch_size or None,
        max_iters=body.max_iters or None,
        tolerance=body.tolerance,
        max_memory=body.max_memory or None,
    )
    status = await engine.control.train(body.index_name, cv.key, params, True)
    engine.forget(body.index_name)
    message = "Index trained" if status == "success" else "Training continues in the background"
    return {"status": status, "message": message}


async def rotate_key(svc: Services, body: RotateKeyRequest) -> dict[str, Any]:
    """Re-seal every stored blob of the index under new_index_key while it keeps serving;
    once this answers, only the new key opens the index."""
    rights.require(Right.MANAGE)
    engine = svc.engine
    new_key = parse_index_key(body.new_index_key)
    if new_key == parse_index_key(body.index_key):
        raise InvalidRequest("new_index_key must differ from index_key")
    meta, keys = await engine.keys(body.index_name, body.index_key)
    if meta.restoring:  # the restore needs the key the backup was made with
        raise IndexRestoring(f"index {body.index_name!r} is being restored from a backup")
    salt = new_salt()
    new = derive_keys(new_key, body.index_name, salt)
    await engine.control.rotate_key(
        body.index_name, keys.data_key, salt, new.verifier, new.data_key
    )
    engine.forget(body.index_name)
    return {"status": "success", "message": f"Index '{body.index_name}' key rotated"}
