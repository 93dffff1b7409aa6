"""Service settings and the ``vaultvec serve`` command line: where API keys come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import cli, runtime
from serve_app.settings import Settings


def test_api_keys_come_from_a_file_one_per_line_or_comma_separated(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("first-key\nsecond-key, third-key\n\n")
    assert Settings(api_key_file=str(keys)).api_key == ["first-key", "second-key", "third-key"]
    # Keys given directly win over the file.
    assert Settings(api_key=["direct"], api_key_file=str(keys)).api_key == ["direct"]


def test_an_empty_or_missing_key_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="holds no key"):
        Settings(api_key_file=str(empty))
    with pytest.raises(FileNotFoundError):
        Settings(api_key_file=str(tmp_path / "missing"))


class Started(Exception):
    """Raised by the stand-in for runtime.start: the command got as far as starting."""


@pytest.fixture()
def started(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    seen: list[Settings] = []

    def start(settings: Settings) -> Any:
        seen.append(settings)
        raise Started

    monkeypatch.setattr(runtime, "start", start)
    monkeypatch.delenv("VAULTVEC_API_KEY", raising=False)
    monkeypatch.delenv("VAULTVEC_API_KEY_FILE", raising=False)
    return seen


def test_serve_reads_keys_from_api_key_file_without_a_warning(
    tmp_path: Path, started: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("from-file\n")
    with pytest.raises(Started):
        cli.main(["serve", "--api-key-file", str(keys), "--storage", str(tmp_path / "data")])
    assert started[0].api_key == ["from-file"]
    assert "warning" not in capsys.readouterr().err


def test_serve_warns_that_api_key_on_the_command_line_is_visible(
    tmp_path: Path, started: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Started):
        cli.main(["serve", "--api-key", "k1,k2", "--storage", str(tmp_path / "data")])
    assert started[0].api_key == ["k1", "k2"]
    err = capsys.readouterr().err
    assert "process list" in err and "--api-key-file" in err


def test_engine_options_carry_every_setting_of_the_same_name(tmp_path: Path) -> None:
    from dataclasses import fields

    from actors.control.options import EngineOptions

    s = Settings(storage=f"file://{tmp_path}", shard_threads=3, max_indexes=7, idle_ttl_s=9.0)
    options = s.engine_options()
    assert options.store_url == f"file://{tmp_path}"
    assert (options.shard_threads, options.max_indexes, options.idle_ttl_s) == (3, 7, 9.0)
    shared = [f.name for f in fields(EngineOptions) if f.name in Settings.model_fields]
    assert len(shared) >= 10
    assert all(getattr(options, name) == getattr(s, name) for name in shared)
    # The defaults are the engine's own, written once.
    default = EngineOptions(store_url="")
    assert all(getattr(Settings(), name) == getattr(default, name) for name in shared)


def test_every_setting_is_in_the_api_reference() -> None:
    """docs/api.md lists every VAULTVEC_ variable `vaultvec serve` reads."""
    doc = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    missing = [n for n in Settings.model_fields if f"`VAULTVEC_{n.upper()}`" not in doc]
    assert missing == []
