"""Request and answer models of the per-index user routes (CyborgDB 0.17's RBAC); the rest are in
serve_app.models."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_app.models import IndexKey, Model

Permission = Literal["read", "write"]


class CreateUserRequest(Model):
    permissions: list[Permission] = Field(
        min_length=1, max_length=2, description='a non-empty subset of ["read", "write"]'
    )
    index_key: IndexKey | None = None


class CreateUserResponse(Model):
    user_id: str
    api_key: str = Field(description="the user's key: returned this once, never stored")


class UserInfo(Model):
    user_id: str
    permissions: list[str]


class ListUsersResponse(Model):
    users: list[UserInfo]
