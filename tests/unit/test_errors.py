"""One mapping from any exception to the API error, for every transport (serve_app.http.errors)."""

from __future__ import annotations

import logging

import pytest
from ray.exceptions import ActorDiedError

from actors.errors import IndexNotFound, InternalError, Unavailable
from serve_app.http.errors import api_error


def test_api_errors_pass_through() -> None:
    err = IndexNotFound("index 'x' not found")
    assert api_error(err) is err


def test_a_shard_outage_is_503() -> None:
    err = api_error(ActorDiedError())
    assert isinstance(err, Unavailable) and err.status_code == 503


def test_anything_else_is_a_scrubbed_500_with_a_logged_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="vaultvec.errors"):
        err = api_error(KeyError("TOP-SECRET-CONTENTS"))
    assert isinstance(err, InternalError) and err.status_code == 500
    assert "TOP-SECRET" not in err.detail and "request id" in err.detail
    request_id = err.detail.rsplit(" ", 1)[1].rstrip(")")
    [record] = caplog.records
    assert request_id in record.getMessage() and record.exc_info is not None
