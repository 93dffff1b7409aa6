"""What the service's operations run with in one gateway replica."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.gateway.engine import Engine
from serve_app.settings import Settings


@dataclass
class Services:
    engine: Engine  # plan, fan-out and merge; the shard and control-plane clients
    settings: Settings
    embedder: Any = None  # DeploymentHandle of the Embedder deployment (None: no text search)
