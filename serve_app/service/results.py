"""The JSON body of a query answer: ``{"results": [[{"id": ..., "distance": ..., "metadata":
...}, ...], ...]}`` (or one flat list for a single query); an item stored without metadata has
``"metadata": {}`` (as CyborgDB answers).

A 1,000-query batch at top_k 10 answers with 10,000 entries. Built as dicts and handed to orjson
that costs a Python object per id, per distance and per entry; laid out here instead, the body
is one numpy gather over a source buffer that holds the literals, the ids' UTF-8 bytes, the
distances as orjson formats them and the metadata's stored JSON. The bytes are identical to
``orjson.dumps({"results": shape_results(...)})``, which remains the path for ids that JSON
would escape and for answers of a few results (a single query's), where it is the faster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from actors.engine.strings import StringBlock, gather_bytes
from actors.storage.codec import pack_strings
from serve_app import constants
from serve_app.gateway.hits import Hits
from serve_app.service.checks import to_api_distance

# Every literal of the layout in one buffer; each is addressed by (offset, length).
_LITERALS = [
    b"[",
    b"],",
    b"]",
    b",",
    b'{"id":"',
    b'"',
    b',"distance":',
    b',"metadata":',
    b"}",
    b"{}",
]
NO_METADATA_JSON = _LITERALS[-1]
_LIT_BUF = b"".join(_LITERALS)
_LIT_AT = np.cumsum([0] + [len(s) for s in _LITERALS])[:-1]
(
    ROW_OPEN,
    ROW_CLOSE_SEP,
    ROW_CLOSE,
    ENTRY_SEP,
    ID_OPEN,
    ID_CLOSE,
    DISTANCE,
    METADATA,
    ENTRY_CLOSE,
    NO_METADATA,
) = range(len(_LITERALS))


def filled(counts: np.ndarray, k: int) -> np.ndarray:
    """The (nq, k) mask of real results: a row's results are its first counts[q] entries."""
    return np.arange(k)[None, :] < counts[:, None]


def shape_results(
    hits: Hits, metric: str, with_distance: bool, with_metadata: bool
) -> list[list[dict[str, Any]]]:
    """The results as lists of dicts (orjson serialises the metadata fragments as they are)."""
    distances = to_api_distance(hits.distances, metric).tolist()
    ids = hits.ids.tolist()  # nested lists of str | None
    meta = hits.metadata.tolist() if with_metadata and hits.metadata is not None else None
    out = []
    for q, n in enumerate(hits.counts.tolist()):
        row_ids = ids[q]
        entries: list[dict[str, Any]] = [{"id": row_ids[j]} for j in range(n)]
        if with_distance:
            row_d = distances[q]
            for j in range(n):
                entries[j]["distance"] = row_d[j]
        if meta is not None:
            row_m = meta[q]
            for j in range(n):
                m = row_m[j]
                entries[j]["metadata"] = orjson.Fragment(NO_METADATA_JSON if m is None else m)
        out.append(entries)
    return out


def results_json(
    hits: Hits, metric: str, with_distance: bool, with_metadata: bool, single: bool
) -> bytes:
    """The response body ``{"results": ...}``: one list per query, or the only query's list
    when ``single``. Up to FEW_RESULTS results as dicts: for so few, the layout's numpy calls
    cost more than they save (figures: docs/performance.md)."""
    if int(hits.counts.sum()) > constants.FEW_RESULTS:
        body = laid_out(hits, metric, with_distance, with_metadata, single)
        if body is not None:
            return body
    results: Any = shape_results(hits, metric, with_distance, with_metadata)
    return orjson.dumps({"results": results[0] if single else results})


def laid_out(
    hits: Hits, metric: str, with_distance: bool, with_metadata: bool, single: bool
) -> bytes | None:
    """:func:`results_json`'s body laid out by numpy; None when an id needs JSON's escapes."""
    counts = hits.counts.astype(np.int64)
    keep = filled(counts, hits.distances.shape[1])
    ids = hits.ids.select(keep)
    if not ids.json_safe():
        return None
    meta = hits.metadata if with_metadata else None
    dist = to_api_distance(hits.distances[keep], metric) if with_distance else None
    source, columns = _entry_columns(ids, dist, None if meta is None else meta[keep].tolist())
    starts, lens = _layout(counts, columns)
    body = gather_bytes(source, starts, lens).tobytes()
    if single:
        return b'{"results":' + body + b"}"
    return b'{"results":[' + body + b"]}"


Pieces = tuple[np.ndarray, np.ndarray]  # (start, length) of one piece per entry


def _entry_columns(
    ids: StringBlock, distances: np.ndarray | None, metadata: list[bytes | None] | None
) -> tuple[np.ndarray, list[Pieces]]:
    """The source buffer (literals, ids, distances, metadata, back to back) and each entry's
    pieces in it, column by column: '{"id":"', the id, '"', then the distance and the
    metadata when given, and '}'."""
    n = len(ids.lens)
    sources = [np.frombuffer(_LIT_BUF, dtype=np.uint8), ids.blob]
    id_at = len(_LIT_BUF) + ids.starts()
    base = len(_LIT_BUF) + len(ids.blob)
    columns = [_literal(ID_OPEN, n), (id_at, ids.lens.astype(np.int64)), _literal(ID_CLOSE, n)]
    if distances is not None:
        at, lens, buf = _numbers(distances)
        sources.append(buf)
        columns += [_literal(DISTANCE, n), (at + base, lens)]
        base += len(buf)
    if metadata is not None:
        buf, lens = pack_strings(metadata)  # stored JSON; -1: none, written {}
        none = lens < 0
        at = np.where(none, _LIT_AT[NO_METADATA], np.cumsum(np.maximum(lens, 0)) - lens + base)
        sources.append(buf)
        columns += [_literal(METADATA, n), (at, np.where(none, len(NO_METADATA_JSON), lens))]
    columns.append(_literal(ENTRY_CLOSE, n))
    return np.concatenate(sources), columns


def _layout(counts: np.ndarray, columns: list[Pieces]) -> Pieces:
    """Every piece of the body in order: per row "[", its entries ("," between them, then
    the columns), then "]," ("]" after the last row)."""
    n_rows, n, per_entry = len(counts), int(counts.sum()), len(columns) + 1
    lit_at = _LIT_AT
    before = np.cumsum(counts) - counts  # entries in earlier rows
    row_at = 2 * np.arange(n_rows) + per_entry * before  # index of each row's "["
    starts = np.empty(2 * n_rows + per_entry * n, dtype=np.int64)
    lens = np.empty_like(starts)
    starts[row_at] = lit_at[ROW_OPEN]
    lens[row_at] = 1
    close = row_at + 1 + per_entry * counts
    starts[close] = lit_at[ROW_CLOSE_SEP]
    lens[close] = 2
    if n_rows:  # the last row's "]" has no separator after it
        starts[close[-1]] = lit_at[ROW_CLOSE]
        lens[close[-1]] = 1
    row_of = np.repeat(np.arange(n_rows), counts)
    j = np.arange(n) - before[row_of]  # position of each entry within its row
    first = row_at[row_of] + 1 + per_entry * j  # index of each entry's separator piece
    starts[first] = lit_at[ENTRY_SEP]
    lens[first] = np.where(j > 0, 1, 0)
    for c, (col_at, col_len) in enumerate(columns, start=1):
        starts[first + c] = col_at
        lens[first + c] = col_len
    return starts, lens


def _literal(which: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(n, _LIT_AT[which]), np.full(n, len(_LITERALS[which]))


def _numbers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each value's text as orjson writes the Python float (the double nearest it): offsets and
    lengths into the returned buffer."""
    text = orjson.dumps(values.astype(np.float64), option=orjson.OPT_SERIALIZE_NUMPY)
    buf = np.frombuffer(text, dtype=np.uint8)
    if len(values) == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, buf
    commas = np.flatnonzero(buf == ord(","))
    at = np.concatenate(([1], commas + 1))
    ends = np.concatenate((commas, [len(buf) - 1]))
    return at, ends - at, buf
