"""Nothing of a running service is reachable by another local user or from another host but its
API (docs/security.md, On the machine).

Starts the real `vaultvec serve` (fast path on, its defaults, its own TMPDIR so that its runtime
directory and everything Ray keeps there belong to this test), sends it some traffic so that
every process exists, then lists every port, Unix socket, file and directory its process tree
holds or made (tests/integration/exposure.py) and tries each as ``nobody``: a file read, a
directory listed, a socket connected, a port that answers a request without credentials with
anything but a refusal is a failure. The API port itself, and the gateway replicas' own ports
behind it, must refuse data without the API key.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.client import generate_key
from tests.integration import exposure, served
from tests.integration.served import Served

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    storage = tmp_path_factory.mktemp("exposure") / "store"
    BEFORE.update(tmp_entries())
    with served.serve(storage, "--host", "127.0.0.1") as srv:
        traffic(srv)
        yield srv


BEFORE: set[Path] = set()


def tmp_entries() -> set[Path]:
    """/tmp's entries and theirs (two levels: Serve's fixed /tmp/haproxy-serve/<node id>)."""
    found = set()
    for top in Path("/tmp").iterdir():
        found.add(top)
        if top.is_dir() and not top.is_symlink():
            with contextlib.suppress(PermissionError):
                found.update(top.iterdir())
    return found


def traffic(srv: Served) -> None:
    """Every process of the service up: an index on both pool actors, written, queried, read."""
    key = generate_key()
    with httpx.Client(base_url=srv.url, headers={"X-API-Key": srv.api_key}, timeout=60) as c:
        body = {"index_name": "exposed", "index_key": key}
        created = c.post(
            "/v1/indexes/create", json={**body, "index_config": {"dimension": 4}, "n_shards": 2}
        )
        assert created.status_code == 200, created.text
        items = [{"id": str(i), "vector": [float(i), 1, 2, 3], "contents": "x"} for i in range(50)]
        assert c.post("/v1/vectors/upsert", json={**body, "items": items}).status_code == 200
        for _ in range(3):
            q = c.post("/v1/vectors/query", json={**body, "query_vectors": [1, 1, 2, 3]})
            assert q.status_code == 200, q.text
        assert c.post("/v1/vectors/get", json={**body, "ids": ["1"]}).status_code == 200


def roots(srv: Served) -> list[Path]:
    """Where the service keeps files: its TMPDIR (the runtime directory, Ray's session files),
    its store, and whatever appeared in /tmp since it started (Serve's and Ray's fixed defaults
    live there)."""
    fresh = [
        p
        for p in sorted(tmp_entries() - BEFORE)
        if srv.tmpdir not in (p, *p.parents) and p.exists() and p.lstat().st_uid == os.getuid()
    ]
    return [srv.tmpdir, srv.storage, *fresh]


@pytest.mark.skipif(os.geteuid() != 0, reason="trying as another user needs root")
def test_another_local_user_reaches_nothing_but_the_api(server: Served) -> None:
    inv = exposure.inventory(server.proc.pid, roots(server))
    assert inv.listeners and inv.unix_sockets and len(inv.paths) > 20, exposure.as_json(inv)
    answers = exposure.probe(inv)
    assert answers["uid"] == exposure.NOBODY
    found = exposure.reachable(inv, answers)
    assert not found, "another local user reaches:\n" + "\n".join(found)
    # and the API port itself refused data without the key (checked inside reachable)
    assert any(exposure.api_like(got["http"]) for got in answers["tcp"].values()), (
        "the API port was not probed"
    )


def test_nothing_but_the_api_listens_beyond_loopback(server: Served) -> None:
    """With --host 127.0.0.1 every listener of the service, Ray's and HAProxy's included, is on
    loopback: nothing is reachable from another host."""
    inv = exposure.inventory(server.proc.pid, [])
    outside = [lst for lst in inv.listeners if not lst.loopback]
    assert not outside, "\n".join(map(str, outside))
    assert any(lst.port == server.port for lst in inv.listeners)


def test_its_own_user_still_joins_its_ray_with_the_bulk_driver(server: Served) -> None:
    """Ray is private to the service, not closed to its user: `vaultvec bulk-query --transport
    ray --ray-address auto` finds the local service's Ray (its address and token in the
    runtime directory) and queries through it."""
    key = generate_key()
    with httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=60) as c:
        body = {"index_name": "joined", "index_key": key}
        assert c.post("/v1/indexes/create", json={**body, "index_config": {"dimension": 2}})
        items = [{"id": "a", "vector": [1, 0]}, {"id": "b", "vector": [0, 1]}]
        assert c.post("/v1/vectors/upsert", json={**body, "items": items}).status_code == 200
    queries = server.tmpdir / "q.jsonl"
    queries.write_text("[1, 0.1]\n[0.1, 1]\n")
    results = server.tmpdir / "r.jsonl"
    env = served.clean_env(TMPDIR=str(server.tmpdir), VAULTVEC_INDEX_KEY=key)
    out = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "bulk-query", str(queries), str(results),
         "--index", "joined", "--top-k", "1", "--transport", "ray", "--ray-address", "auto",
         "--no-progress"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["ids"] for line in lines] == [["a"], ["b"]]
