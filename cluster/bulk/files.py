"""Inputs and outputs of the bulk driver.

Inputs (by suffix): ``.npy`` (a 2-D numeric array, memory-mapped), ``.fvecs`` (per vector: int32
dimension, then that many float32), ``.jsonl`` (per line: a JSON list of numbers, or an object
with ``vector`` and optionally ``id``, ``metadata``, ``contents``), ``.tsv`` (per line: numbers
separated by tabs; ``id_column`` names a column holding ids instead of a coordinate).

Query outputs (by suffix), always the complete results of a prefix of the input, in input
order:

* ``.npy``: one structured array with fields ``ids`` (n, k) and ``distances`` (n, k) float32;
  ids are unicode strings ("" = no result) or, with ``int_ids``, int64 (-1 = no result);
  distances are +inf where there is no result. While running, results go to chunk files in
  ``<output>.parts/`` (each in the output's layout); the final file is assembled (atomically)
  at the end.
* ``.jsonl``: one line per query, ``{"query": id or row, "ids": [...], "distances": [...]}``
  (plus ``"metadata"`` when asked for), appended batch by batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from cluster.client import QueryResult

INPUT_SUFFIXES = (".npy", ".fvecs", ".jsonl", ".tsv")
OUTPUT_SUFFIXES = (".npy", ".jsonl")


@dataclass(frozen=True)
class Batch:
    no: int
    start: int  # first input row
    vectors: np.ndarray  # (n, d) float32
    ids: list[str] | None  # from the input (jsonl "id", tsv id column), else None
    metadata: list[dict[str, Any] | None] | None = None
    contents: list[str | None] | None = None

    def row_ids(self, start_id: int = 0) -> list[str]:
        if self.ids is not None:
            return self.ids
        return [str(start_id + r) for r in range(self.start, self.start + len(self.vectors))]


def suffix_of(path: Path, allowed: tuple[str, ...], what: str) -> str:
    suffix = path.suffix.lower()
    if suffix not in allowed:
        raise ValueError(f"{what} {path}: unsupported format {suffix!r} (use {', '.join(allowed)})")
    return suffix


class Source:
    """Batches of an input file, from any batch number (for resuming)."""

    def __init__(self, path: Path, id_column: int | None = None) -> None:
        self.path = path
        self.kind = suffix_of(path, INPUT_SUFFIXES, "input")
        self.id_column = id_column
        self._matrix: np.ndarray | None = None
        if self.kind == ".npy":
            m = np.load(path, mmap_mode="r")
            if m.ndim != 2 or m.dtype.kind not in "fiu":
                raise ValueError(f"{path}: expected a 2-D numeric array, got {m.dtype} {m.shape}")
            self._matrix = m
        elif self.kind == ".fvecs":
            self._matrix = read_fvecs(path)
        self.rows = len(self._matrix) if self._matrix is not None else count_lines(path)

    def batches(self, batch_size: int, first_batch: int = 0) -> Iterator[Batch]:
        start = first_batch * batch_size
        if self._matrix is not None:
            for no, s in enumerate(range(start, self.rows, batch_size), first_batch):
                x = np.ascontiguousarray(self._matrix[s : s + batch_size], dtype=np.float32)
                yield Batch(no, s, x, None)
            return
        parse = self._parse_jsonl if self.kind == ".jsonl" else self._parse_tsv
        with open(self.path, "rb") as f:
            lines = (line for line in f if line.strip())
            for _ in range(start):
                next(lines, None)
            no, row, chunk = first_batch, start, []
            for line in lines:
                chunk.append(line)
                if len(chunk) == batch_size:
                    yield parse(no, row, chunk)
                    no, row, chunk = no + 1, row + len(chunk), []
            if chunk:
                yield parse(no, row, chunk)

    def _parse_jsonl(self, no: int, start: int, lines: list[bytes]) -> Batch:
        docs = [orjson.loads(line) for line in lines]
        if all(isinstance(d, list) for d in docs):
            return Batch(no, start, to_matrix(docs, self.path, start), None)
        if not all(isinstance(d, dict) and "vector" in d for d in docs):
            raise ValueError(
                f"{self.path}: lines {start + 1}-{start + len(docs)}: each line must be a list "
                'of numbers or an object with "vector"'
            )
        ids = [str(d["id"]) for d in docs] if all("id" in d for d in docs) else None
        meta = [d.get("metadata") for d in docs]
        cont = [d.get("contents") for d in docs]
        return Batch(
            no,
            start,
            to_matrix([d["vector"] for d in docs], self.path, start),
            ids,
            meta if any(m is not None for m in meta) else None,
            cont if any(c is not None for c in cont) else None,
        )

    def _parse_tsv(self, no: int, start: int, lines: list[bytes]) -> Batch:
        rows = [line.rstrip(b"\r\n").split(b"\t") for line in lines]
        ids = None
        if self.id_column is not None:
            col = self.id_column
            try:
                ids = [r.pop(col).decode() for r in rows]
            except IndexError:
                raise ValueError(f"{self.path}: id column {col} is out of range") from None
        return Batch(no, start, to_matrix(rows, self.path, start), ids)


def to_matrix(rows: list[Any], path: Path, start: int) -> np.ndarray:
    try:
        x = np.array(rows, dtype=np.float32)
    except ValueError:
        raise ValueError(
            f"{path}: rows {start + 1}-{start + len(rows)} are not equal-length lists of numbers"
        ) from None
    if x.ndim != 2:
        raise ValueError(f"{path}: rows {start + 1}-{start + len(rows)} are not vectors")
    return x


def read_fvecs(path: Path) -> np.ndarray:
    raw = np.memmap(path, dtype="<i4", mode="r")
    if len(raw) == 0:
        return np.zeros((0, 1), dtype=np.float32)
    d = int(raw[0])
    if d <= 0 or len(raw) % (d + 1):
        raise ValueError(f"{path}: not an .fvecs file (dimension {d}, {len(raw) * 4} bytes)")
    return raw.reshape(-1, d + 1)[:, 1:].view("<f4")


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            n += bool(line.strip())
    return n


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- query outputs --------------------------------------------------------------------------
def id_matrix(r: QueryResult, int_ids: bool) -> np.ndarray:
    ids = r.ids
    if int_ids:
        flat = ["-1" if i is None else i for i in ids.ravel().tolist()]
        try:
            return np.array(flat, dtype=np.int64).reshape(ids.shape)
        except ValueError:
            raise ValueError("result ids are not integers: drop --int-ids") from None
    if not (len(r.counts) and int(r.counts.min()) == ids.shape[1]):  # padded rows
        ids = np.where(ids == None, "", ids)  # noqa: E711 (elementwise)
    width = max(1, max(map(len, ids.ravel().tolist()), default=1))
    return ids.astype(f"<U{width}")  # with the width given: quicker than astype(str)


class NpySink:
    """Chunk files ``<output>.parts/chunk-<first row>.npy`` while running (each already in the
    output's layout); the final structured ``.npy`` at the end."""

    def __init__(self, output: Path, int_ids: bool) -> None:
        self.output = output
        self.int_ids = int_ids
        self.parts = output.with_name(output.name + ".parts")
        self.chunks: list[dict[str, Any]] = []
        self._buf: list[tuple[np.ndarray, np.ndarray]] = []
        self._buf_start = 0
        self.rows = 0

    def resume(self, state: dict[str, Any]) -> None:
        self.chunks = list(state.get("chunks", []))
        self.rows = self._buf_start = int(state.get("rows", 0))
        keep = {c["file"] for c in self.chunks}
        self.parts.mkdir(exist_ok=True)
        for f in self.parts.iterdir():  # chunks written after the last recorded progress
            if f.name not in keep:
                f.unlink()

    def start(self) -> None:
        self.parts.mkdir(exist_ok=True)

    def write(self, batch: Batch, result: QueryResult) -> None:
        dist = result.distances
        if dist is None:
            dist = np.full(result.ids.shape, np.nan, dtype=np.float32)
        self._buf.append((id_matrix(result, self.int_ids), dist))
        self.rows += len(result.ids)

    @property
    def buffered(self) -> int:
        return self.rows - self._buf_start

    def flush(self) -> dict[str, Any]:
        """Write the buffered results as one chunk; returns the state for the progress file."""
        if self._buf:
            name = f"chunk-{self._buf_start:012d}.npy"
            tmp = self.parts / (name + ".tmp")
            with open(tmp, "wb") as f:
                np.save(f, structured([ids for ids, _ in self._buf], [d for _, d in self._buf]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.parts / name)
            self.chunks.append({"file": name, "start": self._buf_start, "stop": self.rows})
            self._buf, self._buf_start = [], self.rows
        return {"rows": self.rows, "chunks": self.chunks}

    def finish(self) -> None:
        files = [self.parts / c["file"] for c in self.chunks]
        if len(files) == 1:  # already the whole output
            os.replace(files[0], self.output)
        else:
            parts = [np.load(f) for f in files]
            ids = [p["ids"] for p in parts]
            dist = [p["distances"] for p in parts]
            if not parts:
                ids = [np.zeros((0, 0), dtype=np.int64 if self.int_ids else "<U1")]
                dist = [np.zeros((0, 0), dtype=np.float32)]
            tmp = self.output.with_name(self.output.name + ".tmp.npy")
            np.save(tmp, structured(ids, dist))
            os.replace(tmp, self.output)
            for f in files:
                f.unlink(missing_ok=True)
        self.parts.rmdir()

    def where(self) -> str:
        return f"{len(self.chunks)} chunk file(s) in {self.parts}"


def structured(ids: list[np.ndarray], dist: list[np.ndarray]) -> np.ndarray:
    """Blocks of (n_i, k_i) ids and distances -> one array with fields ``ids`` and
    ``distances`` of width max k_i (padding "" or -1, and +inf)."""
    k = max(a.shape[1] for a in ids)
    id_dtype = max((a.dtype for a in ids), key=lambda t: t.itemsize)
    fill: Any = "" if id_dtype.kind == "U" else -1
    dtype = np.dtype([("ids", id_dtype, (k,)), ("distances", np.float32, (k,))])
    out = np.empty(sum(len(a) for a in ids), dtype=dtype)
    row = 0
    for a, d in zip(ids, dist):
        n, w = a.shape
        out["ids"][row : row + n, :w] = a
        out["distances"][row : row + n, :w] = d
        if w < k:
            out["ids"][row : row + n, w:] = fill
            out["distances"][row : row + n, w:] = np.inf
        row += n
    return out


class JsonlSink:
    """One line per query appended in input order; the progress file records the byte offset
    after the last complete batch, and a resumed run truncates the file there."""

    def __init__(self, output: Path, with_metadata: bool) -> None:
        self.output = output
        self.with_metadata = with_metadata
        self.rows = 0
        self._flushed_rows = 0
        self._f: Any = None

    def start(self) -> None:
        self._f = open(self.output, "wb")  # noqa: SIM115 (held across batches; close())

    def resume(self, state: dict[str, Any]) -> None:
        self.rows = self._flushed_rows = int(state.get("rows", 0))
        self._f = open(self.output, "r+b")  # noqa: SIM115
        self._f.truncate(int(state.get("bytes", 0)))
        self._f.seek(0, os.SEEK_END)

    def write(self, batch: Batch, result: QueryResult) -> None:
        qids: list[Any] = batch.ids or list(range(batch.start, batch.start + len(result.ids)))
        counts = result.counts.tolist()
        ids = result.ids.tolist()
        dist = None if result.distances is None else result.distances.tolist()
        meta = None if result.metadata is None else result.metadata.tolist()
        lines = []
        for q, n in enumerate(counts):
            doc: dict[str, Any] = {"query": qids[q], "ids": ids[q][:n]}
            if dist is not None:
                doc["distances"] = dist[q][:n]
            if meta is not None and self.with_metadata:
                doc["metadata"] = meta[q][:n]
            lines.append(orjson.dumps(doc))
        self._f.write(b"\n".join(lines) + b"\n")
        self.rows += len(counts)

    @property
    def buffered(self) -> int:
        return self.rows - self._flushed_rows

    def flush(self) -> dict[str, Any]:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._flushed_rows = self.rows
        return {"rows": self.rows, "bytes": self._f.tell()}

    def finish(self) -> None:
        self.close()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def where(self) -> str:
        return str(self.output)
