"""glibc's allocator, set for long-lived data processes: bounded heaps, no page-fault storms.

Two defaults of glibc hurt a shard or a gateway replica:

- **One malloc arena per thread.** Ray runs a shard's calls on a pool of threads; with the
  default dynamic mmap threshold, the large blocks an ingest frees stay resident in the
  threads' arenas, several times the data's own size (tests/unit/test_heap.py).
- **Large blocks from mmap.** Pinning the mmap threshold at glibc's initial 128 KiB bounds
  that growth, but then every large request's buffers (a query batch's queries, their
  reordered copy, results, the merge's offsets) are fresh mappings, and each of their pages
  faults in on first touch: large requests slow down, the gateway's merge most of all.

:func:`configure` (and :data:`ENV`, the same settings for a process's environment) keeps one
arena, so memory freed by one thread is reused by the next, and fixes the mmap threshold
(actors.constants.MMAP_THRESHOLD) above request-sized buffers: those are recycled inside the
heap, only larger ones (snapshot frames, the longest inverted lists) are mapped and unmapped.
What a burst of frees leaves inside the heap (a training rebuild replaces every inverted list;
loading replays the WAL) is given back by :func:`trim`. The figures behind these settings are
in docs/performance.md (measurements behind design choices).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
from pathlib import Path
from typing import Any

from actors import constants

log = logging.getLogger("vaultvec.heap")
M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# The same settings as environment variables, read by glibc when the process starts (before
# any thread has made an arena): for the runtime_env of the Ray actors that hold data. The trim
# threshold is named too: Ray actors inherit the environment of the actor that creates them,
# and the control plane that creates the shards is itself created by a gateway.
ENV = {
    "MALLOC_ARENA_MAX": str(constants.ARENA_MAX),
    "MALLOC_MMAP_THRESHOLD_": str(constants.MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(constants.TRIM_THRESHOLD),
}
# A gateway holds no data, only requests in flight: it keeps more free memory at the top of its
# heap (constants.GATEWAY_TRIM_THRESHOLD, fixed like the mmap threshold once that is set), so
# the next request's buffers reuse resident pages instead of faulting them in again. Shards keep
# the default: what they keep resident is their memory budget.
GATEWAY_ENV = ENV | {"MALLOC_TRIM_THRESHOLD_": str(constants.GATEWAY_TRIM_THRESHOLD)}
# Shard pool actors also turn off glibc's per-thread cache of freed blocks (tcache): Ray runs an
# actor's calls on up to max_concurrency threads, and each thread's cache kept blocks that the
# others could not reuse, so memory per live item crept up with every round of replacements
# (figures: docs/performance.md).
SHARD_ENV = ENV | {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def _glibc(symbol: str) -> Any:
    """A glibc function of this process, or None where there is no glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None


def configure(
    threshold: int = constants.MMAP_THRESHOLD,
    arenas: int = constants.ARENA_MAX,
    trim_threshold: int = constants.TRIM_THRESHOLD,
) -> bool:
    """Apply this module's allocator settings to the running process (threads that already
    have an arena keep it: :data:`ENV` covers those from the start); False without glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False  # not glibc: nothing to set
    ok = all(
        mallopt(option, value)
        for option, value in (
            (M_ARENA_MAX, arenas),
            (M_MMAP_THRESHOLD, threshold),
            (M_TRIM_THRESHOLD, trim_threshold),
        )
    )
    if not ok:
        log.warning(
            "mallopt(arena max %d, mmap threshold %d, trim threshold %d) failed",
            arenas,
            threshold,
            trim_threshold,
        )
    return ok


def trim(collect: bool = False) -> bool:
    """Give the free pages inside glibc's heaps back to the system (``malloc_trim(0)``); False
    where there is no glibc. For after a burst of frees of small blocks, such as the inverted
    lists of a partition replaced by training: blocks under the mmap threshold come from the
    malloc arenas, and their pages stay resident until trimmed.

    ``collect``: run Python's cycle collector first. What a finished request left in reference
    cycles keeps its buffers until a collection runs, and a process gone quiet allocates too
    little to start one: a gateway gone quiet after an ingest kept them (figures:
    docs/performance.md)."""
    if collect:
        gc.collect()
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is None:
        return False
    return bool(malloc_trim(0))


class IdleTrim:
    """When to give the heap's free pages back in a process that keeps them for speed while
    busy (a gateway's trim threshold): once no request has begun for ``quiet_s`` after requests
    read at least ``after_bytes`` since the last trim. The buffers of a burst of large requests
    (an ingest) then do not stay resident after it ends, however its last requests fall, and a
    steady load, never quiet that long, never waits for a trim. Thread-safe.

    A request calls :meth:`begin`, then :meth:`end` with the bytes it read; a mark from
    :meth:`end` is checked with :meth:`due` ``quiet_s`` later. (A thread can instead ask
    :meth:`quiet` every ``quiet_s``.)"""

    def __init__(self, after_bytes: int, quiet_s: float) -> None:
        self.after_bytes = after_bytes
        self.quiet_s = quiet_s
        self._lock = threading.Lock()
        self._in_flight = 0
        self._begun = 0
        self._ended = 0
        self._read = 0
        self._polled = (0, 0)  # (begun, ended) at the last call of quiet()

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._begun += 1

    def end(self, read_bytes: int) -> int | None:
        """A request that read ``read_bytes`` ended: a mark for :meth:`due` when a trim may be
        due once the process stays quiet, else None."""
        with self._lock:
            self._in_flight -= 1
            self._ended += 1
            self._read += read_bytes
            if self._in_flight or self._read < self.after_bytes:
                return None
            return self._begun

    def due(self, mark: int) -> bool:
        """True, and the count of bytes restarted, when no request has begun since ``mark``
        was given: the caller trims now."""
        with self._lock:
            if self._begun != mark or self._in_flight or self._read < self.after_bytes:
                return False
            self._read = 0
            return True

    def quiet(self) -> bool:
        """For a thread that calls this every ``quiet_s``: True when no request is in flight and
        none began or ended since the previous call."""
        with self._lock:
            now = (self._begun, self._ended)
            quiet = now == self._polled and not self._in_flight
            self._polled = now
            return quiet


def resident_anon_bytes(pid: int | str = "self") -> int | None:
    """A process's private resident memory (Linux RssAnon; this one's by default), or None
    where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
