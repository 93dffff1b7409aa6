"""The typed client through which a gateway reaches the control plane (actors.control.plane.
ControlPlane, a named Ray actor): each call awaited, with the control plane's own exception
raised as it was raised (not Ray's wrapper around it). Calls that report and need no answer
(:meth:`report_metrics`, :meth:`maybe_autotrain`, :meth:`save_probing`) are sent and not
awaited."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np
from ray.exceptions import RayTaskError

from actors.control.options import IndexView
from actors.control.rebalance import RebalanceReport
from actors.control.training import TrainParams
from actors.metrics import Family, ServiceReport
from actors.types import IndexConfig, IndexMeta

T = TypeVar("T")


def cause(exc: BaseException) -> BaseException:
    """The exception an actor raised, out of Ray's wrapper around it."""
    if isinstance(exc, RayTaskError) and exc.cause is not None:
        return exc.cause
    return exc


async def answer(ref: Awaitable[T]) -> T:
    """``await ref``, raising what the actor raised."""
    try:
        return await ref
    except Exception as exc:
        raise cause(exc) from None


class ControlClient:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    # -- the catalog and index views ------------------------------------------------------------
    async def list_indexes(self) -> list[str]:
        return await answer(self.handle.list_indexes.remote())

    async def lookup(self, name: str) -> IndexMeta:
        return await answer(self.handle.lookup.remote(name))

    async def view(self, name: str, data_key: bytes) -> IndexView:
        return await answer(self.handle.view.remote(name, data_key))

    async def create_index(
        self,
        meta: IndexMeta,
        data_key: bytes,
        cfg: IndexConfig,
        max_per_owner: int = 0,
        template: np.ndarray | None = None,
    ) -> None:
        await answer(self.handle.create_index.remote(meta, data_key, cfg, max_per_owner, template))

    async def template(self, name: str, data_key: bytes) -> np.ndarray | None:
        return await answer(self.handle.template.remote(name, data_key))

    async def restored(self, name: str, data_key: bytes, backup_id: str) -> IndexMeta:
        return await answer(self.handle.restored.remote(name, data_key, backup_id))

    async def delete_index(self, name: str, data_key: bytes) -> None:
        await answer(self.handle.delete_index.remote(name, data_key))

    async def set_dimension(self, name: str, data_key: bytes, dimension: int) -> IndexConfig:
        return await answer(self.handle.set_dimension.remote(name, data_key, dimension))

    # -- training and keys --------------------------------------------------------------------
    async def train(self, name: str, data_key: bytes, params: TrainParams, wait: bool) -> str:
        return await answer(self.handle.train.remote(name, data_key, params, wait))

    def maybe_autotrain(self, name: str, data_key: bytes, total: int) -> None:
        self.handle.maybe_autotrain.remote(name, data_key, total)

    async def training_status(self) -> dict[str, Any]:
        return await answer(self.handle.training_status.remote())

    async def rotate_key(
        self, name: str, data_key: bytes, salt: bytes, verifier: bytes, new_data_key: bytes
    ) -> None:
        await answer(self.handle.rotate_key.remote(name, data_key, salt, verifier, new_data_key))

    def save_probing(self, name: str, data_key: bytes, version: int, state: bytes) -> None:
        self.handle.save_probing.remote(name, data_key, version, state)

    async def rebalance(self, drain: list[str], dry_run: bool) -> RebalanceReport:
        return await answer(self.handle.rebalance.remote(drain, dry_run))

    # -- per-index users --------------------------------------------------------------------------
    async def create_user(self, name: str, data_key: bytes, rights: list[str]) -> tuple[str, str]:
        return await answer(self.handle.create_user.remote(name, data_key, rights))

    async def user_index(self, user_id: str) -> IndexMeta | None:
        return await answer(self.handle.user_index.remote(user_id))

    async def list_users(self, name: str, data_key: bytes) -> list[tuple[str, tuple[str, ...]]]:
        return await answer(self.handle.list_users.remote(name, data_key))

    async def delete_user(self, name: str, data_key: bytes, user_id: str) -> None:
        await answer(self.handle.delete_user.remote(name, data_key, user_id))

    # -- metrics --------------------------------------------------------------------------------
    def report_metrics(self, replica: str, families: list[Family]) -> None:
        self.handle.report_metrics.remote(replica, families)

    async def service_metrics(self, replica: str, families: list[Family]) -> ServiceReport:
        return await answer(self.handle.service_metrics.remote(replica, families))
