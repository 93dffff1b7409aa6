"""What crosses Ray between the gateway and a pool actor, packed by hand (actors.pool.client): a
search request and result come back field for field, arrays with their dtype and shape and
writable, whatever the batch; a frame gives back its arguments."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from actors.engine.filters import parse_filter
from actors.engine.strings import StringBlock
from actors.pool.wire import frame, pack, unframe, unpack_request, unpack_result
from actors.types import Probing, SearchRequest, SearchResult


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    for field in dataclasses.fields(want):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            if b.dtype.hasobject:
                assert a.tolist() == b.tolist(), field.name
            else:
                np.testing.assert_array_equal(a, b, err_msg=field.name)
            assert a.flags.writeable, field.name
        elif isinstance(b, StringBlock):
            assert a.tolist() == b.tolist() and a.lens.dtype == b.lens.dtype, field.name
        else:
            assert a == b, field.name


def assert_no_defaults(obj: Any) -> None:
    """Every field differs from its default: a field the packing forgot would show."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if field.default is None:
            assert value is not None, field.name
        elif field.default is not dataclasses.MISSING:
            assert value != field.default, field.name


@pytest.mark.parametrize("nq", [0, 1, 7, 1000])
def test_a_search_request_comes_back_field_for_field(nq: int) -> None:
    rng = np.random.default_rng(nq)
    req = SearchRequest(
        rng.random((nq, 16), dtype=np.float32),
        10,
        3,
        rng.integers(-1, 50, (nq, 12)),
        rng.random((nq, 12), dtype=np.float32),
        parse_filter({"tag": {"$in": ["a", "b"]}, "n": {"$gte": 2}}),
        False,
        Probing("measure", 4, 3, (0.25, 0.5), (1.0, 1.5, 2.0), (0.0, 2.5, 0.0)),
        7,
    )
    assert_no_defaults(req)
    assert_same(unpack_request(pack(req)), req)


@pytest.mark.parametrize("nq", [0, 1, 50])
def test_a_search_result_comes_back_field_for_field(nq: int) -> None:
    rng = np.random.default_rng(nq)
    ids = StringBlock.from_list([f"id-{i}" if i % 4 else None for i in range(nq * 5)], (nq, 5))
    meta = np.empty((nq, 5), dtype=object)
    meta.ravel()[::2] = [b'{"n":%d}' % i for i in range(len(meta.ravel()[::2]))]
    result = SearchResult(
        rng.random((nq, 5), dtype=np.float32),
        ids,
        meta,
        7,
        12,
        rng.random((nq, 5)),
        2,
        333,
        rng.random((nq, 5)),
        rng.integers(0, 99, (nq, 49), dtype=np.int32),
    )
    assert_no_defaults(result)
    assert_same(unpack_result(pack(result)), result)
    plain = SearchResult(result.distances, ids, None, 1)  # no metadata, the defaults
    assert_same(unpack_result(pack(plain)), plain)


def test_a_packed_request_is_not_taken_for_a_result() -> None:
    req = SearchRequest(np.zeros((1, 2), np.float32), 1, 0, np.zeros((1, 1)), np.zeros((1, 1)))
    with pytest.raises(TypeError):
        unpack_result(pack(req))


def test_a_frame_gives_back_its_arguments() -> None:
    args = ("index:0", b"\x00" * 32, ["a", "b"], True, False, None)
    assert unframe(frame(*args)) == args
