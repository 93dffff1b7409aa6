"""What a shard holds, as one frame and back: the item table and the partition index packed for
a snapshot, and an estimate of the memory they take."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from actors import constants
from actors.engine.fullvectors import FullVectors
from actors.engine.items import ItemTable
from actors.engine.ivf import PartitionIndex, read_index, serialize_frame, too_large
from actors.storage import codec
from actors.types import UpsertBatch

log = logging.getLogger("vaultvec.shard")


@dataclass
class State:
    seq: int  # the last WAL record applied
    version: int  # the training version of the partition's lists
    nprobe_table: tuple[tuple[int, int], ...]
    items: ItemTable
    partition: PartitionIndex | None
    vectors: FullVectors | None = None  # a compressed partition's full vectors (on disk)


def capture(state: State) -> codec.Frame:
    """The state as a frame; it copies what later writes change (the lists once, as faiss
    serialises them), so it stays valid after the shard's lock is released."""
    meta: dict[str, Any] = {
        "seq": state.seq,
        "version": state.version,
        "nprobe_table": [list(p) for p in state.nprobe_table],
        "next_label": state.items.next_label,
    }
    arrays: dict[str, np.ndarray | codec.Frame] = dict(state.items.to_arrays())
    if state.partition is not None:
        meta["dimension"] = state.partition.dimension
        arrays["index"] = serialize_frame(state.partition.index)
        arrays["radii"] = state.partition.radii.copy()
    if state.vectors is not None:  # read from their file as the snapshot is written
        arrays["vectors"] = state.vectors.section()
    return codec.pack_frame(meta, arrays)


def restore(
    frame: codec.Buffer | Iterable[codec.Buffer],
    vector_dir: str = "",
    check: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
) -> State:
    """The state in ``frame``: one buffer, or its consecutive chunks, each read once and
    released as the lists are read from it (a snapshot loaded from the store is never held
    whole); full vectors go to a new file in ``vector_dir``. ``check`` sees the frame's meta
    and arrays before the item table is sized from them (a backup's bounds; the lists and full
    vectors are read by then, bounded by the frame's own size)."""
    chunks = [frame] if isinstance(frame, (bytes, bytearray, memoryview)) else frame
    read_as: dict[str, Callable[[codec.Reader, int], Any]] = {
        "index": read_index,
        "vectors": partial(FullVectors.read, directory=vector_dir),
    }
    meta, arrays = codec.unpack_stream(codec.Reader(chunks), read_as, copy=True)
    if check is not None:
        check(meta, arrays)
    partition = None
    if "index" in arrays:
        partition = PartitionIndex(arrays.pop("index"))
        partition.radii = arrays["radii"].copy()
    full = arrays.get("vectors")
    if full is not None and (partition is None or full.dimension != partition.dimension):
        raise ValueError("full vectors whose dimension is not the partition's")
    return State(
        seq=meta["seq"],
        version=meta["version"],
        nprobe_table=tuple(tuple(p) for p in meta.get("nprobe_table", ())),
        vectors=arrays.pop("vectors", None),
        items=ItemTable.from_arrays(arrays, meta["next_label"]),
        partition=partition,
    )


def footprint(items: ItemTable, partition: PartitionIndex | None) -> int:
    """An estimate of the bytes the items and lists hold: per item the id, metadata, contents
    and the table's fixed columns, the lists' codes and the full-text postings (a pass over
    every item's metadata)."""
    n = items.next_label
    size = n * constants.ROW_BYTES
    for column in (items.metadata[:n], items.contents[:n]):
        size += sum(map(len, filter(None, column.tolist())))
    if partition is not None:
        size += partition.ntotal * (partition.index.code_size + 8)
    return size + items.text.nbytes()


def searchable(batch: UpsertBatch) -> UpsertBatch:
    """A WAL batch without the vectors no list can hold (written before upserts were checked
    against MAX_NORM: such items were acknowledged but never searchable); they are dropped and
    logged, so the shard loads."""
    bad = too_large(batch.vectors)
    if not len(bad):
        return batch
    log.warning("dropped %d stored items whose vectors are not finite or too large", len(bad))
    keep = np.setdiff1d(np.arange(len(batch.ids)), bad)
    rows = keep.tolist()
    return UpsertBatch(
        ids=tuple(batch.ids[i] for i in rows),
        vectors=batch.vectors[keep],
        norms=None if batch.norms is None else batch.norms[keep],
        metadata=tuple(batch.metadata[i] for i in rows),
        contents=tuple(batch.contents[i] for i in rows),
    )
