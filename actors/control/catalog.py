"""The control plane's catalog entries by index name, with an index of the per-index users
(actors.storage.users): which index each user id belongs to, kept in step with every entry set
or removed."""

from __future__ import annotations

from typing import Any

from actors.types import IndexMeta


class Catalog(dict[str, IndexMeta]):
    def __init__(self) -> None:
        super().__init__()
        self._user_index: dict[str, str] = {}  # user id -> index name

    def __setitem__(self, name: str, meta: IndexMeta) -> None:
        self._forget_users(name)
        super().__setitem__(name, meta)
        for grant in meta.users:
            self._user_index[grant.user_id] = name

    def pop(self, name: str, default: Any = None) -> Any:
        self._forget_users(name)
        return super().pop(name, default)

    def of_user(self, user_id: str) -> IndexMeta | None:
        """The entry of the index ``user_id`` is a user of."""
        name = self._user_index.get(user_id)
        return None if name is None else self.get(name)

    def _forget_users(self, name: str) -> None:
        old = self.get(name)
        if old is not None:
            for grant in old.users:
                self._user_index.pop(grant.user_id, None)
