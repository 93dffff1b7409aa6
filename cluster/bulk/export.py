"""``vaultvec export``: every item of an index, in id order through a cursor, to a file.

``.jsonl`` holds one object a line: ``id``, ``vector``, ``metadata``, ``contents``. ``.npy``
holds the vectors as a float32 matrix, and ``<name>.items.jsonl`` beside it the ``id``,
``metadata`` and ``contents`` of each row, in the same order. Vectors are what ``get``
returns: the originals, on every index type. The output
is plaintext: it is created readable by its owner alone (0600) and appears under its name
only once complete.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from cluster.client.index import Index

FIELDS = ("vector", "metadata", "contents")
NPY_HEADER = 128  # bytes: room for any (rows, columns) shape, rewritten once the rows are known


def sidecar(out: Path) -> Path:
    """Where ``.npy`` output keeps ids, metadata and contents."""
    return out.with_name(out.stem + ".items.jsonl")


def export(
    index: Index,
    out: Path,
    *,
    filters: dict[str, Any] | None = None,
    page_size: int = 1000,
    overwrite: bool = False,
    show_progress: bool = True,
) -> int:
    """Write every item ``filters`` matches (all without one) to ``out``; returns how many."""
    suffix = out.suffix.lower()
    if suffix not in (".jsonl", ".npy"):
        raise ValueError(f"{out}: export writes .jsonl or .npy")
    outputs = [out] if suffix == ".jsonl" else [out, sidecar(out)]
    for path in outputs:
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass --overwrite to replace it")
    from tqdm import tqdm

    rows = index.scan(filters, include=FIELDS, page_size=page_size)
    total = index.count(filters)  # the bar's estimate: writes may change it meanwhile
    with (
        tqdm(
            total=total, unit="item", unit_scale=True, disable=not show_progress, file=sys.stderr
        ) as bar,
        _staged(outputs) as files,
    ):
        if suffix == ".jsonl":
            n = _jsonl(rows, files[0], bar)
        else:
            n = _npy(rows, files[0], files[1], bar)
    return n


def _jsonl(rows: Iterator[dict[str, Any]], f: IO[bytes], bar: Any) -> int:
    n = 0
    for row in rows:
        f.write(orjson.dumps(_item(row), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        n += 1
        bar.update(1)
    return n


def _npy(rows: Iterator[dict[str, Any]], f: IO[bytes], items: IO[bytes], bar: Any) -> int:
    f.write(b"\0" * NPY_HEADER)
    n, dim = 0, 0
    for row in rows:
        vector = np.asarray(row.get("vector"), dtype="<f4")
        if n == 0:
            dim = len(vector)
        elif len(vector) != dim:
            raise ValueError(f"item {row['id']!r}: vector of {len(vector)} numbers, not {dim}")
        f.write(vector.tobytes())
        item = _item(row)
        item.pop("vector")
        items.write(orjson.dumps(item) + b"\n")
        n += 1
        bar.update(1)
    f.seek(0)
    f.write(npy_header(n, dim))
    return n


def _item(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "vector": row.get("vector"),
        "metadata": row.get("metadata"),
        "contents": row.get("contents"),
    }


def npy_header(rows: int, columns: int) -> bytes:
    """The .npy 1.0 header of a little-endian float32 (rows, columns) matrix, NPY_HEADER long."""
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {columns}), }}"
    text = text.ljust(NPY_HEADER - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("ascii")


@contextmanager
def _staged(paths: list[Path]) -> Iterator[list[IO[bytes]]]:
    """Files written as ``<path>.partial`` (0600), renamed onto ``paths`` when the block
    completes and removed when it fails."""
    partial = [p.with_name(p.name + ".partial") for p in paths]
    files: list[IO[bytes]] = []
    for p in partial:
        p.unlink(missing_ok=True)  # a stale one may have other modes: created afresh
        files.append(os.fdopen(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb"))
    try:
        yield files
        for f in files:
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        for f, p in zip(files, partial, strict=True):
            f.close()
            p.unlink(missing_ok=True)
        raise
    for f, p, final in zip(files, partial, paths, strict=True):
        f.close()
        os.replace(p, final)
