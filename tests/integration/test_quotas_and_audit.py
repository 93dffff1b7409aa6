"""Named API keys, their quotas and the audit log, on a real `vaultvec serve` (through HAProxy):
a key over its rate gets 429 with Retry-After while another key is served; a key's index and
item quotas hold; every request is in the audit log once, with the key's name, and no secret is.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from cluster.client import generate_key
from tests.integration import served
from tests.integration.served import Served

pytestmark = pytest.mark.slow

KEYS = {"alice": "alice-s3cret-api-key", "bob": "bob-s3cret-api-key"}
QUOTAS = {"alice": {"rate_limit_rps": 4, "max_indexes_per_key": 1, "max_items_per_index": 10}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("quotas")
    key_file = base / "api-keys"
    key_file.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    key_file.chmod(0o600)
    env = {"VAULTVEC_QUOTAS": orjson.dumps(QUOTAS).decode()}
    with served.serve(base / "store", "--api-key-file", str(key_file), env=env) as srv:
        yield srv


def client(srv: Served, name: str) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"X-API-Key": KEYS[name]}, timeout=60)


def test_a_key_over_its_rate_gets_429_while_another_key_is_served(server: Served) -> None:
    answered: dict[str, Counter[int]] = {"alice": Counter(), "bob": Counter()}
    retry_after: set[str] = set()
    stop = time.monotonic() + 3.0

    def send(name: str) -> None:
        with client(server, name) as c:
            while time.monotonic() < stop:
                r = c.get("/v1/indexes/list")
                answered[name][r.status_code] += 1
                if r.status_code == 429:
                    retry_after.add(r.headers["retry-after"])

    threads = [threading.Thread(target=send, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alice, bob = answered["alice"], answered["bob"]
    assert set(bob) == {200} and bob[200] > 30, bob  # unlimited
    assert set(alice) == {200, 429}, alice
    assert alice[200] <= 4 + 4 * 3 + 1, alice  # its burst (a second's) and 4/s after
    assert retry_after == {"1"}
    with httpx.Client(base_url=server.url) as anon:  # the health check is never limited
        assert all(anon.get("/v1/health").status_code == 200 for _ in range(30))


def wait_for_rate(c: httpx.Client, method: str, url: str, **kw: Any) -> httpx.Response:
    for _ in range(100):
        r = c.request(method, url, **kw)
        if r.status_code != 429:
            return r
        time.sleep(float(r.headers["retry-after"]))
    raise AssertionError("still over the rate")


def test_a_key_s_index_and_item_quotas(server: Served) -> None:
    key = generate_key()
    with client(server, "alice") as alice, client(server, "bob") as bob:
        first = {"index_name": "alice-1", "index_key": key, "index_config": {"dimension": 2}}
        assert wait_for_rate(alice, "POST", "/v1/indexes/create", json=first).status_code == 200
        second = {**first, "index_name": "alice-2"}
        r = wait_for_rate(alice, "POST", "/v1/indexes/create", json=second)
        assert r.status_code == 422 and "max_indexes_per_key=1" in r.json()["detail"]
        body = {"index_name": "alice-1", "index_key": key}
        items = [{"id": str(i), "vector": [float(i), 1.0]} for i in range(10)]
        r = wait_for_rate(alice, "POST", "/v1/vectors/upsert", json={**body, "items": items})
        assert r.status_code == 200
        # replacing items of a full index is fine; an eleventh item is not
        r = wait_for_rate(alice, "POST", "/v1/vectors/upsert", json={**body, "items": items[:3]})
        assert r.status_code == 200
        more = [{"id": "10", "vector": [10.0, 1.0]}]
        r = wait_for_rate(alice, "POST", "/v1/vectors/upsert", json={**body, "items": more})
        assert r.status_code == 422 and "max_items_per_index" in r.json()["detail"]
        # bob has no quota: his key may grow the same index
        assert bob.post("/v1/vectors/upsert", json={**body, "items": more}).status_code == 200
        assert bob.post("/v1/indexes/create", json=second).status_code == 200


def test_every_request_is_in_the_audit_log_with_no_secret(server: Served) -> None:
    key = generate_key()
    vector_marker = 12345.678
    with client(server, "bob") as bob:
        body = {"index_name": "audited", "index_key": key}
        bob.post("/v1/indexes/create", json={**body, "index_config": {"dimension": 2}})
        items = [{"id": "patient-77", "vector": [vector_marker, 1.0], "metadata": {"ward": "icu"},
                  "contents": "chest pain"}]  # fmt: skip
        assert bob.post("/v1/vectors/upsert", json={**body, "items": items}).status_code == 200
        q = bob.post("/v1/vectors/query", json={**body, "query_vectors": [[1, 2], [3, 4]]})
        assert q.status_code == 200
        assert bob.post("/v1/vectors/get", json={**body, "ids": ["patient-77"]}).status_code == 200
        wrong = {**body, "index_key": generate_key()}
        assert bob.post("/v1/vectors/get", json={**wrong, "ids": ["x"]}).status_code == 401
    with httpx.Client(base_url=server.url, headers={"X-API-Key": "guess"}) as guesser:
        assert guesser.post("/v1/vectors/get", json=body).status_code == 401
    log = server.storage / "audit" / "audit.jsonl"
    records = wait_for_records(
        log,
        lambda rs: (
            sum(r["index"] == "audited" for r in rs) >= 5 and any(r["key"] is None for r in rs)
        ),
    )
    mine = [r for r in records if r["index"] == "audited"]
    seen = [(r["key"], r["route"], r["status"], r["items"]) for r in mine]
    assert seen == [
        ("bob", "/v1/indexes/create", 200, None),
        ("bob", "/v1/vectors/upsert", 200, 1),
        ("bob", "/v1/vectors/query", 200, 2),
        ("bob", "/v1/vectors/get", 200, 1),
        ("bob", "/v1/vectors/get", 401, 1),
    ]
    assert any(r["key"] is None and r["status"] == 401 for r in records)  # the guess
    assert all(r["client"] == "127.0.0.1" for r in mine)  # through HAProxy (X-Forwarded-For)
    assert all(isinstance(r["duration_ms"], float) for r in mine)
    text = log.read_text()
    for secret in (*KEYS.values(), key, "guess", "patient-77", "icu", "chest pain", "12345"):
        assert secret not in text, secret
    assert log.stat().st_mode & 0o077 == 0


def wait_for_records(path: Path, done: Any, timeout_s: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        data = path.read_bytes() if path.exists() else b""
        # the complete lines only: the log may be read while its last line is being written
        records = [orjson.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]
        if done(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
