"""The same-node channel to a pool actor (actors.pool.channel), without Ray: searches and small gets
answered over the actor's Unix socket with the answers the Ray call gives, the partition's
errors raised as they are, and every call the channel cannot complete sent through Ray."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from actors import constants
from actors.errors import IndexRetired, Unauthorized
from actors.pool import channel
from actors.pool.actor import ShardPool
from actors.pool.client import ShardClient
from actors.process import private
from tests.helpers import clustered
from tests.unit.test_pool import KEY_A, KEY_B, LocalHandle, catalogued, pool
from tests.unit.test_shard import batch, exact_ids, one_list

NODE = "node-1"


class PoolHandle(LocalHandle):
    """LocalHandle with an actor id and the node its actor reports for its channel."""

    def __init__(self, target: ShardPool, node: str = NODE) -> None:
        super().__init__(target)
        self._actor_id = SimpleNamespace(hex=lambda: f"actor-{id(target)}")
        self.node = node

    def __getattr__(self, name: str) -> Any:
        if name != "local_channel":
            return super().__getattr__(name)
        handle = self

        class Method:
            @staticmethod
            def remote() -> Any:
                handle.calls.append(name)

                async def answer() -> Any:
                    where = handle.target.local_channel()
                    return None if where is None else (handle.node, where[1])

                return answer()

        return Method


@pytest.fixture
def channels(monkeypatch: pytest.MonkeyPatch) -> channel.Channels:
    fresh = channel.Channels()
    fresh.enable(True, node=NODE)
    monkeypatch.setattr(channel, "CHANNELS", fresh)
    return fresh


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ShardPool, Any, np.ndarray]]:
    p = pool(tmp_path)
    part = catalogued(tmp_path, "a", "ida")
    x = clustered(80, 8, seed=11)
    p.upsert(part, KEY_A, batch(x, 0))
    yield p, part, x
    if p._channel is not None:
        p._channel.close()


def test_same_node_searches_and_gets_cross_the_socket_with_the_ray_call_s_answers(
    served: tuple[ShardPool, Any, np.ndarray], channels: channel.Channels
) -> None:
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)

    async def run() -> tuple[list[Any], Any]:
        results = [await client.search(KEY_A, one_list(x[i : i + 2])) for i in range(5)]
        return results, await client.get(KEY_A, ["id3", "id1", "nope"], True, True, True)

    results, fetched = asyncio.run(run())
    for i, res in enumerate(results):
        assert res.ids.tolist() == exact_ids(x, x[i : i + 2], 5)
    assert fetched.ids == p.get(part, KEY_A, ["id3", "id1", "nope"], True, True, True).ids
    assert fetched.vectors is not None and np.array_equal(fetched.vectors, x[[3, 1]])
    assert handle.calls == ["local_channel"]  # looked up once; no search or get through Ray


def test_the_partition_s_errors_cross_as_raised(
    served: tuple[ShardPool, Any, np.ndarray], channels: channel.Channels
) -> None:
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)
    with pytest.raises(Unauthorized):
        asyncio.run(client.search(KEY_B, one_list(x[:1])))
    p.retire(part.index_id)
    with pytest.raises(IndexRetired):
        asyncio.run(client.search(KEY_A, one_list(x[:1])))
    assert handle.calls == ["local_channel"]


def test_another_node_s_actor_and_a_disabled_channel_go_through_ray(
    served: tuple[ShardPool, Any, np.ndarray], channels: channel.Channels
) -> None:
    p, part, x = served
    handle = PoolHandle(p, node="node-2")
    client = ShardClient(handle, part)
    for _ in range(2):
        asyncio.run(client.search(KEY_A, one_list(x[:1])))
    assert handle.calls == ["local_channel", "framed", "framed"]
    channels.enable(False)
    local = PoolHandle(p)
    asyncio.run(ShardClient(local, part).search(KEY_A, one_list(x[:1])))
    assert local.calls == ["framed"]


def test_a_gone_socket_sends_calls_through_ray_and_is_looked_up_again(
    served: tuple[ShardPool, Any, np.ndarray],
    channels: channel.Channels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted actor: its old socket is gone; the call that finds it so is answered through
    Ray, and the next lookup finds the actor's new socket."""
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)
    want = exact_ids(x, x[:2], 5)

    async def search() -> list[Any]:
        res = await client.search(KEY_A, one_list(x[:2]))
        return list(res.ids.tolist())

    assert asyncio.run(search()) == want
    assert p._channel is not None
    p._channel.close()
    p._channel = None  # the restarted actor starts a new server when asked
    assert asyncio.run(search()) == want
    assert handle.calls == ["local_channel", "framed"]
    assert asyncio.run(search()) == want  # within CHANNEL_RETRY_S: Ray, no new lookup
    assert handle.calls[-1] == "framed"
    monkeypatch.setattr(constants, "CHANNEL_RETRY_S", 0.0)
    channels._retry_at.clear()
    n = len(handle.calls)
    for _ in range(3):
        assert asyncio.run(search()) == want
    assert handle.calls[n:] == ["local_channel"]  # the new socket answers the rest


def test_an_actor_gone_between_two_calls_on_one_connection_sends_the_next_through_ray(
    served: tuple[ShardPool, Any, np.ndarray], channels: channel.Channels
) -> None:
    """The kept connection meets the end of the file (the actor died): that call goes through
    Ray with the right answer."""
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)

    async def run() -> None:
        first = await client.search(KEY_A, one_list(x[:1]))
        assert first.ids.tolist() == exact_ids(x, x[:1], 5)
        assert p._channel is not None
        p._channel.close()  # its connections shut: the kept one reads the end of the file
        second = await client.search(KEY_A, one_list(x[2:3]))
        assert second.ids.tolist() == exact_ids(x, x[2:3], 5)

    asyncio.run(run())
    assert handle.calls == ["local_channel", "framed"]


def test_other_failures_in_the_actor_are_left_to_the_ray_call(
    served: tuple[ShardPool, Any, np.ndarray], channels: channel.Channels
) -> None:
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)
    asyncio.run(client.search(KEY_A, one_list(x[:1])))  # the channel is up
    assert p._channel is not None
    handlers = dict(p._channel.handlers)
    p._channel.handlers = {**handlers, channel.FRAMED: lambda _: 1 / 0}
    res = asyncio.run(client.search(KEY_A, one_list(x[:1])))
    assert res.ids.tolist() == exact_ids(x, x[:1], 5)  # Ray's call ran it
    assert handle.calls == ["local_channel", "framed"]
    p._channel.handlers = handlers
    asyncio.run(client.search(KEY_A, one_list(x[:1])))
    assert handle.calls == ["local_channel", "framed"]  # the channel stays in use


def test_a_cancelled_call_drops_its_connection_and_calls_beyond_the_cap_go_through_ray(
    served: tuple[ShardPool, Any, np.ndarray],
    channels: channel.Channels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, part, x = served
    handle = PoolHandle(p)
    client = ShardClient(handle, part)
    want = exact_ids(x, x[:1], 5)
    asyncio.run(client.search(KEY_A, one_list(x[:1])))
    assert p._channel is not None
    release = threading.Event()
    real = p._channel.handlers[channel.FRAMED]

    def slow(call: bytes) -> bytes:
        release.wait(10)
        return real(call)

    monkeypatch.setitem(p._channel.handlers, channel.FRAMED, slow)
    monkeypatch.setattr(constants, "CHANNEL_MAX_CONNECTIONS", 1)

    async def run() -> None:
        held = asyncio.ensure_future(client.search(KEY_A, one_list(x[:1])))
        await asyncio.sleep(0.2)
        # the one connection is taken: this call goes through Ray meanwhile
        busy = await client.search(KEY_A, one_list(x[:1]))
        assert busy.ids.tolist() == want and handle.calls[-1] == "framed"
        held.cancel()  # the caller's deadline: its connection is closed, not reused
        with pytest.raises(asyncio.CancelledError):
            await held
        release.set()
        n = len(handle.calls)
        # another query: an answer left unread on a reused connection would show here
        again = await client.search(KEY_A, one_list(x[5:6]))
        assert again.ids.tolist() == exact_ids(x, x[5:6], 5)
        assert len(handle.calls) == n  # over the socket, on a new connection

    asyncio.run(run())


def test_the_socket_is_private_and_stale_sockets_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(private.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv(private.ENV, raising=False)
    shared = tmp_path / f"vaultvec-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # someone else could enter it: never used
    assert channel.socket_directory() is None
    shared.chmod(0o700)
    assert channel.socket_directory() == str(shared)
    # a socket left by a killed actor: pid 2**22 + 1 is above Linux's pid_max
    stale = shared / f"pool-{2**22 + 1}-0.sock"
    stale.touch()
    server = channel.ChannelServer({channel.FRAMED: lambda b: b}, str(shared))
    try:
        assert not stale.exists()
        mode = os.stat(server.path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600

        async def echo() -> bytes:
            return await channel.Channel(server.path).call(channel.FRAMED, b"ping")

        assert asyncio.run(echo()) == b"ping"
        held = socket.socket(socket.AF_UNIX)  # a peer that stays connected
        held.connect(server.path)
        held.sendall(channel.HEADER.pack(4, channel.FRAMED) + b"pong")
        assert held.recv(64) == channel.HEADER.pack(4, channel.OK) + b"pong"
    finally:
        server.close()
    assert not os.path.exists(server.path)
    for _ in range(100):  # closing ends its threads (they hold the pool actor's methods)
        if not any(t.name.startswith("vaultvec-channel") for t in threading.enumerate()):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the server's threads outlived it")
    held.close()


def test_a_socket_that_is_not_there_is_a_failure_not_a_busy_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "CHANNEL_MAX_CONNECTIONS", 1)
    ch = channel.Channel(str(tmp_path / "gone.sock"))

    async def run() -> None:
        for _ in range(3):  # each a failed connection, none left counted as open
            with pytest.raises(channel.ChannelError) as raised:
                await ch.call(channel.FRAMED, b"x")
            assert not isinstance(raised.value, channel.Busy)

    asyncio.run(run())


def test_a_peer_of_another_user_is_not_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    server = channel.ChannelServer({channel.FRAMED: lambda b: b}, str(directory))
    real_uid = os.getuid()
    try:
        monkeypatch.setattr(channel.os, "getuid", lambda: real_uid + 1)  # as the server sees it
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(server.path)
            s.settimeout(5)
            answer = b""
            # closed before the request is sent or read (a broken pipe, a reset) or after it
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(channel.HEADER.pack(4, channel.FRAMED) + b"ping")
                answer = s.recv(16)
            assert answer == b""  # no answer either way
    finally:
        server.close()


def test_a_channel_closed_mid_call_answers_it_and_keeps_no_connection(tmp_path: Path) -> None:
    """A channel dropped after a failure: a call it had under way still gets its answer, and
    its connection is closed afterwards rather than kept for calls that will not come."""
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    release = threading.Event()

    def slow(payload: bytes) -> bytes:
        release.wait(10)
        return payload

    server = channel.ChannelServer({channel.FRAMED: slow}, str(directory))
    try:

        async def run() -> None:
            ch = channel.Channel(server.path)
            call = asyncio.ensure_future(ch.call(channel.FRAMED, b"x"))
            await asyncio.sleep(0.2)
            ch.close()
            release.set()
            assert await call == b"x"
            assert ch._open == 0 and not ch._idle

        asyncio.run(run())
        for _ in range(100):  # the server saw the connection close
            if not server._conns:
                break
            time.sleep(0.02)
        assert not server._conns
    finally:
        server.close()
