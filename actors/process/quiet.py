"""Run something once a stream of events pauses (a debounce on a thread of its own)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class WhenQuiet:
    """Calls ``action`` on a thread of its own once :meth:`poke` has not been called for the
    pause the latest poke named; at most one such thread at a time."""

    def __init__(self, action: Callable[[], None], name: str) -> None:
        self.action = action
        self.name = name
        self._until = 0.0
        self._pending = False

    def poke(self, pause_s: float) -> None:
        self._until = time.monotonic() + pause_s
        if not self._pending:
            self._pending = True
            threading.Thread(target=self._wait, name=self.name, daemon=True).start()

    def _wait(self) -> None:
        while (wait := self._until - time.monotonic()) > 0:
            time.sleep(wait)
        self._pending = False
        self.action()
