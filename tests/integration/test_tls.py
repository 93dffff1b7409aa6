"""`vaultvec serve --tls-cert/--tls-key` serves HTTPS on the API port, through HAProxy (the fast
path, the default) and through Serve's own proxy, with a certificate from a CA made for the test
(trustme): keep-alive intact, nothing served in the clear on the port, and every client works
over it — curl-like HTTP, the Python client, the bulk driver and the cyborgdb SDK
(``verify_ssl``)."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cluster.client import Client, generate_key
from tests.compat import support as compat
from tests.integration import served
from tests.integration.served import Served

trustme = pytest.importorskip("trustme", reason='trustme not installed: pip install -e ".[dev]"')

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return trustme.CA()


@pytest.fixture(scope="module", params=["fast-path", "serve-proxy"])
def server(
    request: pytest.FixtureRequest, ca: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Served, Path]]:
    base = tmp_path_factory.mktemp(f"tls-{request.param}")
    cert = ca.issue_cert("localhost", "127.0.0.1")
    chain, key = base / "cert.pem", base / "key.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    ca_pem = base / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    env = {"VAULTVEC_SERVE_FAST_PATH": "true" if request.param == "fast-path" else "false"}
    with served.serve(
        base / "store", "--tls-cert", str(chain), "--tls-key", str(key), env=env
    ) as srv:
        yield srv, ca_pem


def test_the_api_port_speaks_https_only(server: tuple[Served, Path]) -> None:
    srv, ca_pem = server
    assert srv.url == f"https://127.0.0.1:{srv.port}"
    r = httpx.get(f"{srv.url}/v1/health", verify=ssl.create_default_context(cafile=ca_pem))
    assert r.status_code == 200 and r.json()["status"] == "healthy"
    # The certificate is checked: a client that does not trust the test CA refuses it.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.url}/v1/health")
    # Nothing is answered in the clear on that port.
    with pytest.raises(httpx.HTTPError):
        r = httpx.get(f"http://127.0.0.1:{srv.port}/v1/health", timeout=5)
        assert r.status_code != 200 or "healthy" not in r.text


def test_keep_alive_holds_over_tls(server: tuple[Served, Path]) -> None:
    """The TLS connection carries request after request. On the fast path a reload of HAProxy
    (Serve reloads it when its replicas change, e.g. while the embedder or a gateway starts)
    closes idle keep-alive connections after their response, by design (its
    idle-close-on-response): one close in the run is that, and the client reconnects."""
    srv, ca_pem = server
    context = ssl.create_default_context(cafile=ca_pem)
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=context, timeout=30)
    try:
        closes, used = 0, []
        for _ in range(20):
            conn.request("GET", "/v1/health")  # reconnects after a close
            used.append(conn.sock)  # the TLS connection this request went over (kept alive)
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["status"] == "healthy"
            closes += r.will_close
        assert closes <= 1, f"{closes} of 20 responses closed the connection"
        # one connection, and one more after a close (unless the last response closed it)
        assert len({id(sock) for sock in used}) == 1 + closes - int(r.will_close)
    finally:
        conn.close()


def test_the_python_client_and_the_bulk_driver_over_tls(
    server: tuple[Served, Path], tmp_path: Path
) -> None:
    srv, ca_pem = server
    key = generate_key()
    x = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    with Client(srv.url, srv.api_key, verify=str(ca_pem)) as vv:
        idx = vv.create_index("tls", key, dimension=8)
        idx.upsert([str(i) for i in range(len(x))], x)
        res = idx.query(x[:5], top_k=1)
        assert [list(r) for r in res.ids] == [[str(i)] for i in range(5)]
    queries = tmp_path / "q.npy"
    np.save(queries, x[:50])
    out = tmp_path / "r.jsonl"
    env = served.clean_env(VAULTVEC_API_KEY=srv.api_key, VAULTVEC_INDEX_KEY=key)
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "bulk-query", str(queries), str(out),
         "--index", "tls", "--top-k", "1", "--url", srv.url, "--ca-cert", str(ca_pem),
         "--no-progress"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["ids"] for line in out.read_text().splitlines()] == [
        [str(i)] for i in range(50)
    ]


SDK_SCRIPT = """
import json, sys
import numpy as np
import cyborgdb

url, api_key, verify = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
client = cyborgdb.Client(url, api_key, verify_ssl=verify)
key = bytes(range(32))
index = client.create_index("sdk-tls-" + sys.argv[3], key, dimension=4)
index.upsert([{"id": "a", "vector": [1, 0, 0, 0]}, {"id": "b", "vector": [0, 1, 0, 0]}])
print(json.dumps([r["id"] for r in index.query(query_vectors=[1, 0.1, 0, 0], top_k=2)]))
"""


@pytest.mark.parametrize("verify", [True, False])
def test_the_cyborgdb_sdk_over_tls(server: tuple[Served, Path], verify: bool) -> None:
    """The real SDK (0.18) with ``verify_ssl``: checking the certificate against the test CA
    (which it finds, as any OpenSSL client does, through SSL_CERT_FILE), or not checking it."""
    srv, ca_pem = server
    sdk = compat.sdk_release_path("0.18.0")
    host_url = srv.url.replace("127.0.0.1", "localhost")  # the name the certificate holds too
    env = dict(os.environ, PYTHONPATH=str(sdk), SSL_CERT_FILE=str(ca_pem))
    done = subprocess.run(
        [sys.executable, "-c", SDK_SCRIPT, host_url, srv.api_key, str(verify).lower()],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["a", "b"]
