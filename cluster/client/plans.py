"""The request plans of an index handle (cluster.client.index): what each call sends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import cluster.client.calls as calls
from cluster.client.calls import Call, Plan
from cluster.client.runner import Limits

R = TypeVar("R", bound=Limits)


class IndexPlans(Generic[R]):
    """What an index handle sends; ``Index`` runs the plans synchronously, ``AsyncIndex``
    awaits them."""

    def __init__(self, client: R, name: str, key: str) -> None:
        self.client = client
        self.name = name
        self.key = key
        self._ref = {"index_name": name, "index_key": key}

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.name!r})"

    def _upsert(self, ids: Any, vectors: Any, metadata: Any, contents: Any, binary: Any) -> Plan:
        c = self.client
        return calls.upsert(
            self._ref,
            ids,
            vectors,
            metadata,
            contents,
            binary,
            c.binary_threshold,
            c.max_request_bytes,
        )

    def _query(
        self, vectors: Any, contents: str | None, top_k: int | None, binary: Any, **options: Any
    ) -> Plan:
        c = self.client
        options = calls.drop_none(**options)
        return calls.query(
            self._ref,
            vectors,
            contents,
            top_k,
            options,
            binary,
            c.binary_threshold,
            c.max_request_bytes,
        )

    def _query_metadata(
        self,
        filters: dict[str, Any] | None,
        top_k: int | None,
        include: Sequence[str] | None,
        order_by: str | dict[str, int] | None,
        ascending: bool | None,
        text: dict[str, Any],
    ) -> Call:
        return self._call(
            "vectors/query_metadata",
            filters=filters,
            top_k=top_k,
            include=None if include is None else list(include),
            order_by=order_by,
            ascending=ascending,
            **text,
        )

    def _page(
        self, filters: dict[str, Any] | None, include: Sequence[str] | None, size: int, cursor: Any
    ) -> Call:
        return self._call(
            "vectors/query_metadata",
            filters=filters,
            include=None if include is None else list(include),
            limit=size,
            cursor=cursor,
        )

    def _delete(
        self, ids: Sequence[str] | None, filters: dict[str, Any] | None, all: bool | None
    ) -> Call:
        return self._call(
            "vectors/delete", ids=None if ids is None else list(ids), filters=filters, all=all
        )

    def _update(
        self,
        ids: Sequence[str] | None,
        filters: dict[str, Any] | None,
        all: bool | None,
        set: dict[str, Any] | None,
        unset: Sequence[str] | None,
        contents: str | None,
    ) -> Call:
        doc = calls.drop_none(**{"$set": set, "$unset": None if unset is None else list(unset)})
        return self._call(
            "vectors/update",
            ids=None if ids is None else list(ids),
            filters=filters,
            all=all,
            update=doc,
            contents=contents,
        )

    def _train(
        self,
        n_lists: int | None,
        batch_size: int | None,
        max_iters: int | None,
        tolerance: float | None,
        max_memory: int | None,
    ) -> Call:
        return self._call(
            "indexes/train",
            n_lists=n_lists,
            batch_size=batch_size,
            max_iters=max_iters,
            tolerance=tolerance,
            max_memory=max_memory,
        )

    def _call(self, route: str, **fields: Any) -> Call:
        return Call(f"/v1/{route}", {**self._ref, **calls.drop_none(**fields)})

    def _rotate(self, new_key: str) -> Call:
        return self._call("indexes/rotate_key", new_index_key=new_key)

    def _probe(self, key: str) -> Call:
        """A call only ``key`` answers (whether the index's key is ``key`` now)."""
        return Call("/v1/vectors/num_vectors", {"index_name": self.name, "index_key": key})

    def _use_key(self, key: str) -> None:
        self.key = key
        self._ref = {"index_name": self.name, "index_key": key}
