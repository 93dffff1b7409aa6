"""The control plane's metrics (actors.metrics): the series gateways push, the whole
service's for a scrape, and the catalog's own. actors.control.plane.ControlPlane inherits
them."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.control.catalog import Catalog
from actors.errors import VaultvecError
from actors.metrics import INDEX_ID, ControlMetrics, Family, ServiceReport, gauge, keyed
from actors.pool.placement import Pool


class PlaneMetrics:
    pool: Pool
    _lock: threading.RLock
    _catalog: Catalog
    _training: dict[str, Any]

    # -- metrics (actors.metrics) -----------------------------------------------------------
    def report_metrics(self, replica: str, families: list[Family]) -> None:
        """A gateway replica's series, pushed every few seconds."""
        self._metrics().gateway(replica, families)

    def service_metrics(
        self, replica: str, families: list[Family], timeout_s: float = 10.0
    ) -> ServiceReport:
        """The whole service's series for a scrape at gateway ``replica`` (whose own series
        come along): the other gateways' latest, the control plane's, every pool actor's."""
        state = self._metrics()
        state.gateway(replica, families)
        try:
            handles = [self.pool.handle(a) for a in self.pool.members()]
        except VaultvecError:  # the pool cannot start: report the rest
            handles = []
        refs = [h.metrics.remote() for h in handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        pools = []
        for ref in ready:
            with contextlib.suppress(RayActorError):
                pools.append(ray.get(ref))
        with self._lock:
            names = {meta.index_id: name for name, meta in self._catalog.items()}
        return ServiceReport(
            state.gateways_except(replica),
            state.registry.snapshot(),
            pools,
            names,
            len(refs) - len(pools),
        )

    def _metrics(self) -> ControlMetrics:
        """Created on first use (a gateway's first report, or a training's end)."""
        with self._lock:
            state: ControlMetrics | None = self.__dict__.get("_metrics_state")
            if state is None:
                state = self._metrics_state = ControlMetrics(self._catalog_metrics)
            return state

    def _catalog_metrics(self) -> list[Family]:
        with self._lock:
            shards = {meta.index_id: len(meta.placement) for meta in self._catalog.values()}
            running = {self._catalog[n].index_id for n in self._training if n in self._catalog}
        return [
            gauge(
                "vaultvec_index_shards", "partitions (shards) per index", (INDEX_ID,), keyed(shards)
            ),
            gauge(
                "vaultvec_index_training",
                "1 while the index is training",
                (INDEX_ID,),
                {(i,): float(i in running) for i in shards},
            ),
        ]
