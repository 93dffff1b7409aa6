"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

SIFT_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "sift-5k.tsv"


def load_sift() -> np.ndarray:
    """The 5,000 real SIFT descriptors from ../shared/data, or skip with a clear message."""
    if not SIFT_PATH.exists():
        pytest.skip(f"SIFT sample not found at {SIFT_PATH} (it lives in the shared data directory)")
    data = np.loadtxt(SIFT_PATH, dtype=np.float32, delimiter="\t")
    return np.ascontiguousarray(data[:, :128])


def clustered(
    n: int, d: int, n_clusters: int = 100, seed: int = 0, spread: float = 0.15
) -> np.ndarray:
    """Synthetic clustered vectors: Gaussian blobs around random centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    labels = rng.integers(0, n_clusters, size=n)
    return (centres[labels] + spread * rng.normal(size=(n, d))).astype(np.float32)


def random_key() -> str:
    return np.random.default_rng().bytes(32).hex()
