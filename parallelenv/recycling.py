"""Workers replaced on purpose: after a number of steps, an age, or a resident-memory limit.

Long runs of leaky simulators grow a worker's memory for days. Rather than
restart training from a shell loop, a ParallelEnv can replace a worker
before that hurts, the way ``multiprocessing.Pool(maxtasksperchild=...)``
does: at a point where none of its envs has a call under way (after a step
is handed over), the worker is stopped and a new one started with its envs
rebuilt from their factories. Each of those envs is cut as healing cuts a
rebuilt env (with ``ParallelEnv(snapshots=...)``, it goes on from its
snapshot instead, see :mod:`parallelenv.state.journal`): its next step answers with its new episode's first obs,
``truncated=True`` and ``info["worker_restarted"]``, and the replacement is
logged in ``penv.failures`` with ``kind="worker recycled"``
(``healing.WORKER_RECYCLED``). Recycling spends none of the restart budget,
and nothing sent is lost: a worker with a call under way is recycled at a
later step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from parallelenv.backends.base import RestartsWorkers

if TYPE_CHECKING:
    from parallelenv.tracking.ledger import Ledger


class Replaces(Protocol):
    """The call tracker's resumer, which replaces each worker of ``(its env ids, why)`` and resumes its envs
    as rebuilt ones. A protocol, not that class: this module is below the tracker that acts on it."""

    def recycle(self, workers: list[tuple[list[int], str]]) -> None: ...


@dataclass(frozen=True)
class Recycling:
    """When a worker (a process, or a Ray actor) is replaced on purpose: at the first limit reached.

    Attributes:
        steps: steps its busiest env has taken since the worker started.
        seconds: the worker's age.
        memory_mb: its resident memory in MiB (worker processes on this
            machine: ``para_mode="subproc"``), read after every step.
    """

    steps: int | None = None
    seconds: float | None = None
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "seconds", "memory_mb"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"Recycling({name}={value!r}); use a number > 0, or None for no such limit")
        if isinstance(self.steps, float):
            raise ValueError(f"Recycling(steps={self.steps!r}); use an int")
        if self.steps is None and self.seconds is None and self.memory_mb is None:
            raise ValueError("Recycling() with no limit recycles nothing: give steps, seconds or memory_mb")


class Recycler:
    """Which workers are due, from their envs' steps, their age and their memory; replaced, once idle,
    by the tracker's resumer, as healing replaces a dead one."""

    def __init__(self, rule: Recycling, backend: Any, num_envs: int) -> None:
        if not isinstance(backend, RestartsWorkers):
            raise TypeError(f"recycle= needs a backend that restarts workers; {type(backend).__name__} does not")
        self._backend = backend
        workers = backend.workers()
        if rule.memory_mb is not None and any(pid is None for _, pid in workers):
            raise ValueError("Recycling(memory_mb=...) reads the memory of worker processes on this machine: "
                             "use para_mode='subproc' (steps= and seconds= work on every backend with workers)")
        self.rule = rule
        self._groups = [group for group, _ in workers]
        self._steps = np.zeros(num_envs, dtype=np.int64)
        now = time.monotonic()
        self._started = [now] * len(self._groups)

    def after_hand_over(self, rows: slice | np.ndarray, ledger: Ledger, resumer: Replaces) -> None:
        """The envs of ``rows`` took a step; replace every worker due now that has no call under way
        (the others at a later step), in one go: a limit of steps or seconds makes every worker due at
        once, and Ray would otherwise start their actors one after another. Their envs answer their next
        step as rebuilt envs do."""
        self.stepped(rows)
        workers = self._backend.workers()
        idle = [(index, list(workers[index][0]), reason) for index, reason in self.due(workers)
                if ledger.busy(np.array(workers[index][0])).size == 0]
        if idle:
            resumer.recycle([(env_ids, reason) for _, env_ids, reason in idle])
            for index, _, _ in idle:
                self.renewed(index)

    def stepped(self, rows: slice | np.ndarray) -> None:
        """The envs of ``rows`` took a step."""
        self._steps[rows] += 1

    def due(self, workers: Sequence[tuple[tuple[int, ...], int | None]]) -> list[tuple[int, str]]:
        """``(worker, why)`` for every worker past a limit (``workers`` as the backend lists them now)."""
        rule, now = self.rule, time.monotonic()
        due = []
        for index, (group, pid) in enumerate(workers):
            steps = int(self._steps[list(group)].max())
            if rule.steps is not None and steps >= rule.steps:
                due.append((index, f"it ran {steps} steps (Recycling(steps={rule.steps}))"))
            elif rule.seconds is not None and now - self._started[index] >= rule.seconds:
                due.append((index, f"it ran {now - self._started[index]:.0f} s (Recycling(seconds={rule.seconds:g}))"))
            elif rule.memory_mb is not None and pid is not None:
                resident = resident_mb(pid)
                if resident is not None and resident >= rule.memory_mb:
                    due.append((index, f"it held {resident:.0f} MiB (Recycling(memory_mb={rule.memory_mb:g}))"))
        return due

    def renewed(self, index: int) -> None:
        """Worker ``index`` was replaced: its counts start again."""
        self._steps[list(self._groups[index])] = 0
        self._started[index] = time.monotonic()


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MiB, from /proc (Linux); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return None
