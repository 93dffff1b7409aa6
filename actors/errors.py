"""The one error hierarchy of vaultvec.

Every layer raises these; the HTTP layer maps ``status_code`` to the response and uses
``detail`` as the message. Messages never carry a key, a vector or item contents.
Ray wraps exceptions raised inside actors in ``RayTaskError`` subclasses that still inherit
from the original class, so ``except VaultvecError`` works across actor calls.
"""

from __future__ import annotations

from typing import Any


class VaultvecError(Exception):
    status_code = 500
    default_detail = "internal error"

    def __init__(self, detail: str | None = None, *, errors: list[dict[str, Any]] | None = None):
        self.detail = detail or self.default_detail
        self.errors = errors
        super().__init__(self.detail)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep detail/errors when the exception crosses a process boundary (Ray pickles it).
        return (_rebuild, (type(self), self.detail, self.errors))


def _rebuild(
    cls: type[VaultvecError], detail: str, errors: list[dict[str, Any]] | None
) -> VaultvecError:
    return cls(detail, errors=errors)


class InvalidRequest(VaultvecError):
    status_code = 422
    default_detail = "invalid request"


class Unauthorized(VaultvecError):
    status_code = 401
    default_detail = "invalid or missing credentials"


class Forbidden(VaultvecError):
    status_code = 403
    default_detail = "these credentials may not do that"


class IndexNotFound(VaultvecError):
    status_code = 404
    default_detail = "index not found"


class UserNotFound(VaultvecError):
    status_code = 404
    default_detail = "user not found"


class IndexExists(VaultvecError):
    status_code = 409
    default_detail = "index already exists"


class IndexRestoring(VaultvecError):
    status_code = 409
    default_detail = "the index is being restored from a backup"


class PayloadTooLarge(VaultvecError):
    status_code = 413
    default_detail = "request body too large"


class Unavailable(VaultvecError):
    status_code = 503
    default_detail = "a shard is unavailable; retry later"


class IndexRetired(Unavailable):
    """Raised by a shard of a deleted index: the caller's view of the index is out of date."""

    default_detail = "the index was deleted or re-created while the request ran; retry"


class PartitionMoved(IndexRetired):
    """Raised by a pool actor for a partition that moved to another actor (actors.control.
    rebalance): the caller's view of the index is out of date."""

    default_detail = "a partition of the index moved while the request ran; retry"


class InternalError(VaultvecError):
    status_code = 500


class DecryptError(VaultvecError):
    """A stored blob failed authentication: wrong key, tampering, or a blob moved elsewhere."""

    status_code = 500
    default_detail = "stored data failed authentication"
