from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.storage import codec


@given(st.lists(st.one_of(st.none(), st.text(max_size=20))))
def test_strings_round_trip(items: list[str | None]) -> None:
    blob, lengths = codec.pack_strings(items)
    assert codec.unpack_strings(blob, lengths) == items


@given(st.lists(st.one_of(st.none(), st.text(alphabet=st.characters(max_codepoint=127)))))
def test_ascii_strings_round_trip(items: list[str | None]) -> None:
    """(ASCII-only blobs are decoded in one go, then sliced)"""
    blob, lengths = codec.pack_strings(items)
    assert codec.unpack_strings(blob, lengths) == items


@given(st.lists(st.one_of(st.none(), st.binary(max_size=20))))
def test_bytes_round_trip(items: list[bytes | None]) -> None:
    blob, lengths = codec.pack_strings(items)
    assert codec.unpack_strings(blob, lengths, as_bytes=True) == items


@pytest.mark.parametrize("items", [[None] * 5, (None, None), [], [None, "", None], ("", "")])
def test_nones_and_empty_strings_stay_apart(items: list[str | None]) -> None:
    blob, lengths = codec.pack_strings(items)
    assert codec.unpack_strings(blob, lengths) == list(items)
    assert lengths.tolist() == [-1 if s is None else 0 for s in items]


def test_frame_round_trip() -> None:
    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([], dtype=np.int64),
        "c": np.array([True, False]),
    }
    meta, out = codec.unpack(codec.pack({"x": 1, "y": [1, 2]}, arrays))
    assert meta == {"x": 1, "y": [1, 2]}
    for name, arr in arrays.items():
        np.testing.assert_array_equal(out[name], arr)
        assert out[name].dtype == arr.dtype and out[name].shape == arr.shape


def test_object_arrays_are_refused() -> None:
    with pytest.raises(TypeError):
        codec.pack({}, {"o": np.array(["x"], dtype=object)})


def test_truncated_frame_is_detected() -> None:
    frame = codec.pack({}, {"a": np.arange(10)})
    with pytest.raises(ValueError):
        codec.unpack(frame[:-1])
