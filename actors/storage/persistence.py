"""Encrypted on-store layout of an index: catalog entry, config, templates, shard snapshots, WALs.

Keys (index_id is random, so names never appear in paths):
  indexes/{id}/meta                      plaintext catalog entry: name, key epoch, salt, verifier,
                                         placement, a key rotation under way
  {root}/config                          sealed IndexConfig
  {root}/template/{version}              sealed serialized faiss template (quantizer + codebooks)
  {root}/shards/{s}/snap/{gen}           sealed shard snapshot covering WAL generations < gen,
  {root}/shards/{s}/snap/{gen}.{i}-{n}   or its chunks i = 0..n-1 when it is larger than one
                                         chunk (no stored value over a bounded size: PostgreSQL's
                                         bytea holds at most 1 GiB), each sealed on its own
  {root}/shards/{s}/wal/{gen}            log of sealed records; each record is
                                         u64 seq (plaintext) | sealed(frame), aad binds seq

where {root} is the key epoch's prefix (:func:`epoch_prefix`): ``indexes/{id}`` for epoch 0 (the
layout before key rotation existed) and ``indexes/{id}/epochs/{e}`` after e rotations. Every
blob under a root is sealed with that epoch's data key; a rotation (actors.control.rotation) writes the
next root beside the current one and the catalog entry says which is current.

Every sealed blob's associated data binds index name, kind, shard, part and version.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson

from actors import constants
from actors.errors import DecryptError
from actors.storage import Store, StoreError, codec, key_join
from actors.storage.codec import Frame
from actors.storage.crypto import aad, open_sealed, seal, seal_pieces
from actors.types import IndexConfig, IndexMeta, KeyRotation, UpsertBatch, UserGrant


def index_prefix(index_id: str) -> str:
    return key_join("indexes", index_id)


def meta_key(index_id: str) -> str:
    return key_join("indexes", index_id, "meta")


def epoch_prefix(index_id: str, epoch: int = 0) -> str:
    """Where the blobs sealed under key epoch ``epoch`` live."""
    if epoch == 0:
        return index_prefix(index_id)
    return key_join("indexes", index_id, "epochs", str(epoch))


def shard_prefix(index_id: str, shard: int, epoch: int = 0) -> str:
    return key_join(epoch_prefix(index_id, epoch), "shards", str(shard))


def snap_key(index_id: str, shard: int, gen: int, epoch: int = 0) -> str:
    return key_join(shard_prefix(index_id, shard, epoch), "snap", f"{gen:010d}")


def wal_key(index_id: str, shard: int, gen: int, epoch: int = 0) -> str:
    return key_join(shard_prefix(index_id, shard, epoch), "wal", f"{gen:010d}")


def snap_part_key(index_id: str, shard: int, gen: int, part: int, parts: int, epoch: int) -> str:
    name = f"{gen:010d}.{part:05d}-{parts:05d}"
    return key_join(shard_prefix(index_id, shard, epoch), "snap", name)


def generations(store: Store, index_id: str, shard: int, kind: str, epoch: int = 0) -> list[int]:
    """The generations of ``kind`` (snap or wal) stored for the shard, ascending (a snapshot in
    chunks once, whether or not all of its chunks are there)."""
    return sorted(_stored(store, index_id, shard, kind, epoch))


def _stored(store: Store, index_id: str, shard: int, kind: str, epoch: int) -> dict[int, list[str]]:
    """Generation -> its keys (one, or a snapshot's chunks)."""
    prefix = key_join(shard_prefix(index_id, shard, epoch), kind) + "/"
    out: dict[int, list[str]] = {}
    for k in store.list(prefix):
        out.setdefault(int(k[len(prefix) :].split(".", 1)[0]), []).append(k)
    return out


def stored_epochs(store: Store, index_id: str) -> dict[int, list[str]]:
    """The index's blob keys by the key epoch they are sealed under (the catalog entry, which
    belongs to none, left out)."""
    prefix = index_prefix(index_id) + "/"
    epochs: dict[int, list[str]] = {}
    for key in store.list(prefix):
        parts = key[len(prefix) :].split("/")
        if parts != ["meta"]:
            epochs.setdefault(int(parts[1]) if parts[0] == "epochs" else 0, []).append(key)
    return epochs


def delete_epoch(store: Store, index_id: str, epoch: int) -> None:
    """Remove every blob sealed under key epoch ``epoch`` (the catalog entry stays)."""
    root = epoch_prefix(index_id, epoch)
    if epoch == 0:  # shares its prefix with the catalog entry and the later epochs
        store.delete(config_key(index_id))
        store.delete(probing_key(index_id))
        store.delete_prefix(key_join(root, "template") + "/")
        store.delete_prefix(key_join(root, "shards") + "/")
    else:
        store.delete_prefix(root + "/")


# -- catalog entry & config -----------------------------------------------------------------
def write_meta(store: Store, meta: IndexMeta) -> None:
    store.put(meta_key(meta.index_id), meta_document(meta))


def meta_document(meta: IndexMeta) -> bytes:
    doc: dict[str, object] = {
        "name": meta.name,
        "index_id": meta.index_id,
        "salt": meta.salt.hex(),
        "verifier": meta.verifier.hex(),
        "placement": list(meta.placement),
        "epoch": meta.epoch,
    }
    if meta.rotation is not None:
        doc["rotation"] = {
            "salt": meta.rotation.salt.hex(),
            "verifier": meta.rotation.verifier.hex(),
        }
    if meta.retired_epoch >= 0:
        doc["retired_epoch"] = meta.retired_epoch
    if meta.owner:
        doc["owner"] = meta.owner
    if meta.restoring:
        doc["restoring"] = meta.restoring
    if meta.users:
        doc["users"] = [
            {
                "user_id": u.user_id,
                "rights": list(u.rights),
                "salt": u.salt.hex(),
                "verifier": u.verifier.hex(),
                "wrapped": u.wrapped.hex(),
                "escrow": u.escrow.hex(),
            }
            for u in meta.users
        ]
    return orjson.dumps(doc)


def read_meta(raw: bytes) -> IndexMeta:
    doc = orjson.loads(raw)
    rotation = doc.get("rotation")
    return IndexMeta(
        doc["name"],
        doc["index_id"],
        bytes.fromhex(doc["salt"]),
        bytes.fromhex(doc["verifier"]),
        tuple(doc.get("placement", ())),
        epoch=int(doc.get("epoch", 0)),
        rotation=None
        if rotation is None
        else KeyRotation(bytes.fromhex(rotation["salt"]), bytes.fromhex(rotation["verifier"])),
        retired_epoch=int(doc.get("retired_epoch", -1)),
        owner=str(doc.get("owner", "")),
        restoring=str(doc.get("restoring", "")),
        users=tuple(
            UserGrant(
                u["user_id"],
                tuple(u["rights"]),
                bytes.fromhex(u["salt"]),
                bytes.fromhex(u["verifier"]),
                bytes.fromhex(u["wrapped"]),
                bytes.fromhex(u["escrow"]),
            )
            for u in doc.get("users", ())
        ),
    )


def load_meta(store: Store, index_id: str) -> IndexMeta | None:
    raw = store.get(meta_key(index_id))
    return None if raw is None else read_meta(raw)


def config_key(index_id: str, epoch: int = 0) -> str:
    return key_join(epoch_prefix(index_id, epoch), "config")


def write_config(store: Store, key: bytes, cfg: IndexConfig) -> None:
    blob = seal(key, orjson.dumps(cfg.to_json()), aad(cfg.name, "config"))
    store.put(config_key(cfg.index_id, cfg.key_epoch), blob)


def read_config(
    store: Store, key: bytes, name: str, index_id: str, epoch: int = 0
) -> IndexConfig | None:
    blob = store.get(config_key(index_id, epoch))
    if blob is None:
        return None
    return IndexConfig.from_json(orjson.loads(open_sealed(key, blob, aad(name, "config"))))


def opens_config(store: Store, key: bytes, name: str, index_id: str, epoch: int) -> bool | None:
    """Whether ``key`` is the data key of ``epoch`` (it opens that epoch's config); None when
    there is no config to tell."""
    blob = store.get(config_key(index_id, epoch))
    if blob is None:
        return None
    try:
        open_sealed(key, blob, aad(name, "config"))
    except DecryptError:
        return False
    return True


def probing_key(index_id: str, epoch: int = 0) -> str:
    return key_join(epoch_prefix(index_id, epoch), "probing")


def write_probing(store: Store, key: bytes, cfg: IndexConfig, state: bytes) -> None:
    """What the gateways learned of automatic probing for ``cfg``'s training version
    (serve_app.gateway.probing), sealed; one copy per index, the latest."""
    blob = seal(key, state, aad(cfg.name, "probing", version=cfg.version))
    store.put(probing_key(cfg.index_id, cfg.key_epoch), blob)


def read_probing(store: Store, key: bytes, cfg: IndexConfig) -> bytes | None:
    """The learned probing state of ``cfg``'s training version (None: none, or one of an
    earlier version, whose associated data does not match)."""
    blob = store.get(probing_key(cfg.index_id, cfg.key_epoch))
    if blob is None:
        return None
    try:
        return open_sealed(key, blob, aad(cfg.name, "probing", version=cfg.version))
    except DecryptError:
        return None


def template_key(cfg: IndexConfig, version: int, epoch: int) -> str:
    return key_join(epoch_prefix(cfg.index_id, epoch), "template", f"{version:010d}")


def template_versions(store: Store, cfg: IndexConfig, epoch: int) -> list[int]:
    prefix = key_join(epoch_prefix(cfg.index_id, epoch), "template") + "/"
    return sorted(int(k.rsplit("/", 1)[1]) for k in store.list(prefix))


def write_template(store: Store, key: bytes, cfg: IndexConfig, template: np.ndarray) -> None:
    blob = seal(key, template.tobytes(), aad(cfg.name, "template", version=cfg.version))
    store.put(template_key(cfg, cfg.version, cfg.key_epoch), blob)


def read_template(store: Store, key: bytes, cfg: IndexConfig) -> np.ndarray | None:
    if not cfg.is_trained:
        return None
    blob = store.get(template_key(cfg, cfg.version, cfg.key_epoch))
    if blob is None:
        return None
    raw = open_sealed(key, blob, aad(cfg.name, "template", version=cfg.version))
    return np.frombuffer(raw, dtype=np.uint8)


def reseal_templates(
    store: Store, key: bytes, cfg: IndexConfig, new_key: bytes, new_epoch: int
) -> None:
    """Copy every stored template of ``cfg``'s epoch, sealed under ``new_key``, into
    ``new_epoch``."""
    for version in template_versions(store, cfg, cfg.key_epoch):
        blob = store.get(template_key(cfg, version, cfg.key_epoch))
        if blob is None:  # pruned meanwhile
            continue
        associated = aad(cfg.name, "template", version=version)
        raw = open_sealed(key, blob, associated)
        store.put(template_key(cfg, version, new_epoch), seal(new_key, raw, associated))


def prune_templates(store: Store, cfg: IndexConfig) -> None:
    for version in template_versions(store, cfg, cfg.key_epoch):
        if version < cfg.version:
            store.delete(template_key(cfg, version, cfg.key_epoch))


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


def records(
    store: Store, key: bytes, name: str, index_id: str, shard: int, epoch: int, gen: int, seq: int
) -> Iterator[tuple[int, str, UpsertBatch | list[str], int]]:
    """The records of ``shard``'s WAL generation ``gen`` after record ``seq``, in order: (seq,
    op, payload, record size)."""
    for record in store.read_log(wal_key(index_id, shard, gen, epoch)):
        n, frame = open_record(key, name, shard, gen, record)
        if n > seq:
            op, payload = decode_record(frame)
            yield n, op, payload, len(record)


def put_snapshot(
    store: Store,
    key: bytes,
    name: str,
    index_id: str,
    shard: int,
    epoch: int,
    frame: bytes | Frame,
    gen: int,
    chunk_bytes: int = constants.SNAPSHOT_CHUNK_BYTES,
) -> None:
    """Seal ``frame`` as key epoch ``epoch``'s snapshot ``gen`` of ``shard`` (in chunks of at
    most ``chunk_bytes`` when it is larger), then drop the epoch's older snapshots and the WAL
    generations it covers. A snapshot cut short by a crash is never loaded (its chunks are not
    all there: :func:`load_snapshot` takes the one before) and goes with the next one."""
    stored = _stored(store, index_id, shard, "snap", epoch)
    for k in stored.pop(gen, []):
        store.delete(k)  # left by an earlier attempt at this generation, cut short
    whole = frame if isinstance(frame, Frame) else Frame([frame])
    parts = max(1, -(-whole.nbytes // chunk_bytes))
    # Sealed and written a chunk at a time: the frame is never copied whole.
    for i, pieces in enumerate(whole.chunk_pieces(chunk_bytes)):
        blob = seal_pieces(key, pieces, _snap_aad(name, shard, gen, i, parts))
        if parts == 1:
            store.put(snap_key(index_id, shard, gen, epoch), blob)
        else:
            store.put(snap_part_key(index_id, shard, gen, i, parts, epoch), blob)
        del blob, pieces
    for old, keys in stored.items():  # listed before: the shard's snapshots are written in turn
        if old < gen:
            for k in keys:
                store.delete(k)
    for old in generations(store, index_id, shard, "wal", epoch):
        if old < gen:
            store.delete(wal_key(index_id, shard, old, epoch))


def _snap_aad(name: str, shard: int, gen: int, part: int = 0, parts: int = 1) -> bytes:
    # A whole snapshot keeps the associated data it always had; a chunk's binds its place.
    return aad(name, "snapshot", shard, "" if parts == 1 else f"{part}/{parts}", version=gen)


def load_snapshot(
    store: Store, key: bytes, name: str, index_id: str, shard: int, epoch: int
) -> tuple[int, Iterator[bytes]] | None:
    """(generation, its frame's chunks) of the shard's latest complete snapshot in key epoch
    ``epoch``; None when there is none. Each chunk is read and opened as it is taken (a
    snapshot is never held whole)."""
    for gen, keys in sorted(_stored(store, index_id, shard, "snap", epoch).items(), reverse=True):
        whole = snap_key(index_id, shard, gen, epoch)
        if whole in keys:
            return gen, _opened(store, key, [(whole, _snap_aad(name, shard, gen))])
        parts = int(keys[0].rsplit("-", 1)[1])
        names = [snap_part_key(index_id, shard, gen, i, parts, epoch) for i in range(parts)]
        if set(names) != set(keys):
            continue  # cut short by a crash while it was written: the one before holds
        places = [(k, _snap_aad(name, shard, gen, i, parts)) for i, k in enumerate(names)]
        return gen, _opened(store, key, places)
    return None


def _opened(store: Store, key: bytes, places: list[tuple[str, bytes]]) -> Iterator[bytes]:
    for k, associated in places:
        blob = store.get(k)
        if blob is None:
            raise StoreError(f"snapshot chunk {k} vanished while it was read")
        opened = open_sealed(key, blob, associated)
        del blob  # before the chunk is read: one sealed chunk at a time
        yield opened
