"""Encrypted on-store layout of an index: catalog entry, config, templates, shard snapshots, WALs.

Keys (index_id is random, so names never appear in paths):
  indexes/{id}/meta                      plaintext catalog entry: name, salt, verifier
  indexes/{id}/config                    sealed IndexConfig
  indexes/{id}/template/{version}        sealed serialized faiss template (quantizer + codebooks)
  indexes/{id}/shards/{s}/snap/{gen}     sealed shard snapshot covering WAL generations < gen
  indexes/{id}/shards/{s}/wal/{gen}      log of sealed records; each record is
                                         u64 seq (plaintext) | sealed(frame), aad binds seq

Every sealed blob's associated data binds index name, kind, shard, part and version.
"""

from __future__ import annotations

import numpy as np
import orjson

from actors import codec
from actors.crypto import aad, open_sealed, seal
from actors.store import Store, key_join
from actors.types import IndexConfig, IndexMeta, UpsertBatch


def index_prefix(index_id: str) -> str:
    return key_join("indexes", index_id)


def meta_key(index_id: str) -> str:
    return key_join("indexes", index_id, "meta")


def shard_prefix(index_id: str, shard: int) -> str:
    return key_join("indexes", index_id, "shards", str(shard))


def snap_key(index_id: str, shard: int, gen: int) -> str:
    return key_join(shard_prefix(index_id, shard), "snap", f"{gen:010d}")


def wal_key(index_id: str, shard: int, gen: int) -> str:
    return key_join(shard_prefix(index_id, shard), "wal", f"{gen:010d}")


def generations(store: Store, index_id: str, shard: int, kind: str) -> list[int]:
    prefix = key_join(shard_prefix(index_id, shard), kind) + "/"
    return sorted(int(k.rsplit("/", 1)[1]) for k in store.list(prefix))


# -- catalog entry & config -----------------------------------------------------------------
def write_meta(store: Store, meta: IndexMeta) -> None:
    doc = {
        "name": meta.name,
        "index_id": meta.index_id,
        "salt": meta.salt.hex(),
        "verifier": meta.verifier.hex(),
        "placement": list(meta.placement),
    }
    store.put(meta_key(meta.index_id), orjson.dumps(doc))


def read_meta(raw: bytes) -> IndexMeta:
    doc = orjson.loads(raw)
    return IndexMeta(
        doc["name"],
        doc["index_id"],
        bytes.fromhex(doc["salt"]),
        bytes.fromhex(doc["verifier"]),
        tuple(doc.get("placement", ())),
    )


def write_config(store: Store, key: bytes, cfg: IndexConfig) -> None:
    blob = seal(key, orjson.dumps(cfg.to_json()), aad(cfg.name, "config"))
    store.put(key_join(index_prefix(cfg.index_id), "config"), blob)


def read_config(store: Store, key: bytes, name: str, index_id: str) -> IndexConfig | None:
    blob = store.get(key_join(index_prefix(index_id), "config"))
    if blob is None:
        return None
    return IndexConfig.from_json(orjson.loads(open_sealed(key, blob, aad(name, "config"))))


def write_template(store: Store, key: bytes, cfg: IndexConfig, template: np.ndarray) -> None:
    blob = seal(key, template.tobytes(), aad(cfg.name, "template", version=cfg.version))
    store.put(key_join(index_prefix(cfg.index_id), "template", f"{cfg.version:010d}"), blob)


def read_template(store: Store, key: bytes, cfg: IndexConfig) -> np.ndarray | None:
    if not cfg.is_trained:
        return None
    blob = store.get(key_join(index_prefix(cfg.index_id), "template", f"{cfg.version:010d}"))
    if blob is None:
        return None
    raw = open_sealed(key, blob, aad(cfg.name, "template", version=cfg.version))
    return np.frombuffer(raw, dtype=np.uint8)


def prune_templates(store: Store, cfg: IndexConfig) -> None:
    prefix = key_join(index_prefix(cfg.index_id), "template") + "/"
    for k in store.list(prefix):
        if int(k.rsplit("/", 1)[1]) < cfg.version:
            store.delete(k)


# -- WAL records ----------------------------------------------------------------------------
def encode_upsert(batch: UpsertBatch) -> bytes:
    ids_blob, ids_len = codec.pack_strings(batch.ids)
    meta_blob, meta_len = codec.pack_strings(batch.metadata)
    cont_blob, cont_len = codec.pack_strings(batch.contents)
    arrays = {
        "vectors": batch.vectors,
        "ids_blob": ids_blob,
        "ids_len": ids_len,
        "meta_blob": meta_blob,
        "meta_len": meta_len,
        "contents_blob": cont_blob,
        "contents_len": cont_len,
    }
    if batch.norms is not None:
        arrays["norms"] = batch.norms
    return codec.pack({"op": "upsert"}, arrays)


def encode_delete(ids: list[str]) -> bytes:
    blob, lengths = codec.pack_strings(ids)
    return codec.pack({"op": "delete"}, {"ids_blob": blob, "ids_len": lengths})


def decode_record(frame: bytes) -> tuple[str, UpsertBatch | list[str]]:
    meta, a = codec.unpack(frame)
    ids = codec.unpack_strings(a["ids_blob"], a["ids_len"])
    if meta["op"] == "delete":
        return "delete", ids
    batch = UpsertBatch(
        ids=tuple(ids),
        vectors=a["vectors"],
        norms=a.get("norms"),
        metadata=tuple(codec.unpack_strings(a["meta_blob"], a["meta_len"], as_bytes=True)),
        contents=tuple(codec.unpack_strings(a["contents_blob"], a["contents_len"])),
    )
    return "upsert", batch


def seal_record(key: bytes, name: str, shard: int, gen: int, seq: int, frame: bytes) -> bytes:
    return seq.to_bytes(8, "little") + seal(key, frame, aad(name, "wal", shard, str(gen), seq))


def open_record(key: bytes, name: str, shard: int, gen: int, record: bytes) -> tuple[int, bytes]:
    seq = int.from_bytes(record[:8], "little")
    return seq, open_sealed(key, record[8:], aad(name, "wal", shard, str(gen), seq))
