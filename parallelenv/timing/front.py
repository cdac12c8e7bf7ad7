"""The front's ``stats()`` and ``reset_stats()``: the caller's clock and the hosts' clocks read together."""

from __future__ import annotations

import time
from typing import Any

from parallelenv.timing.caller_clock import CallerClock, CallerReading
from parallelenv.timing.host_clock import TIMES_ATTRIBUTE
from parallelenv.timing.live import LiveLine
from parallelenv.timing.stats import Stats, build_stats

STATS_CHOICES = (False, True, "live")


class ShowsStats:
    """ParallelEnv's ``stats`` and ``reset_stats`` (see :mod:`parallelenv.timing`)."""

    _caller_clock: CallerClock | None = None
    _live: LiveLine | None = None
    _backend: Any
    _calls: Any
    _healing: Any

    def _start_stats(self, stats: Any) -> None:
        if stats not in STATS_CHOICES or isinstance(stats, int) and not isinstance(stats, bool):
            raise ValueError(f"stats={stats!r}; use False (the default: nothing measured), True, or 'live' "
                             "(True, and a line on a terminal every few seconds)")
        if not stats:
            return
        self._caller_clock = CallerClock(self._backend, self._calls)
        now = (time.time(), time.perf_counter(), [None] * self._backend.num_envs, None)
        # Where each window began: wall time, clock, the hosts' readings and the caller's then.
        self._window_starts: dict[str, tuple[float, float, list[Any], CallerReading | None]] = \
            {"run": now, "recent": now, "live": now}
        if stats == "live":
            self._live = LiveLine(self)
            self._caller_clock.after_step = self._live.after_step

    def stats(self, recent: bool = False) -> Stats:
        """Where the time went (``ParallelEnv(stats=True)``): over the whole run (since the start or
        :meth:`reset_stats`), or with ``recent=True`` since the previous ``stats(recent=True)``.

        Per env its step and reset times where it runs, per worker its busy share, for the caller
        its parts per batch step, and the stragglers (see :class:`~parallelenv.timing.Stats`). It
        reads every host's clock: one round trip, between two steps.
        """
        return self._read_stats("recent" if recent else "run")

    def _read_stats(self, window: str) -> Stats:
        """The stats of ``window``: "run" (from its start on), or "recent" and the live line's own
        (from the previous reading of that window on, which this reading ends)."""
        if self._caller_clock is None:
            raise RuntimeError("stats are off: make the ParallelEnv with stats=True (or 'live') to measure")
        readings = self.get_env_attr(TIMES_ATTRIBUTE)  # type: ignore[attr-defined]
        caller = self._caller_clock.read()
        began_wall, began, marks, caller_mark = self._window_starts[window]
        now = time.perf_counter()
        restarts = [0] * self._backend.num_envs
        for failure in getattr(self._healing, "failures", ()):
            for env_id in failure.env_ids:
                restarts[env_id] += 1
        stats = build_stats(window, now - began, readings, marks, caller.since(caller_mark), restarts, began_wall)
        if window != "run":
            self._window_starts[window] = (time.time(), now, readings, caller)
        return stats

    def reset_stats(self) -> None:
        """Start the run's stats (and the recent window) afresh from now."""
        if self._caller_clock is None:
            raise RuntimeError("stats are off: make the ParallelEnv with stats=True (or 'live') to measure")
        start = (time.time(), time.perf_counter(), self.get_env_attr(TIMES_ATTRIBUTE),  # type: ignore[attr-defined]
                 self._caller_clock.read())
        self._window_starts = {"run": start, "recent": start, "live": start}
