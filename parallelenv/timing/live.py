"""``ParallelEnv(stats="live")``: the stats' one line, rewritten in place on a terminal every few seconds.

Plain text on standard error, no dependency; nothing where standard error is
not a terminal (a log file gets no line per update). It reads the hosts'
clocks only after a ``step`` that left nothing under way, and never raises
into the step: a reading that fails turns the line off, saying why once.
"""

from __future__ import annotations

import sys
import warnings
from time import perf_counter
from typing import Any

LIVE_EVERY_S = 2.0


class LiveLine:
    def __init__(self, penv: Any, every_s: float = LIVE_EVERY_S, stream: Any = None) -> None:
        self._penv = penv
        self._stream = stream if stream is not None else sys.stderr
        self._every_s = every_s
        isatty = getattr(self._stream, "isatty", None)
        self.on = bool(isatty and isatty())
        self._next = perf_counter() + every_s

    def after_step(self) -> None:
        if not self.on or perf_counter() < self._next:
            return
        self._next = perf_counter() + self._every_s
        try:
            if self._penv._calls.outstanding:
                return
            line = self._penv._read_stats("live").line()  # its own window: the caller's stats(recent=True) stay whole
            self._stream.write("\r\033[K" + line)
            self._stream.flush()
        except Exception as exc:  # noqa: BLE001  (a display never stops a training loop)
            self.on = False
            warnings.warn(f"ParallelEnv(stats='live'): the live line is off: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)

    def end(self) -> None:
        if self.on:
            self._stream.write("\n")
            self.on = False
