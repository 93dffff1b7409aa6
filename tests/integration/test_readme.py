"""The README's curl examples, run as printed with bash against a real server.

Each ```bash block that calls curl runs in a directory whose ``vaultvec-data/api-key`` holds the
test API key; the only change to the text is the base URL (``localhost:8000`` -> the test
server). Blocks run in README order and hand on the variables a reader's shell would keep
(``KEY``, ``IDX``). A ``curl`` shell function defined before the block adds ``--fail-with-body``
and prints each status code, so every curl must answer 2xx.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from serve_app.embedder import DEFAULT_MODEL, builtin_models, runtime_installed
from tests.integration.conftest import API_KEY, Service

README = Path(__file__).resolve().parents[2] / "README.md"
BASE_URL = "localhost:8000"
CARRIED = ("KEY", "IDX")  # variables a block sets for the next ones

PREAMBLE = r"""set -eo pipefail
curl() { command curl --fail-with-body -w '\n@@status %{http_code}\n' "$@"; }
"""
EPILOGUE = "\n" + "".join(f'printf "@@var {v} %s\\n" "${{{v}-}}"\n' for v in CARRIED)


def curl_blocks() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    return [b for b in blocks if re.search(r"(^|\s)curl\s", b)]


BLOCKS = curl_blocks()


def block_id(block: str) -> str:
    if "text_fields" in block:
        return "full-text-and-filters"
    return "text-search" if "embedding_model" in block else "first-steps"


@dataclass
class Shell:
    workdir: Path
    url: str
    env: dict[str, str] = field(default_factory=dict)
    done: int = 0  # blocks run so far
    indexes: set[str] = field(default_factory=set)

    def run_through(self, n: int) -> list[int]:
        """Run blocks up to and including number ``n``; the status codes of block ``n``."""
        statuses: list[int] = []
        while self.done <= n:
            statuses = self.run(BLOCKS[self.done])
            self.done += 1
        return statuses

    def run(self, block: str) -> list[int]:
        script = PREAMBLE + block.replace(BASE_URL, self.url) + EPILOGUE
        self.indexes |= set(re.findall(r'index_name\\":\\"(\w+)', block))
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=self.workdir,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        out = proc.stdout
        statuses = [int(s) for s in re.findall(r"^@@status (\d+)$", out, re.MULTILINE)]
        assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
        for name, value in re.findall(r"^@@var (\w+) (.*)$", out, re.MULTILINE):
            if value:
                self.env[name] = value
        assert len(statuses) == len(re.findall(r"(^|\s)curl\s", block)), out
        return statuses


@pytest.fixture(scope="module")
def shell(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    workdir = tmp_path_factory.mktemp("readme")
    (workdir / "vaultvec-data").mkdir()
    (workdir / "vaultvec-data" / "api-key").write_text(API_KEY + "\n")
    sh = Shell(workdir, service.url)
    yield sh
    key = sh.env.get("IDX")
    if key:
        with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}) as c:
            for name in sh.indexes:
                c.post("/v1/indexes/delete", json={"index_name": name, "index_key": key})


def test_readme_has_curl_examples():
    assert [block_id(b) for b in BLOCKS] == ["first-steps", "text-search", "full-text-and-filters"]
    for block in BLOCKS:
        assert BASE_URL in block
        calls = re.split(r"(?:^|\s)curl\s", block)[1:]
        for call in calls:
            if " -d " in call:
                assert '-H "Content-Type: application/json"' in call, call


@pytest.mark.parametrize("n", range(len(BLOCKS)), ids=[block_id(b) for b in BLOCKS])
def test_readme_curl_block(shell, n):
    if "embedding_model" in BLOCKS[n] and not (
        runtime_installed() and DEFAULT_MODEL in builtin_models()
    ):
        pytest.skip("embeddings extra not installed (pip install torch==2.13.0 -e '.[embeddings]')")
    statuses = shell.run_through(n)
    assert statuses and all(200 <= s < 300 for s in statuses), statuses


def tool_block() -> str:
    """The README's block of `vaultvec` commands: backup, restore and export."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if "vaultvec backup" in b]
    return block


def test_readme_backup_restore_export_block(shell, service: Service) -> None:
    """Run as printed after the curl blocks (their KEY and IDX), with `.venv` the one running
    these tests and VAULTVEC_URL the test server (the README's default is localhost:8000)."""
    shell.run_through(len(BLOCKS) - 1)
    venv = shell.workdir / ".venv"
    if not venv.exists():
        venv.symlink_to(Path(sys.prefix))
    proc = subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + tool_block()],
        cwd=shell.workdir,
        env={**os.environ, **shell.env, "VAULTVEC_URL": service.url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    shell.indexes.add("cases_copy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (shell.workdir / "cases.jsonl").read_text().splitlines()
    with httpx.Client(base_url=service.url, headers={"X-API-Key": API_KEY}) as c:
        body = {"index_name": "cases", "index_key": shell.env["IDX"]}
        assert len(lines) == c.post("/v1/vectors/num_vectors", json=body).json()["result"] > 0
    assert "restored" in proc.stderr and "exported" in proc.stderr
