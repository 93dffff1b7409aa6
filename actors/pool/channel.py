"""Same-node calls to a pool actor over a Unix socket: the gateway's searches and small gets of
the partitions a pool actor on its own node hosts skip Ray's task machinery.

A Ray actor call costs a single query far more time, and CPU on each side, than the search
itself; a round trip over a Unix socket costs a small fraction of that (figures:
docs/performance.md, Serve fast path). So each pool actor answers the same calls (framed
searches and gets: bytes in, bytes out, actors.pool.wire) on a socket of its own as well, and a
gateway on the same Ray node sends them there. Everything else, and every call to another
node, goes through Ray.

- **Private.** The socket lies in a directory only the service's user may enter (0700; one
  that is not is never used), and the server answers only peers of that user (SO_PEERCRED):
  calls are pickled, as Ray's are, so whoever could connect could run code in the actor. They
  carry what the Ray call would: the partition, the index's key, the request. Each server's
  socket has a name of its own (a random part), so a gateway reaches the actor that told it
  the name or none.
- **Nothing changes on failure.** A call the channel cannot complete (the actor restarting or
  gone, the socket missing, too many calls under way) goes through Ray instead, which retries,
  restarts and reports as for any other call; the channel is looked up again a moment later. What
  the partition raises (a wrong key, a retired index) is raised as the Ray call's cause would
  be; anything else is left to the Ray call to report.
- **Bounded.** A gateway keeps at most :data:`actors.constants.CHANNEL_MAX_CONNECTIONS`
  connections to each actor; a server takes at most
  :data:`actors.constants.CHANNEL_MAX_PEERS` at a time, each on a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from actors import constants
from actors.errors import VaultvecError
from actors.process import private

log = logging.getLogger("vaultvec.channel")

FRAMED = 1  # the one call: a frame of actors.pool.wire, answered by ShardPool.framed
OK, RAISED, FAILED = 0, 1, 2  # answers: the result; a VaultvecError, pickled; anything else
HEADER = struct.Struct("<IB")  # payload length, call or answer


class ChannelError(Exception):
    """The channel could not complete the call: send it through Ray."""


class Busy(ChannelError):
    """As many calls as the channel takes are under way."""


class Declined(ChannelError):
    """The call failed in the actor otherwise than by a VaultvecError: the Ray call reports it
    (it runs the call once more, as a retry of a failed shard call does)."""


# -- the pool actor's side --------------------------------------------------------------------
def socket_directory() -> str | None:
    """Where a pool actor's socket goes: the private directory, where the kernel tells a
    socket's peer (Linux); else None."""
    return private.runtime_directory() if hasattr(socket, "SO_PEERCRED") else None


class ChannelServer:
    """Answers ``handlers`` (call number -> bytes -> bytes) on a Unix socket, one thread per
    connection, until closed or the process ends."""

    def __init__(self, handlers: Mapping[int, Callable[[bytes], bytes]], directory: str) -> None:
        self.handlers = handlers
        # A name no other server will have: a gateway holding this path reaches this server or
        # none (another actor with this pid, after a restart, binds another name).
        name = f"pool-{os.getpid()}-{secrets.token_hex(8)}.sock"
        self.path = os.path.join(directory, name)
        remove_stale(directory)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self._peers = threading.BoundedSemaphore(constants.CHANNEL_MAX_PEERS)
        self._conns: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="vaultvec-channel", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                # out of file descriptors, say: connections wait in the backlog meanwhile
                time.sleep(0.1)
                continue
            if not self._peers.acquire(blocking=False):
                conn.close()  # the gateway sends this call through Ray
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="vaultvec-channel-peer", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: this call goes through Ray
                conn.close()
                self._peers.release()

    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        try:
            with conn:
                if not _same_user(conn):
                    return
                while True:
                    head = _recv(conn, HEADER.size)
                    if head is None:
                        return
                    size, call = HEADER.unpack(head)
                    payload = _recv(conn, size) if size <= constants.CHANNEL_MAX_PAYLOAD else None
                    handler = self.handlers.get(call)
                    if payload is None or handler is None:
                        return
                    status, answer = _answer(handler, payload)
                    conn.sendall(HEADER.pack(len(answer), status) + answer)
        except OSError:
            pass  # the gateway went away mid-call
        finally:
            self._conns.discard(conn)
            self._peers.release()

    def close(self) -> None:
        """Stop serving: the socket removed, its threads ended."""
        self._closed = True
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        for sock in (self._sock, *list(self._conns)):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
        self._sock.close()


def _answer(handler: Callable[[bytes], bytes], payload: bytes) -> tuple[int, bytes]:
    try:
        return OK, handler(payload)
    except VaultvecError as exc:
        try:
            return RAISED, pickle.dumps(exc, protocol=5)
        except Exception:
            return FAILED, b""
    except Exception:
        return FAILED, b""  # the Ray call reports it, as it reports any failure of the actor


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _recv(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = conn.recv_into(view[got:])
        if not r:
            return None
        got += r
    return bytes(buf)


def remove_stale(directory: str) -> None:
    """Sockets of pool actors that are gone (killed: nothing removed theirs)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith("pool-") and name.endswith(".sock")):
                continue
            pid = name[5:].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the gateway's side -----------------------------------------------------------------------
class Channel:
    """Connections to one pool actor's socket."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._open = 0  # connections, idle or in use
        self._loop: asyncio.AbstractEventLoop | None = None  # theirs
        self._generation = 0  # of the connections: a new loop starts a new one
        self._closed = False

    async def call(self, call: int, payload: bytes) -> bytes:
        """The handler's answer; raises what the partition raised, or ChannelError."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._drop_idle()
            self._open, self._loop = 0, loop
            self._generation += 1
        generation = self._generation
        if self._idle:
            reader, writer = self._idle.pop()
        elif self._open >= constants.CHANNEL_MAX_CONNECTIONS:
            raise Busy("too many calls under way")
        else:
            self._open += 1
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
            except BaseException as exc:
                if generation == self._generation:
                    self._open -= 1
                if isinstance(exc, OSError):
                    raise ChannelError(str(exc)) from None
                raise
        try:
            writer.write(HEADER.pack(len(payload), call))
            writer.write(payload)
            size, status = HEADER.unpack(await reader.readexactly(HEADER.size))
            answer = await reader.readexactly(size)
        except BaseException as exc:  # the connection is in an unknown state: closed
            self._done(reader, writer, generation, keep=False)
            if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
                raise ChannelError(str(exc)) from None
            raise
        self._done(reader, writer, generation, keep=True)
        if status == OK:
            return answer
        if status == RAISED:
            raise pickle.loads(answer)
        raise Declined("the call failed in the actor")

    def _done(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        generation: int,
        keep: bool,
    ) -> None:
        """A call's connection after it: kept for the next call, or closed."""
        if generation != self._generation:  # opened on a loop that was replaced meanwhile
            _close(writer)
        elif keep and len(self._idle) < constants.CHANNEL_MAX_IDLE and not self._closed:
            self._idle.append((reader, writer))
        else:
            self._open -= 1
            _close(writer)

    def _drop_idle(self) -> None:
        for _, writer in self._idle:
            _close(writer)
        self._open -= len(self._idle)
        self._idle.clear()

    def close(self) -> None:
        """Close the idle connections; those in use close when their calls end."""
        self._closed = True
        self._drop_idle()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: the socket closes when collected
        writer.close()


class Channels:
    """This process's channels, by pool actor: looked up once (one Ray call to the actor),
    used while they work."""

    def __init__(self) -> None:
        self.enabled = False
        self._node: str | None = None
        self._known: dict[str, Channel | None] = {}
        self._lookups: dict[str, asyncio.Future[Channel | None]] = {}
        self._retry_at: dict[str, float] = {}

    def enable(self, enabled: bool = True, node: str | None = None) -> None:
        """Use channels in this process (the gateway) to actors on ``node`` (default: this
        process's Ray node)."""
        if enabled and node is None:
            import ray

            node = ray.get_runtime_context().get_node_id()
        self._node = node
        self.enabled = enabled

    async def of(self, handle: Any) -> Channel | None:
        """The channel to the actor of ``handle``, or None (another node, not yet known)."""
        if not self.enabled:
            return None
        actor_id = getattr(handle, "_actor_id", None)
        if actor_id is None:
            return None
        key = actor_id.hex()
        if key in self._known:
            return self._known[key]
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return None
        lookup = self._lookups.get(key)
        if lookup is None or lookup.get_loop() is not asyncio.get_running_loop():
            lookup = asyncio.ensure_future(self._look_up(key, handle))
            self._lookups[key] = lookup
        return await asyncio.shield(lookup)

    async def _look_up(self, key: str, handle: Any) -> Channel | None:
        try:
            where = await handle.local_channel.remote()
        except Exception:  # the actor is restarting, say: Ray's path, tried again later
            self._retry_at[key] = time.monotonic() + constants.CHANNEL_RETRY_S
            return None
        finally:
            self._lookups.pop(key, None)
        channel = None
        if where is not None and where[0] == self._node:
            channel = Channel(where[1])
        self._known[key] = channel
        return channel

    def failed(self, handle: Any, channel: Channel) -> None:
        """``channel`` could not complete a call: Ray's path for a while, then a new lookup
        (a restarted actor has a socket of its own)."""
        key = handle._actor_id.hex()
        if self._known.get(key) is channel:
            del self._known[key]
            self._retry_at[key] = time.monotonic() + constants.CHANNEL_RETRY_S
        channel.close()


CHANNELS = Channels()


async def call(handle: Any, call: int, payload: bytes) -> bytes | None:
    """``payload``'s answer over the actor's channel, or None: send it through Ray."""
    channel = await CHANNELS.of(handle)
    if channel is None:
        return None
    try:
        return await channel.call(call, payload)
    except ChannelError as exc:
        log.debug("channel to %s: %s; the call goes through Ray", channel.path, exc)
        if not isinstance(exc, (Busy, Declined)):
            CHANNELS.failed(handle, channel)
        return None
