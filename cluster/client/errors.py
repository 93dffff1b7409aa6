"""Typed exceptions of the Python client and the bulk driver, one per status code.

Every error carries the server's ``status_code``, ``detail`` (and ``errors`` for schema
violations), whichever transport raised it: HTTP (JSON or compact array routes) or the Ray
transport, whose server-side errors are mapped onto the same classes.
"""

from __future__ import annotations

from typing import Any


class VaultvecClientError(Exception):
    """Base class: ``status_code`` (None when no answer arrived), ``detail``, ``errors``."""

    status_code: int | None = None

    def __init__(
        self,
        detail: str,
        *,
        status_code: int | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        if status_code is not None:
            self.status_code = status_code

    def __str__(self) -> str:
        return f"{self.status_code}: {self.detail}" if self.status_code else self.detail


class AuthenticationError(VaultvecClientError):
    """401: missing or wrong API key, or wrong index_key."""

    status_code = 401


class IndexNotFoundError(VaultvecClientError):
    status_code = 404


class ConflictError(VaultvecClientError):
    """409: the request conflicts with the index's state: the name is taken
    (IndexExistsError), or the index is training or rotating its key (retry once it is done)."""

    status_code = 409


class IndexExistsError(ConflictError):
    """409 on create: an index with this name exists."""


class PayloadTooLargeError(VaultvecClientError):
    status_code = 413


class InvalidRequestError(VaultvecClientError):
    """422: invalid parameters (bad dimension, NaN, duplicate ids, bad filter, ...)."""

    status_code = 422


class ServerError(VaultvecClientError):
    """500 (or any other unexpected status): the detail carries the server's request id."""

    status_code = 500


class UnavailableError(VaultvecClientError):
    """503: a shard stayed unavailable; raised once the client's retries are spent."""

    status_code = 503


class ConnectionFailedError(VaultvecClientError):
    """No answer: connecting or reading failed on every attempt."""


BY_STATUS: dict[int, type[VaultvecClientError]] = {
    cls.status_code: cls
    for cls in (
        AuthenticationError,
        IndexNotFoundError,
        IndexExistsError,
        PayloadTooLargeError,
        InvalidRequestError,
        ServerError,
        UnavailableError,
    )
}


# What the server's 409 says when the index is busy rather than its name taken.
BUSY = "is training or rotating its key"


def error_for(
    status: int, detail: str, errors: list[dict[str, Any]] | None = None
) -> VaultvecClientError:
    """The typed exception of an error answer."""
    cls = BY_STATUS.get(status, ServerError)
    if cls is IndexExistsError and BUSY in detail:
        cls = ConflictError
    return cls(detail or f"HTTP {status}", status_code=status, errors=errors)


def from_server_exception(exc: BaseException) -> VaultvecClientError | None:
    """A server-side ``actors.errors.VaultvecError`` (as the Ray transport raises it) -> the
    client's typed exception; None for anything else."""
    cause = getattr(exc, "cause", None) or exc  # Ray wraps errors in RayTaskError(.cause)
    status = getattr(cause, "status_code", None)
    detail = getattr(cause, "detail", None)
    if isinstance(status, int) and isinstance(detail, str):
        return error_for(status, detail, getattr(cause, "errors", None))
    return None
