"""Helpers shared by the tests and the benchmarks: plain functions, no pytest.

The benchmarks (``benchmarks/<name>.py``, run from the repository root) import this module
through ``benchmarks/common.py``, which puts the repository root on ``sys.path``; so it imports
nothing but numpy and the standard library.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from cluster import fastpath

SIFT_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "sift-5k.tsv"
METRICS = ("euclidean", "squared_euclidean", "cosine")


# -- data -----------------------------------------------------------------------------------
def clustered(
    n: int, d: int, n_clusters: int = 100, seed: int = 0, spread: float = 0.15
) -> np.ndarray:
    """Synthetic clustered vectors: Gaussian blobs around random centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    labels = rng.integers(0, n_clusters, size=n)
    return (centres[labels] + spread * rng.normal(size=(n, d))).astype(np.float32)


def write_fvecs(path: Path, x: np.ndarray) -> None:
    """``x`` as an .fvecs file (per vector: int32 dimension, then float32 values), the format
    the bulk driver reads (cluster.bulk.files.read_fvecs)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    out = np.empty((len(x), x.shape[1] + 1), dtype="<i4")
    out[:, 0] = x.shape[1]
    out[:, 1:] = x.view("<i4")
    out.tofile(path)


def load_sift(path: Path = SIFT_PATH) -> np.ndarray | None:
    """The 5,000 real SIFT descriptors (128 values per row; the file's id column dropped), or
    None when the file is absent: it lives in the shared data directory, outside the repository.
    Callers report the missing ``path`` (a test skips, a benchmark prints SKIP)."""
    if not path.exists():
        return None
    data = np.loadtxt(path, dtype=np.float32, delimiter="\t")
    return np.ascontiguousarray(data[:, :128])


# -- exact search ---------------------------------------------------------------------------
def exact_knn(
    data: np.ndarray, queries: np.ndarray, k: int, metric: str = "euclidean", chunk: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force k nearest rows of ``data`` for each query (one vector or a batch):
    (distances float64, row numbers int64), both (nq, min(k, n)), ascending, ties in row order.

    ``metric`` as the API defines it: euclidean, squared_euclidean or cosine (1 - cosine
    similarity). Candidates come from a BLAS product (fast at benchmark sizes); the returned
    distances are recomputed from the differences in float64, so they and the order are exact.
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {METRICS}")
    x = np.asarray(data, dtype=np.float64)
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    if metric == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
    n, k = len(x), min(k, len(x))
    out_d = np.empty((len(q), k), dtype=np.float64)
    out_i = np.empty((len(q), k), dtype=np.int64)
    if k == 0:
        return out_d, out_i
    pool = min(n, 2 * k + 16)  # margin for the rounding of the product's ranking
    xx = (x * x).sum(axis=1)
    for start in range(0, len(q), chunk):
        qq = q[start : start + chunk]
        if pool < n:
            approx = xx[None, :] - 2.0 * (qq @ x.T)  # + |q|^2 leaves each row's order alone
            cand = np.argpartition(approx, pool - 1, axis=1)[:, :pool]
        else:
            cand = np.broadcast_to(np.arange(n), (len(qq), n))
        if metric == "cosine":
            d = 1.0 - (qq[:, None, :] * x[cand]).sum(-1)
        else:
            d = ((qq[:, None, :] - x[cand]) ** 2).sum(-1)
        order = np.lexsort((cand, d))[:, :k]  # by distance, then by row number
        out_d[start : start + chunk] = np.take_along_axis(d, order, axis=1)
        out_i[start : start + chunk] = np.take_along_axis(cand, order, axis=1)
    if metric == "euclidean":
        np.sqrt(out_d, out=out_d)
    return out_d, out_i


# -- processes ------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, out of the kernel's
    ephemeral range (cluster.fastpath.free_port): the processes a test starts cannot take it
    for their own connections before the test's server binds it."""
    return fastpath.free_port()


@contextlib.contextmanager
def ray_tmpdir(prefix: str, **env: str) -> Iterator[str]:
    """A RAY_TMPDIR of its own for a Ray started in this block, plus ``env``; afterwards the
    variables are restored and the directory (sockets, session logs) removed. The path stays
    short: Unix socket paths under it are limited to 108 bytes."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    values = {"RAY_TMPDIR": path, **env}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(path, ignore_errors=True)


def run_threads(target: Callable[[int], object], n: int) -> None:
    """Run ``target(0), ..., target(n - 1)`` on ``n`` threads at once; fail on any error."""
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
