"""Request models: query vectors read by numpy are exactly what pydantic's strict validation
accepts (serve_app.models.read_vectors), including where numpy alone would coerce."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from serve_app.models import Matrix, QueryRequest, Vector

IDENT = {"index_name": "a", "index_key": "0" * 64}
# The field's validation without the numpy reader: what every answer must agree with.
REFERENCE = TypeAdapter(Vector | Matrix, config={"strict": True})


def read(value: Any) -> Any:
    return QueryRequest.model_validate({**IDENT, "query_vectors": value}).query_vectors


def reference(value: Any) -> Any:
    return REFERENCE.validate_python(value)


def same_outcome(value: Any) -> None:
    try:
        want = reference(value)
    except ValidationError:
        with pytest.raises(ValidationError):
            read(value)
        return
    got = read(value)
    try:
        expected = np.asarray(want, dtype=np.float64)
    except ValueError:  # ragged: left for serve_app.service.checks.as_matrix to refuse, as before
        assert got == want
        return
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), expected)


def test_a_batch_of_floats_is_read_once_into_an_array() -> None:
    x = np.random.default_rng(0).standard_normal((50, 16))
    got = read(x.tolist())
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize(
    "value",
    [
        [True, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5],  # a lone boolean among floats
        [[1.5] * 9, [2.5] * 8 + [False]],
        [1.5, "2.5"],
        [[1.5, 2.5], ["3.5", 4.5]],
        [1.5, None],
        [[1.5, [2.5]]],
        [[1.5, 2.5], [3.5]],
    ],
)
def test_what_numpy_would_coerce_is_refused_as_pydantic_refuses_it(value: Any) -> None:
    same_outcome(value)


numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 0.0, 1.0, -0.0]),
)
entries = st.one_of(numbers, numbers, numbers, st.booleans(), st.just("1"), st.none())


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(entries, min_size=1, max_size=12),
        st.lists(st.lists(entries, min_size=1, max_size=12), min_size=1, max_size=6),
    )
)
def test_any_list_is_read_exactly_as_strict_validation_reads_it(value: Any) -> None:
    same_outcome(value)
