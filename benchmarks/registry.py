"""The registry of wrappers the harness can measure, and what they share.

A wrapper is a ``make(factories) -> Runner`` registered under a name with
:func:`register`; :mod:`benchmarks.wrappers` holds the adapters themselves.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.machine import wait_for_quiet

EnvFactory = Callable[[], Any]

# Kinds group wrappers that do the same job, so that a ratio compares like
# with like: stepping in the caller's process, in local worker processes, or
# through Ray actors. A subprocess wrapper is never judged against a plain
# in-process loop (which wins on cheap envs by design).
IN_PROCESS = "in-process"
SUBPROCESS = "subprocess"
RAY = "ray"
# A policy chooses the actions in the timed loop: no other library's wrapper does the same work.
WITH_POLICY = "with a policy"
# No wrapper at all: one bare process per core stepping its share of the envs,
# what the cores can do when no caller hands out actions or reads answers.
CEILING = "ceiling"
KINDS = (IN_PROCESS, SUBPROCESS, RAY, WITH_POLICY, CEILING)


class Unsupported(Exception):
    """The wrapper has no way to run this workload's envs (EnvPool has only its own): a skip, not a failure."""


class Runner:
    """Drives one vector env through the pre-sampled actions."""

    # Worker processes (or bare processes) stepping the envs; None: in the caller's process (or threads).
    workers: int | None = None
    # The cores this process was made to see while the runner lives (benchmarks.machine.seen_cores);
    # None: the real ones.
    cores_seen: int | None = None

    def reset(self, seed: int) -> None:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> None:
        """One batch step of every env; auto-reset is the wrapper's own."""
        raise NotImplementedError

    def run(self, actions: np.ndarray) -> int:
        """Replay ``actions`` (steps, num_envs[, action dims]); return the env-steps done."""
        for row in actions:
            self.step(row)
        return env_steps(actions)

    def close(self) -> None:
        raise NotImplementedError

    def own_rate(self) -> float | None:
        """Env-steps/s of the last :meth:`run` as the runner timed it itself; None: timed by the harness."""
        return None


def env_steps(actions: np.ndarray) -> int:
    """Env-steps in a (steps, num_envs[, action dims]) array: a Box action is one step, not one per dim."""
    return int(actions.shape[0] * actions.shape[1])


@dataclass(frozen=True)
class WrapperSpec:
    """What the harness knows about a wrapper before importing it."""

    name: str
    kind: str
    make: Callable[[Sequence[EnvFactory]], Runner]
    ours: bool = False
    requires: tuple[str, ...] = ()
    # Workloads it runs on unless named with --wrappers; None means all.
    workloads: frozenset[str] | None = None
    quick: bool = True  # part of a --quick run
    # Entered before the clock starts and left after close: shared set-up
    # that is no part of the wrapper's own start-up, such as a Ray cluster.
    session: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    note: str = ""
    # The wrapper this one is a variant of (one option changed): where both
    # ran on a workload, the report gives the ratio to it, round by round.
    baseline: str | None = None
    # Takes ``envs_per_worker=k`` from a workload that sets it (the many-worker ones): N / k workers of k envs.
    per_worker: bool = False


WRAPPERS: dict[str, WrapperSpec] = {}


def register(name: str, kind: str, **options: Any) -> Callable[[Any], Any]:
    """Add ``make(factories) -> Runner`` to :data:`WRAPPERS` under ``name``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")

    def add(make: Any) -> Any:
        if name in WRAPPERS:
            raise ValueError(f"wrapper {name!r} registered twice")
        WRAPPERS[name] = WrapperSpec(name, kind, make, **options)
        return make

    return add


@contextlib.contextmanager
def ray_cluster() -> Iterator[None]:
    """A local Ray instance around one measurement, unless one is running.

    Starting Ray takes seconds and happens once per program, like an
    import, so it stays out of every Ray wrapper's start-up time alike.
    """
    import ray

    started = not ray.is_initialized()
    if started:
        # No dashboard and no log forwarding: neither is part of stepping
        # envs, and both cost CPU on a 2-core machine.
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        # ray.init returns while Ray still boots its pool of idle workers;
        # that is the cluster's start-up, not the wrapper's.
        wait_for_quiet()
    try:
        yield
    finally:
        if started:
            _shutdown_ray(ray)


def _shutdown_ray(ray: Any) -> None:
    """Stop the Ray instance we started and wait for all its processes to end."""
    import psutil

    # Ray's workers outlive ray.shutdown() by seconds, reparented away from
    # us, and would steal CPU from the next measurement: find them while they
    # are still our descendants, then wait for them.
    ours = [p for p in psutil.Process().children(recursive=True) if _is_ray_process(p)]
    ray.shutdown()
    _, alive = psutil.wait_procs(ours, timeout=15)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _is_ray_process(proc: Any) -> bool:
    import psutil

    try:
        return "ray" in " ".join(proc.cmdline()).lower()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def default_wrappers(workload: str, quick: bool) -> list[str]:
    """The wrappers a run measures on ``workload`` when none are named."""
    from benchmarks.workloads import WORKLOADS

    own = WORKLOADS[workload].wrappers
    return [
        spec.name for spec in WRAPPERS.values()
        if (spec.name in own if own is not None else spec.workloads is None or workload in spec.workloads)
        and (spec.quick or not quick)
    ]
