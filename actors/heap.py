"""Keep a long-lived data process's heap from growing with its write history (glibc).

glibc raises its mmap threshold each time a large block is freed, up to 32 MB. A shard frees
large blocks all the time (upsert batches, a growing faiss list, snapshot frames), so after a
while most multi-megabyte buffers come from the per-thread malloc arenas instead of mmap; Ray
runs actor calls on a pool of threads, each with its own arena, and the freed space stays
resident. Measured on a 50,000-item ingest of 128-d vectors in batches of 2,500 on 16 threads:
3,224 resident bytes per item, against 653 for the same shard loaded fresh; with the threshold
pinned, 841 (tests/unit/test_heap.py measures it). A gateway replica frees request bodies and
result buffers of megabytes: after 100,000 items upserted as JSON in requests of 5,000 it had
grown by 63 MB, pinned by 33 MB (both flat over two more such ingests).

Pinning M_MMAP_THRESHOLD (which also stops the dynamic adjustment) sends every block of
128 KiB or more to mmap, so it is returned to the system when freed. Smaller blocks still come
from the arenas; a large one costs an mmap and its page faults, microseconds against the
milliseconds of the faiss work it serves. When many small blocks are freed at once (a training
rebuild replaces every inverted list), :func:`trim` gives their pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("vaultvec.heap")
M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD = 128 << 10  # glibc's initial default


def _glibc(symbol: str) -> Any:
    """A glibc function of this process, or None where there is no glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold for this process; False where that is not possible (no glibc)."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False  # not glibc: nothing to pin
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) failed", threshold)
    return ok


def trim() -> bool:
    """Give the free pages inside glibc's heaps back to the system (``malloc_trim(0)``); False
    where there is no glibc. For after a burst of frees of small blocks, such as the inverted
    lists of a partition replaced by training: blocks under the mmap threshold come from the
    malloc arenas, and their pages stay resident until trimmed."""
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is None:
        return False
    return bool(malloc_trim(0))


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
