"""The request gate: the API key (its name noted, its rate enforced) or a per-index user key
(verified against its grant, its rights noted), then the JSON content type, checked from the
headers before anything reads the body."""

from __future__ import annotations

import re
from collections.abc import Collection

from fastapi import Security
from fastapi.security import APIKeyHeader
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from actors.errors import Unauthorized
from actors.storage import users
from serve_app import replica
from serve_app.access import context, keys, rights
from serve_app.access.rights import Right
from serve_app.http.errors import error_response, response_for
from serve_app.http.trim import tidied
from serve_app.settings import Limits

API_KEY_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="the service API key")


async def require_api_key(given: str | None = Security(API_KEY_HEADER)) -> None:
    """OpenAPI marker of the X-API-Key security scheme (SDK generators read it); checks nothing.

    The key is checked by ``ApiKeyGate`` from the headers, before the body is read; a route
    dependency runs only after FastAPI has read and parsed the whole body."""


async def verified_user(given: bytes) -> tuple[context.User, Right] | None:
    """The user a per-index user key names and the rights its grant holds, if the key's
    secret is that grant's; None for any other key (malformed, unknown, revoked, wrong)."""
    try:
        user_id, secret = users.parse(given.decode("latin-1"))
    except Unauthorized:
        return None
    services = replica.REPLICA.services
    if services is None:
        return None
    meta = await services.engine.control.user_index(user_id)
    if meta is None:
        return None
    grant = next((u for u in meta.users if u.user_id == user_id), None)
    kek = None if grant is None else users.verify(grant, secret, meta.index_id)
    if grant is None or kek is None:
        return None
    return context.User(user_id, kek, grant, meta), rights.of(grant.rights)


def over_rate(name: str, limits: Limits, wait: int) -> Response:
    return error_response(
        429,
        f"API key {name!r} is over its rate of {limits.rate_limit_rps:g} requests/s "
        f"(rate_limit_rps): retry after {wait} s",
        headers={"Retry-After": str(wait)},
    )


_MEDIA_TYPE = re.compile(rb"[A-Za-z0-9!#$&^_.+-]{1,64}/[A-Za-z0-9!#$&^_.+-]{1,64}")


def is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def not_json_detail(content_type: bytes | None) -> str:
    media = (content_type or b"").split(b";", 1)[0].strip()
    if not media:
        sent = "no Content-Type"
    elif _MEDIA_TYPE.fullmatch(media):  # named back only when it is a plain type/subtype
        sent = f"Content-Type {media.decode()}"
    else:
        sent = "an invalid Content-Type"
    return f"request body must be JSON, got {sent}: send Content-Type: application/json"


class ApiKeyGate:
    """Pure ASGI middleware: the API key, then the JSON content type, from the headers alone.

    Runs before any route, so a request with a missing or wrong X-API-Key is answered 401, and
    then a body that is not ``application/json`` 415, without the app reading a byte of the
    body (DESIGN §3). ``open_paths`` (GET /v1/health, the docs), paths under
    ``open_prefixes`` and the paths of ``open_if`` whose setting (a Settings field name) is on
    pass unchecked. The content type is checked only for ``json_routes``
    ((method, path) of the routes that read a JSON body): any other request goes on to the
    app's 404 or 405 (with Allow), whatever its body."""

    def __init__(
        self,
        app: ASGIApp,
        open_paths: Collection[str] = (),
        open_prefixes: tuple[str, ...] = (),
        json_routes: Collection[tuple[str, str]] = (),
        open_if: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = open_prefixes
        self.json_routes = frozenset(r for r in json_routes if "{" not in r[1])
        # Routes with a path parameter ("/v1/indexes/{index_name}/users"): one segment each.
        self.json_templates = [
            (method, re.compile(re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(path))))
            for method, path in json_routes
            if "{" in path
        ]
        self.open_if = dict(open_if or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.is_open(scope):
            await self.app(scope, receive, send)
            return
        given = content_type = None
        for name, value in scope["headers"]:
            if name == b"x-api-key" and given is None:
                given = value
            elif name == b"content-type" and content_type is None:
                content_type = value
        if given and users.is_user_key(given):
            await self.user_request(given, content_type, scope, receive, send)
            return
        key = keys.match(given, replica.REPLICA.keys) if given else None
        if not given:
            refusal = error_response(401, "missing X-API-Key header")
        elif key is None:
            refusal = error_response(401, "invalid API key")
        elif wait := replica.REPLICA.limiter.wait(key.name):
            context.note(key=key.name)
            refusal = over_rate(key.name, replica.REPLICA.limiter.limits(key.name), wait)
        elif self.reads_json(scope) and not is_json(content_type):
            context.note(key=key.name)
            refusal = error_response(415, not_json_detail(content_type))
        else:
            context.note(key=key.name, limits=replica.REPLICA.limiter.limits(key.name))
            await tidied(self.app, scope, receive, send)
            return
        await refusal(scope, receive, send)  # sends the answer only: never calls receive()

    async def user_request(
        self, given: bytes, content_type: bytes | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A per-index user key, verified before anything reads the body: the catalog entry of
        its index looked up afresh (so a revoked key is a 401 from the next request on) and
        its secret checked against the grant in constant time. A verified user has a rate
        bucket of its own and the quotas of the API key that created its index."""
        try:
            found = await verified_user(given)
        except Exception as exc:  # the control plane is out of reach: 503, never a pass
            await response_for(exc)(scope, receive, send)
            return
        if found is None:
            await error_response(401, "invalid API key")(scope, receive, send)
            return
        user, held = found
        name, limiter = f"user-{user.user_id}", replica.REPLICA.limiter
        context.note(key=name, user=user, rights=held)
        if wait := limiter.wait(name):
            refusal = over_rate(name, limiter.limits(name), wait)
        elif self.reads_json(scope) and not is_json(content_type):
            refusal = error_response(415, not_json_detail(content_type))
        else:
            context.note(limits=limiter.limits(user.meta.owner))
            await tidied(self.app, scope, receive, send)
            return
        await refusal(scope, receive, send)

    def reads_json(self, scope: Scope) -> bool:
        method, path = scope["method"], self.path(scope)
        if (method, path) in self.json_routes:
            return True
        return any(m == method and p.fullmatch(path) for m, p in self.json_templates)

    def is_open(self, scope: Scope) -> bool:
        path = self.path(scope)
        if path in self.open_paths or path.startswith(self.open_prefixes):
            return True
        setting = self.open_if.get(path)
        return setting is not None and bool(getattr(replica.REPLICA.settings, setting, False))

    @staticmethod
    def path(scope: Scope) -> str:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return path
