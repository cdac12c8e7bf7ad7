"""Surviving failures: what may be restarted, the budget of restarts, and the log of failures survived.

The mechanics live where the state is: backends replace dead workers
(``Backend.restart``), env hosts rebuild a failed env (the ``Rebuild``
call), and :class:`~parallelenv.tracking.inflight.InFlight` turns what was rebuilt
into the results the caller sees. This module holds the user's choices and
the bookkeeping they need.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from parallelenv.errors import WorkerDiedError

CHOICES = ("raise", "restart")
DEFAULT_MAX_RESTARTS = 10
DEFAULT_RESTART_WINDOW_S = 60.0

WORKER_DIED = "worker died"
WORKER_HUNG = "worker hung"
ENV_ERROR = "env error"
WORKER_RECYCLED = "worker recycled"  # replaced on purpose: see parallelenv.recycling


@dataclass(frozen=True)
class SurvivedFailure:
    """One failure that was survived: envs rebuilt instead of an error raised.

    Attributes:
        time: when it was seen (``time.time()``).
        env_ids: the envs rebuilt because of it.
        kind: ``"worker died"``, ``"worker hung"`` (past ``call_timeout``, killed), ``"env error"``, or
            ``"worker recycled"`` (replaced on purpose, see :class:`~parallelenv.recycling.Recycling`).
        reason: what was seen: exit code or signal, lost node, or the env's exception.
        traceback: the env's remote traceback, for an env error.
        restored: the envs put back into their last snapshot, their steps since replayed, instead of
            reset (``ParallelEnv(snapshots=...)``): their episodes go on as if nothing had happened.
        not_restored: with ``snapshots=``, each other env rebuilt for it, reset instead, and why it had no
            snapshot to go back to (its state could not be taken, and the reason; a call changed it since;
            none taken yet; ...).
    """

    time: float
    env_ids: tuple[int, ...]
    kind: str
    reason: str
    traceback: str = ""
    restored: tuple[int, ...] = ()
    not_restored: Mapping[int, str] = dataclasses.field(default_factory=dict, hash=False)


class Healing:
    """What to do on failures, a budget of restarts per sliding window, and the failures survived."""

    def __init__(self, on_worker_failure: str, on_env_error: str, max_restarts: int, restart_window: float) -> None:
        for name, value in (("on_worker_failure", on_worker_failure), ("on_env_error", on_env_error)):
            if value not in CHOICES:
                raise ValueError(f"{name}={value!r}; use 'raise' or 'restart'")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts={max_restarts!r}; use an int >= 0")
        if isinstance(restart_window, bool) or not isinstance(restart_window, (int, float)) or not restart_window > 0:
            raise ValueError(f"restart_window={restart_window!r}; use a number of seconds > 0")
        # Each is "raise" or "restart", checked above.
        self.restarts_workers = on_worker_failure != "raise"
        self.rebuilds_envs = on_env_error != "raise"
        self.max_restarts = max_restarts
        self.restart_window = float(restart_window)
        self.failures: list[SurvivedFailure] = []
        self._spent: deque[float] = deque()  # monotonic times of the restarts in the window
        self._last_seeds: dict[int, int] = {}
        self._restarts_of: dict[int, int] = {}

    @property
    def active(self) -> bool:
        return self.restarts_workers or self.rebuilds_envs

    def admit(self, env_ids: tuple[int, ...], kind: str, reason: str, traceback: str = "") -> bool:
        """Spend one restart on this failure and log it; False when the budget is spent (nothing logged)."""
        now = time.monotonic()
        while self._spent and self._spent[0] <= now - self.restart_window:
            self._spent.popleft()
        if len(self._spent) >= self.max_restarts:
            return False
        self._spent.append(now)
        self.failures.append(SurvivedFailure(time.time(), env_ids, kind, reason, traceback))
        return True

    def record(self, env_ids: tuple[int, ...], kind: str, reason: str) -> SurvivedFailure:
        """Log a replacement made on purpose (recycling): it spends no restart."""
        self.failures.append(SurvivedFailure(time.time(), env_ids, kind, reason))
        return self.failures[-1]

    def name_rebuilt(self, env_ids: list[int]) -> None:
        """Let the last failure name every env rebuilt for it (a host may rebuild more than the dead ones)."""
        last = self.failures[-1]
        self.failures[-1] = dataclasses.replace(last, env_ids=tuple(sorted(set(env_ids) | set(last.env_ids))))

    def name_restored(self, failure: SurvivedFailure, env_ids: list[int], reset: dict[int, str]) -> SurvivedFailure:
        """Let ``failure`` (logged) name the envs put back into their snapshot for it, and the others reset
        with why; the entry as it is now."""
        named = dataclasses.replace(failure, restored=tuple(sorted(env_ids)),
                                    not_restored={**failure.not_restored, **dict(sorted(reset.items()))})
        self.failures[next(k for k in range(len(self.failures) - 1, -1, -1) if self.failures[k] is failure)] = named
        return named

    def over_budget(self, env_ids: list[int], reason: str) -> WorkerDiedError:
        return WorkerDiedError(
            env_ids,
            f"{reason}; not restarted: the restart budget (max_restarts={self.max_restarts} within "
            f"restart_window={self.restart_window:g} s) is spent",
        )

    def remember_seeds(self, env_ids: tuple[int, ...], seeds: Any) -> None:
        """The seeds of a reset: a rebuilt env's fresh seeds derive from its last one."""
        for env_id, seed in zip(env_ids, seeds, strict=True):
            if seed is None:
                self._last_seeds.pop(env_id, None)
            else:
                self._last_seeds[env_id] = int(seed)
                self._restarts_of[env_id] = 0

    def fresh_seeds(self, env_ids: tuple[int, ...]) -> tuple[int | None, ...]:
        """A new seed per env, the next of its own stream: the k-th restart since its last seeded reset
        gets child k of ``SeedSequence(that seed)``; None for an env never seeded (fresh entropy)."""
        seeds: list[int | None] = []
        for env_id in env_ids:
            base = self._last_seeds.get(env_id)
            if base is None:
                seeds.append(None)
                continue
            count = self._restarts_of[env_id] = self._restarts_of.get(env_id, 0) + 1
            sequence = np.random.SeedSequence(base, spawn_key=(count,))
            seeds.append(int(sequence.generate_state(1, np.uint64)[0]))
        return tuple(seeds)


def refuse_without_workers(backend: Any, para_mode: str, restarts_workers: bool, recycle: Any) -> None:
    """A ValueError where healing or recycling asks to replace workers that ``backend`` does not have."""
    from parallelenv.backends.base import RestartsWorkers  # the backends' protocol, not loaded for the choices

    asked = "on_worker_failure='restart'" if restarts_workers else "recycle=" if recycle is not None else None
    if asked is not None and not isinstance(backend, RestartsWorkers):
        raise ValueError(
            f"{asked}: para_mode={para_mode!r} runs its envs in this process, with no worker to "
            "replace; use 'subproc', 'ray' or 'ray-subproc'"
        )
