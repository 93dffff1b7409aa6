"""The base64 codec of the batch routes (serve_app.routes.batches): a matrix travels as base64
of its little-endian float32 bytes, row-major, with its ``[rows, dimension]`` shape or its
dimension alone."""

from __future__ import annotations

import binascii
from collections.abc import Sequence

import numpy as np
import pybase64

from actors.errors import InvalidRequest
from serve_app.service.checks import as_matrix

F32 = np.dtype("<f4")


def decode_matrix(data: str, shape: Sequence[int], field: str) -> np.ndarray:
    """base64 little-endian float32 + [rows, dim] -> a validated (rows, dim) float32 matrix."""
    rows, dim = int(shape[0]), int(shape[1])
    if rows < 1 or dim < 1:
        raise InvalidRequest(f"{field}: shape must be [rows >= 1, dimension >= 1]")
    return decode_rows(data, rows, dim, field, f"shape {[rows, dim]} of float32 needs")


def decode_rows(
    data: str, rows: int | None, dim: int, field: str, need: str | None = None
) -> np.ndarray:
    """base64 little-endian float32 with ``dim`` columns -> a validated (rows, dim) matrix;
    ``rows`` None: as many as the bytes hold (at least one)."""
    try:
        raw = pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{field} is not valid base64") from None
    row_bytes = dim * 4
    if rows is None:
        rows = len(raw) // row_bytes if len(raw) % row_bytes == 0 else -1
    if rows < 1 or len(raw) != rows * row_bytes:
        if rows < 1:
            need = f"a whole number of rows (at least one) of {row_bytes} bytes"
        else:
            need = f"{need or f'{rows} rows of {dim} float32 need'} {rows * row_bytes}"
        raise InvalidRequest(f"{field} holds {len(raw)} bytes; {need}")
    x, _ = as_matrix(np.frombuffer(raw, dtype=F32).reshape(rows, dim), field)
    return x


def encode_matrix(x: np.ndarray) -> str:
    return pybase64.b64encode_as_string(np.ascontiguousarray(x, dtype=F32).tobytes())
