"""CyborgDB's storage_precision tiers: how a create request maps each onto vaultvec's types,
what describe reports back, the faiss codes each tier's partitions keep (bytes a vector) and
what automatic probing's calibration aims at with them."""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np
import pytest

from actors.control.training import TrainParams, calibrate_nprobe, train_template
from actors.engine.ivf import PartitionIndex, deserialize, new_ivf, serialize
from actors.errors import InvalidRequest
from actors.types import IndexConfig
from serve_app.models import CreateIndexRequest, IndexConfigIn
from serve_app.service.indexes import PRECISIONS, precision_of, resolve_type
from tests.helpers import clustered

# tier -> (vaultvec index type, sq_bits, bits a dimension the codes take)
TIERS = {
    "float32": ("ivfflat", None, 32),
    "float16": ("ivf", 16, 16),
    "tq12": ("ivf", 12, 16),  # faiss has no 12-bit quantizer: fp16 codes
    "tq8": ("ivf", 8, 8),
    "tq6": ("ivf", 6, 6),
    "tq4": ("ivf", 4, 4),
}


def resolve(**body: Any) -> tuple[str, int | None, int | None, int | None]:
    request = CreateIndexRequest.model_validate({"index_name": "i", "index_key": None, **body})
    return resolve_type(request, request.index_config or IndexConfigIn.model_validate({}))


def config(index_type: str, sq_bits: int | None) -> IndexConfig:
    return IndexConfig("i", "id", index_type, "euclidean", 1, 128, sq_bits=sq_bits)


def test_every_tier_is_mapped() -> None:
    assert set(PRECISIONS) == set(TIERS)


@pytest.mark.parametrize("tier", TIERS)
def test_resolve_type_maps_each_tier(tier: str) -> None:
    index_type, sq_bits, _ = TIERS[tier]
    want = (index_type, None, None, sq_bits)
    assert resolve(storage_precision=tier) == want
    assert resolve(storage_precision=tier, index_type="diskivf") == want
    assert precision_of(config(index_type, sq_bits)) == tier


def test_diskivf_alone_is_float32() -> None:
    assert resolve(index_type="diskivf") == ("ivfflat", None, None, None)


def test_describe_names_the_tier_of_types_created_without_one() -> None:
    assert precision_of(config("ivf", None)) == "tq8"  # ivfsq's default: 8-bit codes
    assert precision_of(config("ivf", 16)) == "float16"
    assert precision_of(config("ivfpq", None)) is None


@pytest.mark.parametrize("tier", ["tq4", "float16"])
def test_precision_is_only_for_diskivf(tier: str) -> None:
    with pytest.raises(InvalidRequest, match="storage_precision applies only to diskivf"):
        resolve(storage_precision=tier, index_type="ivfsq")


@pytest.mark.parametrize("sq_bits", [4, 6, 12, 0, 32])
def test_public_sq_bits_stay_8_or_16(sq_bits: int) -> None:
    """The tiers' bit widths are reached through storage_precision only."""
    with pytest.raises(InvalidRequest, match="must be 8 or 16"):
        resolve(index_config={"type": "ivfsq", "sq_bits": sq_bits})


@pytest.mark.parametrize("sq_bits", [8, 16])
def test_public_sq_bits(sq_bits: int) -> None:
    assert resolve(index_config={"type": "ivfsq", "sq_bits": sq_bits}) == (
        "ivf",
        None,
        None,
        sq_bits,
    )


def test_an_unknown_sq_bits_is_refused_by_the_engine() -> None:
    with pytest.raises(InvalidRequest, match="sq_bits 5"):
        new_ivf("ivf", 16, 4, None, None, 5)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return clustered(3000, 128, n_clusters=20, seed=5)


@pytest.mark.parametrize("tier", TIERS)
def test_a_partition_of_each_tier_keeps_codes_of_its_bits(tier: str, data: np.ndarray) -> None:
    """d=128: float32 512 B a vector, float16 and tq12 256, tq8 128, tq6 96, tq4 64; the codes
    survive the snapshot and still find each stored vector first."""
    index_type, sq_bits, bits = TIERS[tier]
    d = data.shape[1]
    template = train_template(data, index_type, 16, None, None, TrainParams(), sq_bits=sq_bits)
    assert template.code_size == math.ceil(d * bits / 8)
    template = deserialize(serialize(template))  # as the control plane stores it
    assert template.code_size == math.ceil(d * bits / 8)
    part = PartitionIndex(template)
    labels = np.arange(len(data), dtype=np.int64)
    part.add(labels, data)
    q = data[:50]
    coarse, lists = part.assign(q, part.nlist)
    _, found = part.search(q, 1, lists, coarse, None)
    assert (found[:, 0] == labels[:50]).mean() >= 0.95
    error = np.abs(part.reconstruct(labels[:50]) - q).max() / np.abs(q).max()
    assert error < {32: 1e-6, 16: 1e-3, 8: 0.02, 6: 0.05, 4: 0.2}[bits]


@pytest.mark.parametrize("sq_bits", [16, 8, 6, 4])
def test_calibration_aims_at_what_the_codes_find(sq_bits: int) -> None:
    """The calibrated n_probes reach the target share of what probing every list finds with
    the index's own codes, on queries calibration did not see; 4-bit codes, whose every-list
    recall is far below 1, do not fall back to probing every list."""
    data = clustered(3200, 32, n_clusters=30, seed=3, spread=0.5)
    x, q = data[:3000], data[3000:]
    template = train_template(x, "ivf", 40, None, None, TrainParams(max_iters=8), sq_bits=sq_bits)
    table = dict(calibrate_nprobe(template, x, 0.95))
    assert max(table.values()) < template.nlist
    index = faiss.clone_index(template)
    index.add(x)
    index.nprobe = template.nlist
    _, every = index.search(q, 10)
    index.nprobe = table[10]
    _, found = index.search(q, 10)
    share = np.mean([len(np.intersect1d(f, e)) for f, e in zip(found, every)]) / 10
    assert share >= 0.93
