"""The full vectors of a partition whose lists hold compressed codes (``ivf``, ``ivfpq``), kept
out of memory: sealed one by one in an unnamed local file and read back only for the candidates
a query reranks.

The file is made with ``O_TMPFILE`` where the system has it (:func:`tempfile.TemporaryFile`):
it has no name, so no other process can open it, and it is gone when the process ends. Each
record is the vector sealed with AES-256-GCM under a key made for this file and held only in
memory, with the item's label as associated data (a record read back at another label fails):
``nonce (12) | ciphertext (4 × dimension) | tag (16)``, record ``label`` at ``label × size``.
Every label below :attr:`FullVectors.count` has a record (rows of items deleted since hold
what they held, zeros where nothing was known), so the file is read in label ranges as well
as by candidate.

The file is a copy, never the truth: the vectors reach the store in the WAL and the snapshots
(sealed under the index's key, as every partition's are), and a shard that loads builds its
file from them again.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from actors.storage import codec

NONCE, TAG = 12, 16
BLOCK_ROWS = 4096  # rows read, sealed or opened per pass over a range
_HEADER = 12  # a frame section: u32 dimension, u64 rows


def _aad(label: int) -> bytes:
    return label.to_bytes(8, "little")


class FullVectors:
    """Float32 vectors by label in a sealed unnamed file (see the module)."""

    def __init__(self, dimension: int, directory: str = "") -> None:
        self.dimension = dimension
        self.directory = directory
        self.record = 4 * dimension + NONCE + TAG
        # Mode 0600 and no name; open as long as this object lives (closed when collected).
        self._file = tempfile.TemporaryFile(dir=directory or None)  # noqa: SIM115
        self._fd = self._file.fileno()
        self._aead = AESGCM(AESGCM.generate_key(bit_length=256))
        self.count = 0  # records written: every label below it

    # -- writing ----------------------------------------------------------------------------
    def put(self, labels: np.ndarray, x: np.ndarray) -> None:
        """Seal ``x[i]`` as label ``labels[i]``'s record, a block of rows at a time (``x`` is
        never copied whole). Labels between :attr:`count` and the first one given are items
        no longer alive (a caller puts every live item's label): their records hold zeros, so
        that every record below :attr:`count` opens. Raises OSError if the disk refuses; the
        caller then drops this file (the store holds the vectors)."""
        labels = np.asarray(labels, dtype=np.int64)
        if not len(labels):
            return
        x = np.asarray(x, dtype=np.float32).reshape(len(labels), self.dimension)
        order = np.argsort(labels, kind="stable")
        ordered = labels[order]
        if len(ordered) > 1 and not (np.diff(ordered) > 0).all():
            raise ValueError("full vectors: a label given twice")
        gaps = np.flatnonzero(np.diff(ordered) != 1) + 1
        for a, b in zip([0, *gaps.tolist()], [*gaps.tolist(), len(ordered)], strict=True):
            for lo in range(a, b, BLOCK_ROWS):
                hi = min(b, lo + BLOCK_ROWS)
                self._put_run(int(ordered[lo]), x[order[lo:hi]])

    def _put_run(self, start: int, rows: np.ndarray) -> None:
        if start > self.count:  # dead items' labels: zeros, so every record opens
            for lo in range(self.count, start, BLOCK_ROWS):
                n = min(BLOCK_ROWS, start - lo)
                self._put_run(lo, np.zeros((n, self.dimension), np.float32))
        for a in range(0, len(rows), BLOCK_ROWS):
            data = memoryview(self._seal(start + a, rows[a : a + BLOCK_ROWS]))
            at = (start + a) * self.record
            while len(data):  # (a short write goes on where it stopped)
                done = os.pwrite(self._fd, data, at)
                data, at = data[done:], at + done
        self.count = max(self.count, start + len(rows))

    def _seal(self, start: int, rows: np.ndarray) -> bytearray:
        size, n = self.record, len(rows)
        nonces = os.urandom(NONCE * n)
        out = bytearray(size * n)
        view = memoryview(out)
        data = np.ascontiguousarray(rows, dtype=np.float32).tobytes()
        width = 4 * self.dimension
        encrypt = self._aead.encrypt
        for i in range(n):
            nonce = nonces[i * NONCE : (i + 1) * NONCE]
            at = i * size
            view[at : at + NONCE] = nonce
            view[at + NONCE : at + size] = encrypt(
                nonce, data[i * width : (i + 1) * width], _aad(start + i)
            )
        return out

    # -- reading ----------------------------------------------------------------------------
    def get(self, labels: np.ndarray) -> np.ndarray:
        """The vectors of ``labels`` (each below :attr:`count`), one record read and opened
        each: what a rerank costs per candidate."""
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(labels) and not (int(labels.min()) >= 0 and int(labels.max()) < self.count):
            bad = labels[(labels < 0) | (labels >= self.count)][0]
            raise KeyError(f"no full vector for label {bad}")
        size, fd, decrypt, pread = self.record, self._fd, self._aead.decrypt, os.pread
        plain = []  # joined once: a row assigned per record costs a third more
        for label in labels.tolist():
            rec = memoryview(pread(fd, size, label * size))
            plain.append(decrypt(rec[:NONCE], rec[NONCE:], label.to_bytes(8, "little")))
        out = np.frombuffer(bytearray().join(plain), dtype=np.float32)
        return out.reshape(len(labels), self.dimension)

    def range(self, start: int, stop: int) -> np.ndarray:
        """The vectors of labels ``start`` to ``stop`` (exclusive), read in one pass."""
        stop = min(stop, self.count)
        n = max(0, stop - start)
        out = np.empty((n, self.dimension), dtype=np.float32)
        if not n:
            return out
        size = self.record
        data = os.pread(self._fd, n * size, start * size)
        if len(data) != n * size:
            raise OSError("the full vectors' file is shorter than its records")
        decrypt = self._aead.decrypt
        view = memoryview(data)
        for i in range(n):
            rec = view[i * size : (i + 1) * size]
            out[i] = np.frombuffer(decrypt(rec[:NONCE], rec[NONCE:], _aad(start + i)), np.float32)
        return out

    def blocks(self, rows: int = BLOCK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """(first label, vectors) of every record, in label order, ``rows`` at a time."""
        for start in range(0, self.count, rows):
            yield start, self.range(start, start + rows)

    def relabelled(self, new_of: np.ndarray) -> FullVectors:
        """A new file holding record ``new_of[label]`` for every label below ``len(new_of)``
        with one >= 0 (a compaction's dense relabelling); this one is left as it is."""
        fresh = FullVectors(self.dimension, self.directory)
        for start in range(0, min(self.count, len(new_of)), BLOCK_ROWS):
            block = self.range(start, min(start + BLOCK_ROWS, len(new_of)))
            new = np.asarray(new_of[start : start + len(block)], dtype=np.int64)
            keep = np.flatnonzero(new >= 0)
            fresh.put(new[keep], block[keep])
        return fresh

    # -- in a snapshot frame ----------------------------------------------------------------
    def section(self) -> codec.Frame:
        """The vectors as a frame section, read from the file only as the frame is written
        (``u32 dimension | u64 rows | rows × dimension float32``). Records written later are
        not in it; those it covers never change (a compaction writes a new file)."""
        count = self.count
        head = self.dimension.to_bytes(4, "little") + count.to_bytes(8, "little")

        def pieces() -> Iterator[codec.Buffer]:
            for start in range(0, count, BLOCK_ROWS):
                yield self.range(start, min(count, start + BLOCK_ROWS)).data.cast("B")

        return codec.Frame([head, codec.Stream(count * 4 * self.dimension, pieces)])

    @classmethod
    def read(cls, reader: codec.Reader, nbytes: int, directory: str = "") -> FullVectors:
        """The vectors of a :meth:`section` read from ``reader``, sealed into a new file block
        by block (the plaintext is never held whole)."""
        head = bytes(reader.read(_HEADER))
        dimension, count = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:], "little")
        if len(head) != _HEADER or dimension < 1 or nbytes != _HEADER + count * 4 * dimension:
            raise ValueError("full vectors' section length does not match its header")
        out = cls(dimension, directory)
        for start in range(0, count, BLOCK_ROWS):
            n = min(BLOCK_ROWS, count - start)
            body = reader.read(n * 4 * dimension)
            if len(body) != n * 4 * dimension:
                raise ValueError("full vectors' section is shorter than its header")
            out._put_run(start, np.frombuffer(body, dtype=np.float32).reshape(n, dimension))
        return out


def rerank(
    vectors: FullVectors, queries: np.ndarray, labels: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` nearest of each query's candidates (``labels``, -1 for none) by exact squared
    L2 over their full vectors: (distances, labels, the candidates' columns they came from)."""
    nq, width = labels.shape
    dist = np.full((nq, width), np.inf, dtype=np.float32)
    valid = labels >= 0
    flat = labels[valid]
    if len(flat):
        full = vectors.get(flat)
        rows = np.repeat(np.arange(nq), valid.sum(axis=1))
        diff = full - queries[rows]
        np.square(diff, out=diff)
        dist[valid] = diff.sum(axis=1)
    col = np.argsort(dist, axis=1, kind="stable")[:, :k]
    d = np.take_along_axis(dist, col, axis=1)
    lab = np.take_along_axis(labels, col, axis=1)
    lab[~np.isfinite(d)] = -1
    return d, lab, col
