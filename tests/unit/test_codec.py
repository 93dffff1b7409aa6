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


pieces_st = st.lists(st.binary(max_size=40), max_size=8)


@given(pieces_st, st.integers(1, 50))
def test_a_frame_splits_into_chunks_of_the_size_asked(pieces: list[bytes], size: int) -> None:
    frame = codec.Frame(pieces)
    chunks = [bytes(c) for c in frame.chunks(size)]
    assert b"".join(chunks) == b"".join(pieces) == frame.tobytes()
    assert len(chunks) == max(1, -(-frame.nbytes // size))
    assert all(len(c) == size for c in chunks[:-1])
    spans = [b"".join(p) for p in frame.chunk_pieces(size)]
    assert spans == chunks


@given(st.integers(1, 64), st.integers(0, 30), st.integers(1, 40))
def test_a_frame_reads_back_from_any_chunking(rows: int, n: int, size: int) -> None:
    """A frame read chunk by chunk (chunks of any size, arrays spanning them) gives what
    one buffer gives; an array read by its own reader gets exactly its bytes."""
    arrays = {
        "a": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
        "b": np.arange(n, dtype=np.int64),
    }
    raw = codec.Frame([bytes(range(n))])
    frame = codec.pack_frame({"m": n}, {**arrays, "raw": raw, "c": np.array([True, False])})
    whole = frame.tobytes()
    seen: list[bytes] = []

    def own(reader: codec.Reader, nbytes: int) -> int:
        seen.append(bytes(reader.read(nbytes)))
        return nbytes

    for copy in (False, True):
        seen.clear()
        meta, out = codec.unpack_stream(codec.Reader(frame.chunks(size)), {"raw": own}, copy=copy)
        assert meta == {"m": n} and out["raw"] == n and seen == [bytes(range(n))]
        ref = codec.unpack(whole)[1]
        for name in ("a", "b", "c"):
            np.testing.assert_array_equal(out[name], ref[name])
            assert out[name].dtype == ref[name].dtype


def test_a_frame_with_a_chunk_missing_is_refused() -> None:
    frame = codec.pack_frame({}, {"a": np.arange(100)})
    chunks = [bytes(c) for c in frame.chunks(64)]
    with pytest.raises(ValueError):
        codec.unpack_stream(codec.Reader(chunks[:-1]))
    with pytest.raises(ValueError):
        codec.unpack_stream(codec.Reader([*chunks, b"x"]))


def test_a_read_past_the_end_consumes_what_was_left() -> None:
    """A short read at the end is not handed out twice (faiss keeps reading after one)."""
    for chunks in ([b"abc"], [b"ab", b"c"]):
        reader = codec.Reader(chunks)
        assert bytes(reader.read(1)) == b"a"
        assert bytes(reader.read(5)) == b"bc"
        assert bytes(reader.read(1)) == b""
        assert reader.at_end()
