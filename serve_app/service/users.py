"""Per-index users (CyborgDB's RBAC): minted, listed and revoked by whoever holds the index key
with an API key (the ``manage`` right); a user then opens the index with its own key alone
(serve_app.service.unlock), with the rights it was given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.errors import InvalidRequest
from serve_app.access.rights import Right
from serve_app.service.deps import Services
from serve_app.service.unlock import open_index


async def create(
    svc: Services, name: str, key: str | None, permissions: Sequence[str]
) -> dict[str, Any]:
    if len(set(permissions)) != len(permissions):
        raise InvalidRequest(f"permissions lists a value twice: {permissions}")
    cv = await open_index(svc.engine, name, key, Right.MANAGE)
    user_id, api_key = await svc.engine.control.create_user(name, cv.key, list(permissions))
    return {"user_id": user_id, "api_key": api_key}


async def list_users(svc: Services, name: str, key: str | None) -> dict[str, Any]:
    cv = await open_index(svc.engine, name, key, Right.MANAGE)
    found = await svc.engine.control.list_users(name, cv.key)
    return {"users": [{"user_id": u, "permissions": list(rights)} for u, rights in found]}


async def delete(svc: Services, name: str, key: str | None, user_id: str) -> None:
    cv = await open_index(svc.engine, name, key, Right.MANAGE)
    await svc.engine.control.delete_user(name, cv.key, user_id)
