"""Service settings, owned by the HTTP side (the runtime and CLI hand them down): environment
variables ``VAULTVEC_*`` (or CLI flags that set them).

Secrets are never defaulted: API keys come from ``VAULTVEC_API_KEY`` (comma-separated for
several keys), from the file ``VAULTVEC_API_KEY_FILE`` names, or, when none is configured, from a
key generated on first start and kept in the data directory (see ``cluster.runtime``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from actors.control.options import EngineOptions
from serve_app.access import keys

# The engine's defaults: the settings that configure it take theirs from here (written once).
ENGINE = EngineOptions(store_url="")


class Quota(BaseModel):
    """Limits of one API key (0 = none); a field left out takes the service-wide setting."""

    model_config = ConfigDict(extra="forbid")

    rate_limit_rps: float | None = Field(None, ge=0)
    rate_limit_burst: int | None = Field(None, ge=0)
    max_indexes_per_key: int | None = Field(None, ge=0)
    max_items_per_index: int | None = Field(None, ge=0)


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one API key."""

    rate_limit_rps: float
    rate_limit_burst: int
    max_indexes_per_key: int
    max_items_per_index: int


NO_LIMITS = Limits(
    rate_limit_rps=0, rate_limit_burst=1, max_indexes_per_key=0, max_items_per_index=0
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VAULTVEC_", extra="ignore")

    api_key: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    api_key_file: str | None = Field(
        None, description="read the API key(s) from this file (one per line or comma-separated)"
    )
    # Quotas per API key (serve_app/access/limits.py; docs/security.md, Quotas). 0 = no limit.
    rate_limit_rps: float = Field(
        0,
        ge=0,
        description="requests per second one API key may send (a token bucket; over it: 429 "
        "with Retry-After); each gateway replica takes its share; 0 = no limit",
    )
    rate_limit_burst: int = Field(
        0, ge=0, description="requests above the rate a key may send at once; 0 = one second's"
    )
    max_indexes_per_key: int = Field(
        0, ge=0, description="indexes one API key may create and hold; 0 = no limit"
    )
    max_items_per_index: int = Field(
        0, ge=0, description="items an upsert with one API key may grow an index to; 0 = no limit"
    )
    quotas: Annotated[dict[str, Quota], NoDecode] = Field(
        default_factory=dict,
        description='per API key name, limits of its own: JSON, e.g. {"batch": '
        '{"rate_limit_rps": 5, "max_items_per_index": 1000000}}',
    )
    audit_log: str = Field(
        "auto",
        description="where the audit log goes (serve_app/audit.py): a file path, stdout, off, or "
        "auto (audit.jsonl in the data directory with a directory store, else the gateway's "
        "standard output)",
    )
    audit_log_max_bytes: int = Field(
        100 << 20, ge=1024, description="an audit log file past this is rotated"
    )
    audit_log_backups: int = Field(5, ge=0, description="rotated audit log files kept")
    storage: str = "file://./vaultvec-data"
    host: str = "127.0.0.1"
    port: int = 8000
    ray_address: str | None = None
    serve_fast_path: bool = Field(
        True,
        description="`vaultvec serve` starts Serve with HAProxy ingress and its throughput mode "
        "(cluster/fastpath.py); false keeps Serve's stock Python proxy",
    )
    ray_metrics_export: bool = Field(
        False,
        description="a local Ray started by `vaultvec serve` exports Ray's and vaultvec's series "
        "on Ray's per-node Prometheus port (on loopback, answering any local user); off, "
        "GET /v1/metrics serves vaultvec's (API key). Ray clusters you start keep their own",
    )
    tls_cert: str | None = Field(
        None,
        description="serve HTTPS with this certificate (PEM, the chain after the server's own); "
        "with tls_key",
    )
    tls_key: str | None = Field(None, description="the private key of tls_cert (PEM)")
    local_ray_monitors: bool = Field(
        False,
        description="a local Ray started by `vaultvec serve` also runs Ray's autoscaler monitor "
        "(for `ray status`) and log monitor, which vaultvec does not use",
    )

    shards: int = Field(
        0,
        ge=0,
        le=256,
        description="shards per new index; 0 = one per Ray node with CPUs",
    )
    gateway_replicas: int = Field(1, ge=1)
    gateway_max_replicas_per_node: int = Field(
        0, ge=0, description="spread gateway replicas over nodes; 0 = no limit"
    )
    gateway_num_cpus: float = 0.25
    # Requests one gateway replica takes in at once (async: cheap); more than the slow clients
    # that may be mid-body before the body deadline cuts them off.
    gateway_max_ongoing_requests: int = Field(256, ge=1)
    gateway_threads: int = Field(
        0, ge=0, description="faiss threads for the coarse quantizer; 0 = the Ray node's CPUs"
    )
    shard_num_cpus: float = Field(
        ENGINE.shard_num_cpus, ge=0, description="CPU reserved per shard pool actor"
    )
    shard_threads: int = Field(
        ENGINE.shard_threads,
        ge=0,
        description="faiss threads a shard searches a batch of 32 or more queries with (smaller "
        "ones: 1); 0 = the Ray node's CPUs",
    )
    pool_size: int = Field(
        ENGINE.pool_size, ge=0, description="shard pool actors per node; 0 = one per CPU"
    )
    shard_max_concurrency: int = Field(
        ENGINE.shard_max_concurrency,
        ge=1,
        description="partition calls one shard pool actor runs at once (one thread each); more "
        "wait in its queue",
    )
    pool_memory_budget_mb: int = Field(
        ENGINE.pool_memory_budget_mb,
        ge=0,
        description="resident memory per shard pool actor above which the least recently used "
        "partitions are unloaded; 0 = its share of the memory Ray may use on the node",
    )
    control_num_cpus: float = 0.1
    train_threads: int = Field(
        ENGINE.train_threads,
        ge=0,
        description="faiss threads for training; 0 = the Ray node's CPUs",
    )

    auto_train_threshold: int = Field(ENGINE.auto_train_threshold, ge=1)
    retrain_factor: float = Field(ENGINE.retrain_factor, gt=1)
    recall_target: float = Field(ENGINE.recall_target, gt=0, le=1)
    recall_sample_share: float = Field(
        0.01,
        ge=0,
        le=1,
        description="share of automatically probed queries also answered exactly in the "
        "background to measure recall (serve_app/gateway/probing.py); 0 = never",
    )
    train_wait_s: float = Field(ENGINE.train_wait_s, gt=0)
    wal_max_records: int = Field(ENGINE.wal_max_records, ge=1)
    snapshot_chunk_mb: int = Field(
        ENGINE.snapshot_chunk_mb,
        ge=1,
        le=1000,
        description="a shard snapshot larger than this is stored in chunks of this many MiB",
    )
    vector_dir: str = Field(
        ENGINE.vector_dir,
        description="directory where ivf/ivfpq partitions keep their full vectors for "
        "reranking, sealed, in unnamed files; empty: the system's temporary directory",
    )
    idle_ttl_s: float = Field(
        ENGINE.idle_ttl_s, ge=0, description="unload partitions idle this long; 0 = never"
    )
    rebalance_check_s: float = Field(
        ENGINE.rebalance_check_s,
        ge=0,
        description="seconds between checks for a Ray node that joined; partitions then move "
        "onto it (vaultvec rebalance); 0 = only when asked",
    )

    max_top_k: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(256 << 20, ge=1024)
    # Slow clients: a body must keep arriving (no gap over body_idle_timeout_s) and, past that
    # grace, at body_min_rate bytes/s on average, or the request ends with 408.
    body_idle_timeout_s: float = Field(10.0, gt=0, description="longest gap in a request body")
    body_min_rate: int = Field(16_384, ge=0, description="bytes/s a body must average")
    # Serve's HTTP proxy: end-to-end request timeout (above train_wait_s: /train waits that
    # long) and how long an idle keep-alive connection stays open.
    http_request_timeout_s: float = Field(660.0, gt=0)
    http_keep_alive_timeout_s: int = Field(
        75,
        ge=5,
        description="how long an idle keep-alive connection stays open, at the ingress and at "
        "each gateway replica's own server (HAProxy closes its idle connections to the "
        "replicas well before: cluster/haproxy_guard.py); longer than common clients keep "
        "idle connections, so that the client closes first",
    )
    # Request limits (each a 422 naming it when exceeded; docs/api.md lists them).
    max_ids_per_request: int = Field(100_000, ge=1, description="ids in one get or delete")
    max_items_per_upsert: int = Field(100_000, ge=1, description="items in one upsert")
    max_id_length: int = Field(1024, ge=1, description="characters in an item id")
    max_metadata_bytes: int = Field(65_536, ge=2, description="one item's metadata as JSON")
    max_metadata_depth: int = Field(32, ge=1, description="nesting levels of one item's metadata")
    max_contents_bytes: int = Field(1 << 20, ge=1, description="one item's contents, UTF-8")
    max_indexes: int = Field(ENGINE.max_indexes, ge=1, description="indexes the service holds")
    metrics_public: bool = Field(
        False, description="serve GET /v1/metrics without the API key (for a Prometheus scrape)"
    )
    metrics_index_labels: bool = Field(
        False,
        description="label per-index series of GET /v1/metrics with the index name; off, they "
        "are summed over the indexes (names can be sensitive)",
    )
    local_channel: bool = Field(
        True,
        description="a gateway sends searches and small gets to the pool actors on its own "
        "Ray node over a private Unix socket rather than through Ray (actors/pool/channel.py)",
    )
    shard_retries: int = Field(3, ge=0)
    shard_timeout_s: float = Field(300.0, gt=0, description="budget for one shard call")

    # Text embeddings (serve_app/embedder.py; models need the `embeddings` extra).
    embedding_models: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="extra models: name -> local sentence-transformers directory "
        '(JSON object, or "name=/dir,name2=/dir2")',
    )
    embedder_replicas: int = Field(
        1, ge=1, description="most Embedder replicas (Serve adds them under text load)"
    )
    embedder_min_replicas: int = Field(
        0,
        ge=0,
        description="Embedder replicas kept running without text requests; 0 = the first "
        "starts (and loads its model) on the first text request",
    )
    embedder_idle_s: float = Field(
        3600.0,
        ge=0,
        description="after this long without text requests the Embedder scales down to "
        "embedder_min_replicas, freeing its model",
    )
    embedder_num_cpus: float = Field(0.5, ge=0, description="CPU reserved per Embedder replica")
    embedder_threads: int = Field(
        0, ge=0, description="torch threads per Embedder; 0 = the Ray node's CPUs"
    )
    embedder_max_batch_size: int = Field(32, ge=1, description="text queries per model call")
    embedder_batch_wait_s: float = Field(
        0.002, ge=0, description="an idle model waits this long for more text queries"
    )
    embedder_encode_batch: int = Field(64, ge=1, description="sentences per forward pass")
    embedder_preload: bool = Field(
        False, description="load the default model when a replica starts, not on first use"
    )

    @field_validator("embedder_min_replicas")
    @classmethod
    def _min_within_max(cls, value: int, info: ValidationInfo) -> int:
        most = info.data.get("embedder_replicas", value)
        if value > most:
            raise ValueError(f"embedder_min_replicas {value} > embedder_replicas {most}")
        return value

    @field_validator("storage")
    @classmethod
    def _absolute_storage(cls, value: str) -> str:
        """Resolve a relative directory store now: Ray workers run in other directories."""
        if "://" in value and not value.startswith("file://"):
            return value
        path = value.removeprefix("file://")
        return "file://" + str(Path(path).expanduser().resolve())

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        """Absolute (Ray's processes run in other directories) and readable now, not at the
        first HTTPS handshake."""
        if value is None:
            return None
        path = Path(value).expanduser().resolve()
        try:
            path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        return str(path)

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        return self

    def url(self) -> str:
        """The base URL this machine reaches the service at."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}"

    def tls_env(self) -> dict[str, str]:
        """The certificate's paths as the environment of HAProxy's guard expects them."""
        if self.tls_cert is None or self.tls_key is None:
            return {}
        return {"VAULTVEC_TLS_CERT": self.tls_cert, "VAULTVEC_TLS_KEY": self.tls_key}

    def tls_options(self) -> dict[str, str]:
        """Serve's HTTPOptions for HTTPS (its own proxy; HAProxy takes them from the
        environment, cluster.haproxy_guard)."""
        if self.tls_cert is None or self.tls_key is None:
            return {}
        return {"ssl_certfile": self.tls_cert, "ssl_keyfile": self.tls_key}

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @model_validator(mode="after")
    def _keys_from_file(self) -> Settings:
        """Keys from ``api_key_file`` (e.g. a mounted Secret) when none are given directly: a
        file keeps them out of the process list, where a command-line flag is visible to every
        local user."""
        if self.api_key_file and not self.api_key:
            text = Path(self.api_key_file).expanduser().read_text()
            keys = [k.strip() for line in text.splitlines() for k in line.split(",") if k.strip()]
            if not keys:
                raise ValueError(f"api_key_file {self.api_key_file} holds no key")
            self.api_key = keys
        return self

    @model_validator(mode="after")
    def _named_keys(self) -> Settings:
        keys.parse_all(self.api_key)  # every entry a key or name:key, names distinct
        return self

    def api_keys(self) -> tuple[keys.ApiKey, ...]:
        return keys.parse_all(self.api_key)

    @field_validator("quotas", mode="before")
    @classmethod
    def _parse_quotas(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def limits(self, key_name: str | None) -> Limits:
        """The limits of the API key named ``key_name`` (its own quota over the defaults)."""
        own = self.quotas.get(key_name or "") or Quota.model_validate({})

        def pick(name: str) -> Any:
            value = getattr(own, name)
            return getattr(self, name) if value is None else value

        rps = float(pick("rate_limit_rps"))
        return Limits(
            rate_limit_rps=rps,
            rate_limit_burst=int(pick("rate_limit_burst")) or max(1, math.ceil(rps)),
            max_indexes_per_key=int(pick("max_indexes_per_key")),
            max_items_per_index=int(pick("max_items_per_index")),
        )

    def audit_target(self) -> str | None:
        """The audit log's file, ``stdout``, or None (off)."""
        if self.audit_log == "off":
            return None
        if self.audit_log != "auto":
            return self.audit_log
        if self.storage.startswith("file://"):
            return str(Path(self.storage.removeprefix("file://")) / "audit" / "audit.jsonl")
        return "stdout"

    @field_validator("embedding_models", mode="before")
    @classmethod
    def _parse_models(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("{"):
                value = json.loads(text)
            else:
                pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
                if any(len(p) != 2 for p in pairs):
                    raise ValueError('expected a JSON object or "name=/dir,name2=/dir2"')
                value = {k.strip(): v.strip() for k, v in pairs}
        if isinstance(value, dict):  # absolute now: Ray workers run in other directories
            return {
                k: str(Path(v).expanduser().resolve()) if isinstance(v, str) else v
                for k, v in value.items()
            }
        return value

    def engine_options(self) -> EngineOptions:
        """The engine's options: every EngineOptions field this class also has, by name."""
        own = type(self).model_fields
        shared = {f.name: getattr(self, f.name) for f in fields(EngineOptions) if f.name in own}
        return EngineOptions(**shared, store_url=self.storage, start_pool=True)
