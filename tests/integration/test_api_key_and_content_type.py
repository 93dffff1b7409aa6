"""Over real HTTP: 401 for a missing/wrong API key, then 415 for a body that is not JSON, both
answered from the headers before the body is read; the docs need no key."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.integration.conftest import API_KEY, BODY_IDLE_TIMEOUT_S, Service
from tests.integration.support import error

MAX_BODY = 8 << 20  # the service fixture's max_body_bytes


@pytest.fixture(scope="module")
def anon(service: Service):
    with httpx.Client(base_url=service.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"index_name=a&index_key=b", "application/x-www-form-urlencoded"),
        (b'{"index_name": "a"}', "text/plain"),
        (b'{"index_name": "a"}', None),
    ],
)
@pytest.mark.parametrize("route", ["vectors/query", "vectors/upsert", "indexes/create"])
def test_body_that_is_not_json_is_415(anon, route, content, content_type):
    headers = {"X-API-Key": API_KEY}
    if content_type:
        headers["Content-Type"] = content_type
    body = error(anon.post(f"/v1/{route}", content=content, headers=headers), 415)
    assert body["detail"].endswith("send Content-Type: application/json")
    assert set(body) == {"status_code", "detail"}


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/indexes/list", "GET"),
        ("POST", "/v1/indexes/training-status", "GET"),
        ("PATCH", "/v1/embedding-models", "GET"),
        ("PUT", "/v1/vectors/query", "POST"),
    ],
)
@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded"])
def test_method_a_route_does_not_take_is_405_whatever_the_body(
    anon, method, path, allow, content_type
):
    # The content type matters only to a route that reads a JSON body (it was a 415 here).
    headers = {"X-API-Key": API_KEY}
    if content_type:
        headers["Content-Type"] = content_type
    r = anon.request(method, path, content=b"a=1", headers=headers)
    error(r, 405)
    assert r.headers["allow"] == allow


def test_unknown_route_is_404_whatever_the_body(anon):
    headers = {"X-API-Key": API_KEY, "Content-Type": "text/plain"}
    error(anon.post("/v1/no-such-route", content=b"a", headers=headers), 404)
    error(anon.post("/v1/no-such-route", json={}, headers={"X-API-Key": "wrong"}), 401)


def test_json_with_a_charset_is_accepted(anon):
    r = anon.post(
        "/v1/vectors/query",
        content=b"{}",
        headers={"X-API-Key": API_KEY, "Content-Type": "application/json; charset=utf-8"},
    )
    error(r, 422)  # reached the route (index_name missing): neither 401 nor 415


@pytest.mark.parametrize("key", [None, "", "wrong-key"])
@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"index_name": ', "application/json"),  # malformed JSON: would be a 422
        (b"index_name=a", "application/x-www-form-urlencoded"),  # not JSON: would be a 415
        (b"x" * (MAX_BODY + 1024), "application/json"),  # over the limit: would be a 413
    ],
    ids=["malformed", "form", "too-large"],
)
def test_missing_or_wrong_key_comes_first(anon, key, content, content_type):
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["X-API-Key"] = key
    r = anon.post("/v1/vectors/query", content=content, headers=headers)
    error(r, 401)
    assert r.headers["www-authenticate"] == "X-API-Key"


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the response body"
        rest += chunk
    return status, headers, rest[:length]


@pytest.mark.parametrize(
    "declared",
    [MAX_BODY // 2, MAX_BODY * 25],  # within the limit / 200 MB, over it (would be a 413)
    ids=["within-limit", "over-limit"],
)
def test_unauthenticated_body_is_never_waited_for(service, declared):
    """Headers announce a large body, only 64 KiB of it is sent and the client then waits:
    the 401 arrives without the server waiting for (or reading) the rest."""
    url = urlsplit(service.url)
    sent = b'{"index_name":"x","pad":"' + b"p" * (64 << 10)
    request = (
        f"POST /v1/vectors/upsert HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n"
        "X-API-Key: wrong-key\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(request + sent)
        status, headers, body = read_response(sock)
        took = time.monotonic() - started
    assert status == 401, body
    assert headers["www-authenticate"] == "X-API-Key"
    assert orjson.loads(body) == {"status_code": 401, "detail": "invalid API key"}
    assert took < 20, took


def test_authenticated_partial_body_is_still_read(service):
    """Control for the test above: with the right key the route does wait for the body, for
    as long as the body-read deadline allows, then answers 408."""
    url = urlsplit(service.url)
    request = (
        f"POST /v1/vectors/upsert HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 1000\r\n"
        f"X-API-Key: {API_KEY}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(request + b'{"index_name":')
        sock.settimeout(BODY_IDLE_TIMEOUT_S / 2)
        with pytest.raises(socket.timeout):
            sock.recv(65536)
        sock.settimeout(BODY_IDLE_TIMEOUT_S + 20)
        status = sock.recv(65536).split(b"\r\n", 1)[0]
    assert status.split()[1] == b"408", status


@pytest.mark.parametrize("path", ["/openapi.json", "/v1/openapi.json"])
def test_openapi_needs_no_key(anon, path):
    r = anon.get(path)
    assert r.status_code == 200
    spec = r.json()
    assert "/v1/vectors/query" in spec["paths"]
    assert spec == anon.get("/openapi.json").json()


@pytest.mark.parametrize("path", ["/docs", "/v1/docs"])
def test_docs_page_is_self_hosted(anon, path):
    r = anon.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "http://" not in html and "https://" not in html, html
    for asset in ("/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css"):
        assert asset in html
        got = anon.get(asset)
        assert got.status_code == 200 and len(got.content) > 10_000, asset
