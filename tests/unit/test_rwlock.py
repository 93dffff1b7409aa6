from __future__ import annotations

import threading
import time

from actors.engine.rwlock import RWLock


def test_readers_overlap_and_writers_exclude() -> None:
    lock = RWLock()
    inside = 0
    peak_readers = 0
    writer_saw_readers = []
    guard = threading.Lock()

    def reader() -> None:
        nonlocal inside, peak_readers
        with lock.read():
            with guard:
                inside += 1
                peak_readers = max(peak_readers, inside)
            time.sleep(0.05)
            with guard:
                inside -= 1

    def writer() -> None:
        with lock.write():
            writer_saw_readers.append(inside)
            time.sleep(0.02)

    threads = [threading.Thread(target=reader) for _ in range(4)] + [
        threading.Thread(target=writer) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert peak_readers >= 2
    assert writer_saw_readers == [0, 0, 0]


def test_writer_is_reentrant_and_may_read() -> None:
    lock = RWLock()
    with lock.write(), lock.write(), lock.read():
        pass
    done = threading.Event()

    def other() -> None:
        with lock.write():
            done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=5)
    assert done.is_set()
