"""The gateway's shard-failure policy, with fake shard handles (no Ray).

A restarting shard is retried within a bounded budget; a shard that stays away turns the whole
request into a 503 naming it (never a partial answer); a shard that is gone for good or retired
makes the engine look the index up again: deleted -> 404, re-created -> StaleIndex (the request
runs again once), same incarnation -> fresh handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors.control.client import ControlClient
from actors.control.options import IndexView
from actors.errors import (
    IndexNotFound,
    IndexRetired,
    InternalError,
    InvalidRequest,
    Unavailable,
)
from actors.pool import wire
from actors.pool.client import ShardClient
from actors.types import IndexConfig, IndexMeta, ShardStats, UpsertBatch
from serve_app.gateway.calls import StaleIndex, retry_stale
from serve_app.gateway.engine import CachedView, Engine

META = IndexMeta("idx", "id-1", b"salt", b"verifier")


class Ref:
    """What ``handle.method.remote(...)`` returns: awaitable once."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def __await__(self) -> Any:
        async def run() -> Any:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            if isinstance(self.outcome, float):  # seconds to hang
                await asyncio.sleep(self.outcome)
            return self.outcome

        return run().__await__()


class Shard:
    """A fake shard handle answering ``stats`` from a script of outcomes, then ``value``."""

    def __init__(self, value: Any, script: list[Any] | None = None) -> None:
        self.value, self.script, self.calls = value, list(script or []), 0

    @property
    def stats(self) -> Shard:
        return self

    def remote(self, *args: Any) -> Ref:
        self.calls += 1
        return Ref(self.script.pop(0) if self.script else self.value)


class Control:
    def __init__(self, lookup: Callable[[], Any], view: Callable[[], IndexView]) -> None:
        self._lookup, self._view = lookup, view
        self.lookups = self.views = 0

    @property
    def lookup(self) -> Any:
        control = self

        class Method:
            def remote(self, name: str) -> Ref:
                control.lookups += 1
                try:
                    return Ref(control._lookup())
                except Exception as exc:
                    return Ref(exc)

        return Method()

    @property
    def view(self) -> Any:
        control = self

        class Method:
            def remote(self, name: str, key: bytes) -> Ref:
                control.views += 1
                return Ref(control._view())

        return Method()


def cached(*shards: Shard, meta: IndexMeta = META) -> CachedView:
    cfg = IndexConfig(
        name="idx",
        index_id=meta.index_id,
        index_type="ivfflat",
        metric="euclidean",
        n_shards=len(shards),
    )
    return CachedView(IndexView(meta, cfg, tuple(shards), None), b"k" * 32, None)


def engine(control: Control | None = None, retries: int = 3, timeout_s: float = 5.0) -> Engine:
    ctl = control or Control(lambda: META, lambda: pytest.fail("unexpected view"))
    return Engine(ControlClient(ctl), retries=retries, retry_backoff_s=0.001, timeout_s=timeout_s)


def stats_of(shard: ShardClient) -> Any:
    return shard.stats(b"k" * 32)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def unavailable() -> ActorUnavailableError:
    return ActorUnavailableError("restarting", None)


def test_a_restarting_shard_is_retried_and_the_answer_is_complete() -> None:
    a, b = Shard("a", [unavailable(), unavailable()]), Shard("b")
    cv = cached(a, b)
    assert run(engine().all_shards(cv, stats_of)) == ["a", "b"]
    assert a.calls == 3 and b.calls == 1


def test_a_shard_that_stays_away_fails_the_whole_request_with_503() -> None:
    a, b = Shard("a", [unavailable()] * 10), Shard("b")
    with pytest.raises(Unavailable) as info:
        run(engine(retries=2).all_shards(cached(a, b), stats_of))
    assert "shard 0 of index 'idx' is unavailable (tried 3 times)" in info.value.detail
    assert a.calls == 3  # bounded: retries + 1


def test_a_hung_shard_is_a_503_after_the_timeout() -> None:
    with pytest.raises(Unavailable, match="did not answer within"):
        run(engine(timeout_s=0.05).all_shards(cached(Shard(10.0), Shard("b")), stats_of))


def test_request_errors_from_a_shard_are_not_retried() -> None:
    a = Shard("a", [InvalidRequest("bad dimension")])
    with pytest.raises(InvalidRequest, match="bad dimension"):
        run(engine().all_shards(cached(a), stats_of))
    assert a.calls == 1


def test_a_dead_shard_of_a_live_index_is_replaced_through_the_control_plane() -> None:
    replacement = Shard("new")
    control = Control(lambda: META, lambda: cached(replacement).view)
    dead = Shard("old", [ActorDiedError()] * 10)
    assert run(engine(control).all_shards(cached(dead), stats_of)) == ["new"]
    assert control.lookups == 1 and control.views == 1 and dead.calls == 1


def test_a_retired_shard_of_a_deleted_index_is_a_404() -> None:
    def gone() -> Any:
        raise IndexNotFound("index 'idx' not found")

    control = Control(gone, lambda: pytest.fail("no view of a deleted index"))
    eng = engine(control)
    eng._views["idx"] = cv = cached(Shard("x", [IndexRetired()]))
    with pytest.raises(IndexNotFound):
        run(eng.all_shards(cv, stats_of))
    assert "idx" not in eng._views


def test_a_recreated_index_raises_stale_and_the_request_runs_again() -> None:
    recreated = IndexMeta("idx", "id-2", b"salt2", b"verifier2")
    control = Control(lambda: recreated, lambda: pytest.fail("stale views are not reloaded"))
    eng = engine(control)
    cv = cached(Shard("x", [ActorDiedError()]))
    with pytest.raises(StaleIndex):
        run(eng.all_shards(cv, stats_of))

    attempts: list[int] = []

    async def request() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise StaleIndex()
        return "answer from the new index"

    assert run(retry_stale(request)) == "answer from the new index"
    assert len(attempts) == 2


def test_stale_twice_is_a_503() -> None:
    async def request() -> str:
        raise StaleIndex()

    with pytest.raises(Unavailable):
        run(retry_stale(request))


class UpsertShard:
    """A fake shard handle answering ``upsert`` pieces from a script of outcomes."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.pieces = list(script), []

    @property
    def upsert(self) -> UpsertShard:
        return self

    def options(self, **_: Any) -> UpsertShard:
        return self

    def remote(self, partition: Any, key: bytes, batch: Any) -> Ref:
        self.pieces.append(list(batch.ids))
        outcome = self.script.pop(0) if self.script else ShardStats(len(batch.ids), 0, 0)
        return Ref(outcome)


def upsert_of(ids: list[str]) -> Any:
    x = np.zeros((len(ids), 4), dtype=np.float32)
    return lambda rows: UpsertBatch(
        [ids[r] for r in rows], x[rows], None, [None] * len(rows), [None] * len(rows)
    )


def test_an_upsert_some_shards_failed_names_the_items_not_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    whole = wire.pieces
    monkeypatch.setattr(wire, "pieces", lambda batch: whole(batch, 200))  # pieces of 2-3 items
    ids = [f"id-{i}" for i in range(40)]
    full = InternalError("store full")
    a = UpsertShard([ShardStats(1, 0, 0), full])  # its second piece fails
    b = UpsertShard([])  # all written
    cv = cached(a, b)  # type: ignore[arg-type]
    with pytest.raises(InternalError) as info:
        run(engine().upsert_batches(cv, ids, upsert_of(ids)))
    missing = info.value.errors[0]["ids"]  # type: ignore[index]
    written_b = {i for piece in b.pieces for i in piece}
    assert len(a.pieces) >= 2 and written_b, "both shards took some of the request"
    assert set(missing) == set(ids) - set(a.pieces[0]) - written_b  # exactly the others
    assert "not written" in info.value.detail
    # nothing written at all: the failure as it was, no list
    c = UpsertShard([InternalError("store full")] * 10)
    with pytest.raises(InternalError) as info:
        run(engine().upsert_batches(cached(c), ids, upsert_of(ids)))  # type: ignore[arg-type]
    assert info.value.errors is None and info.value.detail == "store full"
