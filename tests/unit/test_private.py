"""The private runtime directory (actors/process/private.py): never a directory someone else made or
may enter, a fresh one when the default is taken."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from actors.process import private


@pytest.fixture
def tmp_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(private.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(private.tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(private.ENV, raising=False)
    return tmp_path


def test_the_default_is_made_private(tmp_env: Path) -> None:
    path = private.runtime_directory()
    assert path == str(tmp_env / f"vaultvec-{os.getuid()}")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_a_directory_open_to_others_is_not_used(tmp_env: Path) -> None:
    shared = tmp_env / f"vaultvec-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    assert private.runtime_directory() is None
    shared.chmod(0o700)
    assert private.runtime_directory() == str(shared)


def test_a_symbolic_link_is_not_used(tmp_env: Path) -> None:
    target = tmp_env / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_env / f"vaultvec-{os.getuid()}").symlink_to(target)
    assert private.runtime_directory() is None


def test_a_parent_others_may_rename_in_is_not_trusted(tmp_env: Path) -> None:
    parent = tmp_env / "open"
    parent.mkdir()
    parent.chmod(0o777)  # writable by all, not sticky: our directory could be swapped
    child = parent / "d"
    child.mkdir(mode=0o700)
    assert not private.is_private(str(child))
    parent.chmod(0o1777)  # sticky, like /tmp
    assert private.is_private(str(child))


def test_claim_makes_a_fresh_directory_when_the_default_is_taken(
    tmp_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = tmp_env / f"vaultvec-{os.getuid()}"
    taken.mkdir()
    taken.chmod(0o755)  # made by someone else, before the service started (or left open)
    claimed = private.claim()
    assert claimed != str(taken) and private.is_private(claimed)
    assert os.environ[private.ENV] == claimed
    assert private.runtime_directory() == claimed  # every process started from here agrees
    assert private.subdirectory("hap") == os.path.join(claimed, "hap")
