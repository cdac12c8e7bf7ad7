"""How the soak runs each CPU backend: its options, the faults it can survive, how often, and its recycling.

``tensor`` is not soaked: it runs one batched torch env in the caller, with
no worker to die, hang, leak or recycle, and refuses healing altogether.
``dummy`` runs its envs in the caller too, so it has no worker to replace:
it refuses ``on_worker_failure="restart"`` and ``recycle=``, and is soaked
with env-raised faults only, each env rebuilt in place.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallelenv import Recycling
from soak.env import FaultyEnv
from soak.faults import ENV_RAISED, FAULTS

LEAKY_ENV = 0  # the one env that leaks: its worker is recycled, every other worker stays flat


@dataclass(frozen=True)
class Profile:
    """One backend's soak.

    Attributes:
        para_mode: the backend.
        num_envs: how many envs the ParallelEnv runs.
        options: its ParallelEnv options (groups of envs per worker).
        faults: the kinds of :data:`soak.faults.FAULTS` injected.
        fault_every: steps between faults, on average.
        leak_kb: what the leaky env keeps per step.
        recycle_steps: ``Recycling(steps=)``, for backends whose workers' memory the parent cannot read.
        recycle_headroom_mb: ``Recycling(memory_mb=)`` this far above a fresh worker's RSS.
        call_timeout: what a hang costs: long enough that no step on a loaded machine is taken for one.
    """

    para_mode: str
    options: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 8
    faults: tuple[str, ...] = tuple(FAULTS)
    fault_every: int = 1000
    leak_kb: float = 0.0
    recycle_steps: int | None = None
    recycle_headroom_mb: float | None = None
    call_timeout: float = 3.0

    @property
    def needs_ray(self) -> bool:
        return self.para_mode.startswith("ray")

    @property
    def has_workers(self) -> bool:
        return self.para_mode != "dummy"

    def factories(self, markers: str | None = None) -> list[Callable[[], FaultyEnv]]:
        """The envs; with ``markers``, a folder where a file named after an env makes its next step exit or hang."""
        return [functools.partial(FaultyEnv, tag=i, leak_kb=self.leak_kb if i == LEAKY_ENV else 0.0,
                                  marker=None if markers is None else os.path.join(markers, str(i)))
                for i in range(self.num_envs)]

    @property
    def snapshot_every(self) -> int | None:
        """Lossless healing's cadence: ten snapshots between faults, on every backend with workers."""
        return max(1, self.fault_every // 10) if self.has_workers else None

    def recycling(self, fresh_worker_mb: float | None) -> Recycling | None:
        """The recycling rule, given a fresh worker's RSS (for the memory limit)."""
        if self.recycle_headroom_mb is not None and fresh_worker_mb is not None:
            return Recycling(memory_mb=fresh_worker_mb + self.recycle_headroom_mb)
        if self.recycle_steps is not None:
            return Recycling(steps=self.recycle_steps)
        return None

    def healing(self) -> dict[str, Any]:
        """The ParallelEnv options that make it survive every fault of :attr:`faults`."""
        worker_failure = "restart" if self.has_workers else "raise"
        return {"asynchronous": "restart", "on_env_error": "restart", "on_worker_failure": worker_failure,
                "call_timeout": self.call_timeout, "max_restarts": 10**9,
                "snapshots": self.snapshot_every or False}


# Rates on a 2-core machine: dummy ~13,000 steps/s, subproc ~1,000, ray ~90, ray-subproc ~250. A fault
# every few seconds and a recycle every ten to thirty: restarts are what a soak is about, without
# spending most of its time starting Ray actors.
PROFILES: dict[str, Profile] = {
    "dummy": Profile("dummy", faults=ENV_RAISED, fault_every=20_000),
    "subproc": Profile("subproc", {"num_workers": 4}, fault_every=3_000, leak_kb=8, recycle_headroom_mb=48),
    "ray": Profile("ray", fault_every=400, leak_kb=8, recycle_steps=2_000),
    "ray-subproc": Profile("ray-subproc", {"num_actors": 2, "num_workers_per_actor": 2}, fault_every=1_000,
                           leak_kb=8, recycle_steps=5_000),
}
