"""A writer-preferring readers-writer lock: concurrent searches, exclusive writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None  # thread id of the writer
        self._writer_depth = 0
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._writer == me:  # a writer may read what it holds
            yield
            return
        with self._cond:
            while self._writer is not None or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:  # re-entrant for the holder
                self._writer_depth += 1
            else:
                self._waiting_writers += 1
                while self._writer is not None or self._readers:
                    self._cond.wait()
                self._waiting_writers -= 1
                self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if self._writer_depth == 0:
                    self._writer = None
                    self._cond.notify_all()

    @contextmanager
    def try_write(self) -> Iterator[bool]:
        """Exclusive access if it is free right now (no reader, writer or waiting writer):
        yields True holding it, or False at once without it (for background work that should
        never queue ahead of requests)."""
        with self._cond:
            got = self._writer is None and not self._readers and not self._waiting_writers
            if got:
                self._writer, self._writer_depth = threading.get_ident(), 1
        if not got:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self._writer_depth -= 1
                if self._writer_depth == 0:
                    self._writer = None
                    self._cond.notify_all()
