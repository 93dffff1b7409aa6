"""The query answer's JSON body, laid out by numpy, against orjson over plain dicts."""

from __future__ import annotations

import math

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.engine.strings import StringBlock
from serve_app.constants import FEW_RESULTS
from serve_app.gateway.hits import Hits
from serve_app.service.results import laid_out, results_json, shape_results

# Ids with and without characters that JSON escapes (the latter take orjson's path).
PLAIN_ID = st.text(alphabet=st.sampled_from("ab7-_:/ é中😀"), min_size=1, max_size=8)
ANY_ID = st.text(alphabet=st.sampled_from('ab7 é😀"\\\n\x00\t'), min_size=1, max_size=8)
DISTANCE = st.floats(0, 1e6, allow_nan=False, width=32)
METADATA = st.one_of(
    st.none(),
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=5), st.booleans(), st.none()),
        max_size=3,
    ),
)
METRICS = st.sampled_from(["euclidean", "squared_euclidean", "cosine"])


@st.composite
def hits(draw: st.DrawFn, ids: st.SearchStrategy[str]) -> Hits:
    """Merged top-k as the engine hands it over: ascending distances, the first counts[q]
    entries of a row filled, the rest inf with no id and no metadata."""
    rows, k = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    counts = np.array(draw(st.lists(st.integers(0, k), min_size=rows, max_size=rows)))
    dist = np.full((rows, k), np.inf, dtype=np.float32)
    id_list: list[str | None] = []
    meta = np.empty((rows, k), dtype=object)
    for q in range(rows):
        n = int(counts[q])
        dist[q, :n] = sorted(draw(st.lists(DISTANCE, min_size=n, max_size=n)))
        id_list += draw(st.lists(ids, min_size=n, max_size=n)) + [None] * (k - n)
        for j in range(n):
            m = draw(METADATA)
            meta[q, j] = None if m is None else orjson.dumps(m)
    return Hits(dist, StringBlock.from_list(id_list, (rows, k)), meta, counts)


def expected(h: Hits, metric: str, distance: bool, metadata: bool, single: bool) -> bytes:
    results = shape_results(h, metric, distance, metadata)
    return orjson.dumps({"results": results[0] if single else results})


@settings(max_examples=300, deadline=None)
@given(h=hits(PLAIN_ID), metric=METRICS, distance=st.booleans(), metadata=st.booleans())
def test_layout_is_byte_identical_to_orjson(
    h: Hits, metric: str, distance: bool, metadata: bool
) -> None:
    out = laid_out(h, metric, distance, metadata, single=False)
    assert out == expected(h, metric, distance, metadata, single=False)
    assert results_json(h, metric, distance, metadata, single=False) == out
    body = orjson.loads(out)["results"]
    assert [len(row) for row in body] == h.counts.tolist()


@settings(max_examples=100, deadline=None)
@given(h=hits(ANY_ID), metric=METRICS, distance=st.booleans(), metadata=st.booleans())
def test_ids_that_json_escapes_come_out_intact(
    h: Hits, metric: str, distance: bool, metadata: bool
) -> None:
    out = results_json(h, metric, distance, metadata, single=False)
    assert out == expected(h, metric, distance, metadata, single=False)
    assert laid_out(h, metric, distance, metadata, single=False) in (None, out)
    got = [[e["id"] for e in row] for row in orjson.loads(out)["results"]]
    want = h.ids.tolist()
    assert got == [want[q][:n] for q, n in enumerate(h.counts.tolist())]


@settings(max_examples=100, deadline=None)
@given(h=hits(PLAIN_ID), metric=METRICS, distance=st.booleans(), metadata=st.booleans())
def test_single_query_answers_one_flat_list(
    h: Hits, metric: str, distance: bool, metadata: bool
) -> None:
    one = Hits(h.distances[:1], h.ids.take_rows(np.array([0])), h.metadata[:1], h.counts[:1])  # type: ignore[index]
    out = results_json(one, metric, distance, metadata, single=True)
    assert out == expected(one, metric, distance, metadata, single=True)
    assert laid_out(one, metric, distance, metadata, single=True) == out
    assert isinstance(orjson.loads(out)["results"], list)


def test_entries_carry_the_metric_distance_and_stored_metadata() -> None:
    d2 = np.array([[4.0, 9.0, np.inf]], dtype=np.float32)
    meta = np.array([[orjson.dumps({"a": [1, "x"]}), None, None]], dtype=object)
    h = Hits(d2, StringBlock.from_list(["p", "q", None], (1, 3)), meta, np.array([2]))
    body = orjson.loads(results_json(h, "euclidean", True, True, single=True))
    assert body == {
        "results": [
            {"id": "p", "distance": 2.0, "metadata": {"a": [1, "x"]}},
            {"id": "q", "distance": 3.0, "metadata": {}},  # none stored: {} as CyborgDB
        ]
    }
    assert orjson.loads(results_json(h, "squared_euclidean", True, False, single=False)) == {
        "results": [[{"id": "p", "distance": 4.0}, {"id": "q", "distance": 9.0}]]
    }


def test_distances_keep_every_bit_of_float32() -> None:
    """A client reading a distance back into float32 gets exactly what faiss computed."""
    d = np.random.default_rng(0).random((50, 10), dtype=np.float32)
    d.sort(axis=1)
    ids = StringBlock.from_list([str(i) for i in range(500)], (50, 10))
    h = Hits(d, ids, None, np.full(50, 10))
    assert d.size > FEW_RESULTS  # laid out by numpy
    body = orjson.loads(results_json(h, "squared_euclidean", True, False, single=False))
    got = np.array([[e["distance"] for e in row] for row in body["results"]], dtype=np.float32)
    assert (got == d).all()
    assert not any(math.isnan(x) for x in got.ravel())
