"""A line on stderr while a slow start goes on, so that a start that waits is never silent."""

from __future__ import annotations

import sys
import time

PROGRESS_EVERY_S = 5.0  # a slow start prints a line at most this often


class StartProgress:
    """A line on stderr, at most every :data:`PROGRESS_EVERY_S`, while a slow start goes on: how many of
    how many have started."""

    def __init__(self, total: int, what: str) -> None:
        self._total, self._what = total, what
        self._begun = time.monotonic()
        self._next_line, self._last_count = self._begun + PROGRESS_EVERY_S, -1

    def show(self, started: int) -> None:
        now = time.monotonic()
        if now >= self._next_line and started != self._last_count:
            print(f"parallelenv: started {started} of {self._total} {self._what} ({now - self._begun:.0f} s)",
                  file=sys.stderr, flush=True)
            self._next_line, self._last_count = now + PROGRESS_EVERY_S, started
