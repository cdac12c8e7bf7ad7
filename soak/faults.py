"""Which fault is injected at which step, and how: from a seeded RNG, every kind in turn."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from parallelenv import ParallelEnv
from parallelenv.healing import ENV_ERROR, WORKER_DIED, WORKER_HUNG
from soak.env import FaultyEnv

# Each fault: how the env gets it (an action that makes it inject it; "kill": the soak kills the env's
# process from outside; "marker": a file that makes its next step exit or hang once, so that a replay of
# that step steps on), and the kind of failure the ParallelEnv must log for it.
FAULTS: dict[str, tuple[int | str, str]] = {
    "step raises": (FaultyEnv.STEP_RAISES, ENV_ERROR),
    "reset raises": (FaultyEnv.NEXT_RESET_RAISES, ENV_ERROR),
    "exits": ("marker", WORKER_DIED),
    "killed": ("kill", WORKER_DIED),
    "hangs": ("marker", WORKER_HUNG),
}
ENV_RAISED = ("step raises", "reset raises")  # what a backend without workers can survive


@dataclass(frozen=True)
class Fault:
    step: int
    env_id: int
    what: str

    @property
    def kind(self) -> str:
        return FAULTS[self.what][1]


class FaultPlan:
    """Faults at seeded random steps, ``every`` steps apart on average, the kinds of ``kinds`` in shuffled rounds."""

    def __init__(self, kinds: tuple[str, ...], every: int, num_envs: int, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._kinds = kinds
        self._every = every
        self._num_envs = num_envs
        self._round: list[str] = []
        self._next = self._gap()

    def _gap(self) -> int:
        return int(self._rng.integers(self._every // 2, 3 * self._every // 2 + 1))

    def at(self, step: int) -> Fault | None:
        """The fault to inject at ``step`` (steps counted from 0, asked in order), or None."""
        if step < self._next:
            return None
        self._next = step + max(1, self._gap())
        if not self._round:
            self._round = list(self._rng.permutation(self._kinds))
        return Fault(step, int(self._rng.integers(self._num_envs)), str(self._round.pop()))


def inject(penv: ParallelEnv, fault: Fault, actions: np.ndarray, markers: str) -> None:
    """Set up ``fault`` for the next step: its action in ``actions``, its marker in the folder ``markers``
    (which the envs were built with), or a SIGKILL of its env's process now."""
    how = FAULTS[fault.what][0]
    if how == "kill":
        # The process that runs the env: a subproc worker, a Ray actor, or a worker under a ray-subproc actor.
        os.kill(penv.backend.env_pids()[fault.env_id], signal.SIGKILL)
    elif how == "marker":
        path = os.path.join(markers, str(fault.env_id))
        with open(path + ".new", "w") as file:
            file.write(fault.what)
        os.replace(path + ".new", path)  # whole: a step never reads half of it
    else:
        actions[fault.env_id] = how
