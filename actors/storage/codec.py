"""Binary framing for everything the engine persists (before encryption).

A frame is ``u32 header length | orjson header | raw array bytes``. The header carries a small
JSON ``meta`` dict plus the name, dtype and shape of each array. Strings travel as one UTF-8
blob plus int64 lengths (-1 = None), so no pickle is ever involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson


def pack(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    specs = []
    bodies = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype == object:
            raise TypeError(f"array {name!r} has dtype object; encode strings with pack_strings")
        specs.append([name, a.dtype.str, list(a.shape)])
        bodies.append(a.tobytes())
    header = orjson.dumps({"meta": meta, "arrays": specs})
    return b"".join([len(header).to_bytes(4, "little"), header, *bodies])


def unpack(buf: bytes | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    view = memoryview(buf)
    hlen = int.from_bytes(view[:4], "little")
    header = orjson.loads(view[4 : 4 + hlen])
    pos = 4 + hlen
    arrays: dict[str, np.ndarray] = {}
    for name, dtype_str, shape in header["arrays"]:
        dtype = np.dtype(dtype_str)
        count = int(np.prod(shape)) if shape else 1
        nbytes = count * dtype.itemsize
        arrays[name] = np.frombuffer(view[pos : pos + nbytes], dtype=dtype).reshape(shape)
        pos += nbytes
    if pos != len(view):
        raise ValueError("frame length does not match its header")
    return header["meta"], arrays


def pack_strings(items: Sequence[str | bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Encode strings/bytes/None as (uint8 blob, int64 lengths with -1 for None)."""
    if isinstance(items, (list, tuple)) and items.count(None) == len(items):
        # items stored without any (metadata, contents): no per-item work
        return np.empty(0, dtype=np.uint8), np.full(len(items), -1, dtype=np.int64)
    encoded = [s.encode() if isinstance(s, str) else s for s in items]
    lengths = np.array([-1 if b is None else len(b) for b in encoded], dtype=np.int64)
    blob = b"".join(filter(None, encoded))  # None and empty entries add no bytes
    return np.frombuffer(blob, dtype=np.uint8), lengths


def unpack_strings(blob: np.ndarray, lengths: np.ndarray, *, as_bytes: bool = False) -> list[Any]:
    if not len(blob) and (lengths < 0).all():  # stored without any: no per-item work
        return [None] * len(lengths)
    raw = blob.tobytes()
    sizes = np.maximum(lengths, 0)
    ends = np.cumsum(sizes)
    spans = zip(lengths.tolist(), (ends - sizes).tolist(), ends.tolist())
    if as_bytes:
        return [None if n < 0 else raw[a:b] for n, a, b in spans]
    if raw.isascii():  # byte offsets are character offsets: decoded once
        text = raw.decode("ascii")
        return [None if n < 0 else text[a:b] for n, a, b in spans]
    return [None if n < 0 else raw[a:b].decode() for n, a, b in spans]
