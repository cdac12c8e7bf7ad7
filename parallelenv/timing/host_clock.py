"""An env host's clock: each env's step and reset times, and the host's busy time, where the envs run.

A host made with ``timed=True`` (``ParallelEnv(stats=True)``) keeps one;
else nothing is measured. The caller reads it with a GetAttr of
:data:`TIMES_ATTRIBUTE`, which reaches every host on every backend as any
attribute read does and changes nothing (lossless healing's record
included); the reply holds each env's :class:`HostReading`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from parallelenv.timing.histogram import Histogram

TIMES_ATTRIBUTE = "__parallelenv_times__"
FOLD_EVERY = 1024  # calls between two foldings of the step times kept in lists into their histograms


@dataclass(frozen=True)
class HostReading:
    """One env's times, read where it runs, and its host's."""

    step: Histogram
    reset: Histogram
    host: str  # "pid 1234": the process that runs it
    host_started: float  # time.time() the host started: a new value is a new host (restarted, recycled)
    busy_s: float  # the host's time running calls since it started
    alive_s: float  # since it started


class HostClock:
    """What an env host measures (see the module's docstring)."""

    def __init__(self, env_ids: tuple[int, ...]) -> None:
        self.started = time.time()
        self._began = time.perf_counter()
        self.busy_s = 0.0
        self.steps = {env_id: Histogram() for env_id in env_ids}
        self.resets = {env_id: Histogram() for env_id in env_ids}
        # Each env's step times since the last folding: a step appends, and a folding (every FOLD_EVERY
        # calls, and at each reading) bins them all at once.
        self.step_times: dict[int, list[float]] = {env_id: [] for env_id in env_ids}
        self.calls = 0

    def ran_call(self, seconds: float) -> None:
        self.busy_s += seconds
        self.calls += 1
        if self.calls >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        self.calls = 0
        for env_id, times in self.step_times.items():
            if times:
                self.steps[env_id].add_many(times)
                times.clear()

    def read(self, env_ids: tuple[int, ...]) -> dict[int, HostReading]:
        self.fold()
        host, alive = f"pid {os.getpid()}", time.perf_counter() - self._began
        return {env_id: HostReading(self.steps[env_id].copy(), self.resets[env_id].copy(), host, self.started,
                                    self.busy_s, alive) for env_id in env_ids}
