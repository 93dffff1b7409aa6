"""Input vectors -> validated float32 matrices, and the per-metric distance conversions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.engine.ivf import MAX_NORM, too_large
from actors.errors import InvalidRequest


def as_matrix(value: Any, field: str) -> tuple[np.ndarray, bool]:
    """Parse one vector or a list of vectors; returns (matrix (n, d), was_single)."""
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (ValueError, TypeError):
        raise InvalidRequest(
            f"{field} must be a list of numbers or a list of equal-length lists of numbers"
        ) from None
    if arr.ndim == 1:
        single = True
        arr = arr[None, :]
    elif arr.ndim == 2:
        single = False
    else:
        raise InvalidRequest(f"{field} must be 1- or 2-dimensional")
    if arr.shape[1] == 0 or (not single and arr.shape[0] == 0):
        raise InvalidRequest(f"{field} is empty")
    if not np.isfinite(arr).all():
        raise InvalidRequest(f"{field} contains NaN or infinite values")
    return np.ascontiguousarray(arr), single


def check_norms(x: np.ndarray, field: str, ids: Sequence[str] | None = None) -> None:
    """422 naming the first vector whose norm exceeds MAX_NORM: faiss computes squared
    distances in float32, and such a vector's would overflow (it could never be found)."""
    bad = too_large(x)
    if len(bad):
        which = f"item {ids[bad[0]]!r}" if ids is not None else f"{field}[{bad[0]}]"
        raise InvalidRequest(
            f"{which}: the vector's norm exceeds {MAX_NORM:.3g} (squared distances must stay "
            "finite in float32)"
        )


def check_dimension(x: np.ndarray, dimension: int | None, field: str) -> None:
    if dimension is not None and x.shape[1] != dimension:
        raise InvalidRequest(
            f"{field} has dimension {x.shape[1]}, the index has dimension {dimension}"
        )


def to_index_space(x: np.ndarray, metric: str, field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Cosine indexes work on unit vectors; returns (vectors, original norms or None)."""
    if metric != "cosine":
        return x, None
    norms = np.linalg.norm(x, axis=1).astype(np.float32)
    if not (norms > 0).all():
        raise InvalidRequest(f"{field} contains a zero vector, which has no cosine distance")
    return np.ascontiguousarray(x / norms[:, None], dtype=np.float32), norms


def to_api_distance(d2: np.ndarray, metric: str) -> np.ndarray:
    """Index-space squared L2 -> the metric's reported distance."""
    d2 = np.maximum(d2, 0)
    if metric == "euclidean":
        return np.sqrt(d2)
    if metric == "cosine":
        return d2 / 2  # |a-b|^2 = 2 - 2cos(a,b) for unit vectors
    return d2
