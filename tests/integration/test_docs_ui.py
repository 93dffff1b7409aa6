"""/docs renders in a headless browser from vaultvec's own assets (no CDN: works offline)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import Service

CHROMIUM = Path("/usr/bin/chromium")
OPERATIONS = ["/v1/vectors/query", "/v1/vectors/upsert", "/v1/indexes/create", "/v1/health"]


def dump_dom(url: str, profile: Path) -> str:
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium; "
            ".ci/run does so when it runs as root)"
        )
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("path", ["/docs", "/v1/docs"])
def test_swagger_ui_renders_the_operations(service: Service, tmp_path: Path, path: str):
    dom = dump_dom(service.url + path, tmp_path / "profile")
    assert 'id="swagger-ui"' in dom
    for op in OPERATIONS:
        assert op in dom, f"{op} not rendered; DOM starts: {dom[:1500]}"
    assert "Unable to render" not in dom
    # Every resource the page loads is the server's own (a relative URL or this host).
    own = urlsplit(service.url).netloc
    for url in re.findall(r'(?:src|href)="([^"#]*)"', dom):
        host = urlsplit(url).netloc
        assert host in ("", own), f"the page loads {url}"
