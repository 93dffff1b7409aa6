"""The embedding-model registry and settings, without Ray (serve_app/embedder.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from actors.errors import InvalidRequest
from serve_app.embedder import (
    DEFAULT_MODEL,
    INSTALL_HINT,
    ModelRegistry,
    builtin_models,
    runtime_installed,
)
from serve_app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
HAVE_MODEL = runtime_installed() and DEFAULT_MODEL in builtin_models()
needs_model = pytest.mark.skipif(
    not HAVE_MODEL,
    reason="embeddings extra not installed: pip install torch==2.13.0 -e '.[dev,embeddings]'",
)


# -- settings -------------------------------------------------------------------------------
def test_embedding_models_setting_from_json_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VAULTVEC_EMBEDDING_MODELS", f'{{"mine": "{tmp_path}"}}')
    assert Settings().embedding_models == {"mine": str(tmp_path)}


def test_embedding_models_setting_from_pairs_resolves_relative_dirs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VAULTVEC_EMBEDDING_MODELS", "a=models/a, b=/opt/b")
    assert Settings().embedding_models == {"a": str(tmp_path / "models" / "a"), "b": "/opt/b"}


def test_embedding_models_setting_rejects_garbage(monkeypatch):
    monkeypatch.setenv("VAULTVEC_EMBEDDING_MODELS", "no-equals-sign")
    with pytest.raises(ValueError, match="name=/dir"):
        Settings()


def test_embedder_defaults():
    s = Settings()
    assert s.embedding_models == {}
    assert 0 < s.embedder_num_cpus < 1 and s.embedder_replicas == 1
    assert s.embedder_threads == 0 and s.embedder_max_batch_size > 1


def test_serve_config_validates_and_builds():
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((REPO / "configs" / "serve.yaml").read_text())
    ServeDeploySchema.model_validate(config)
    args = config["applications"][0]["args"]
    assert set(args) <= set(Settings.model_fields)  # Settings would drop a misspelt key silently
    from serve_app.app import build_app

    assert build_app(args) is not None


# -- registry -------------------------------------------------------------------------------
def test_without_the_extra_no_model_is_available():
    reg = ModelRegistry({"mine": "/"}, installed=False)
    assert reg.available() == []
    with pytest.raises(InvalidRequest) as exc:
        reg.path(DEFAULT_MODEL)
    assert exc.value.detail == INSTALL_HINT
    assert "install the embeddings extra" in exc.value.detail


def test_configured_models_need_an_existing_directory(tmp_path):
    (tmp_path / "real").mkdir()
    reg = ModelRegistry(
        {"real": str(tmp_path / "real"), "ghost": str(tmp_path / "ghost")}, installed=True
    )
    assert "real" in reg.available() and "ghost" not in reg.available()
    assert reg.path("real") == (tmp_path / "real").resolve()
    with pytest.raises(InvalidRequest) as exc:
        reg.path("nope")
    assert "unknown embedding_model 'nope'" in exc.value.detail
    for name in reg.available():
        assert name in exc.value.detail


def test_configured_name_overrides_the_builtin(tmp_path):
    reg = ModelRegistry({DEFAULT_MODEL: str(tmp_path)}, installed=True)
    assert reg.path(DEFAULT_MODEL) == tmp_path.resolve()


def test_gateway_imports_without_torch(tmp_path):
    """A server without the extra: the app module imports, nothing heavy is loaded, no models."""
    script = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "sentence_transformers"):
                    raise ImportError(f"blocked {name}")
                return None
        sys.meta_path.insert(0, Block())
        import serve_app.app
        from serve_app.embedder import ModelRegistry, runtime_installed
        assert not runtime_installed()
        reg = ModelRegistry()
        assert reg.available() == [], reg.available()
        assert "torch" not in sys.modules and "sentence_transformers" not in sys.modules
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


# -- the real model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry() -> ModelRegistry:
    if not HAVE_MODEL:
        pytest.skip("embeddings extra not installed: pip install torch==2.13.0 -e '.[embeddings]'")
    return ModelRegistry(threads=2)


@needs_model
def test_builtin_model_comes_from_the_package():
    path = builtin_models()[DEFAULT_MODEL]
    assert (path / "modules.json").is_file() and (path / "model.safetensors").is_file()


@needs_model
def test_default_model_embeds_normalised_float32(registry):
    assert registry.dimension(DEFAULT_MODEL) == 384
    x = registry.encode(DEFAULT_MODEL, ["gzip compresses files", "a cat sleeps", "rain"])
    assert x.dtype == np.float32 and x.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert registry.encode(DEFAULT_MODEL, []).shape[0] == 0


@needs_model
def test_default_model_is_semantic(registry):
    docs = [
        "gzip is a tool that compresses files to save disk space",
        "the cat sleeps on the warm windowsill all afternoon",
        "heavy rain is expected tomorrow across the north of the country",
    ]
    d = registry.encode(DEFAULT_MODEL, docs)
    q = registry.encode(DEFAULT_MODEL, ["how do I make my files smaller", "weather forecast"])
    assert (q @ d.T).argmax(axis=1).tolist() == [0, 2]


@needs_model
def test_a_local_directory_model_loads_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    link = tmp_path / "mini"
    link.symlink_to(builtin_models()[DEFAULT_MODEL], target_is_directory=True)
    reg = ModelRegistry({"mini-local": str(link)}, threads=2)
    assert set(reg.available()) == {DEFAULT_MODEL, "mini-local"}
    a = reg.encode("mini-local", ["offline only"])
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    b = ModelRegistry(threads=2).encode(DEFAULT_MODEL, ["offline only"])
    np.testing.assert_allclose(a, b, atol=1e-6)


@needs_model
def test_a_broken_model_directory_is_a_clear_error(tmp_path):
    from actors.errors import InternalError

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "modules.json").write_text("not json")
    reg = ModelRegistry({"broken": str(tmp_path / "broken")}, threads=1)
    with pytest.raises(InternalError, match="'broken' could not be loaded"):
        reg.dimension("broken")
