"""What a backend is: the protocol between the front object and where envs run."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from parallelenv.backends.buffers import Buffers
from parallelenv.calls import Call, Reply
from parallelenv.policies import Policy


@dataclass(frozen=True)
class BackendConfig:
    """The ParallelEnv arguments every backend receives."""

    policy: Policy  # what happens to envs that finish: the env host asks ``restarts_finished_envs``
    num_cpus: int | None  # None: all cores (of this machine, or of the Ray cluster)
    num_gpus: float
    no_warning: bool
    call_timeout: float | None
    # on_worker_failure="restart": the backend will be asked to restart() dead workers
    restarts_workers: bool = False
    # on_env_error="restart": the envs will be sent Rebuild calls with the user's sources
    rebuilds_envs: bool = False
    # copy=False: results are the buffers themselves, which need no spare observation slots
    copy: bool | None = None
    # stats=True: the env hosts time each env's steps and resets (parallelenv.timing.host_clock)
    times_envs: bool = False


class Backend(Protocol):
    """Runs calls on envs, asynchronously.

    ``dispatch`` hands a call over and returns at once; ``collect`` returns
    the replies that have arrived, waiting up to ``timeout`` seconds for at
    least one. Step actions are read from ``buffers.actions`` and results
    written into the other buffers, rows indexed by env id. A backend that
    loses envs raises :class:`~parallelenv.WorkerDiedError` from either.

    Every call gets one :class:`~parallelenv.calls.Reply` per host (worker,
    actor) it reached, naming the envs of the call that host ran; an env
    that raised is among its ``failures`` and every other env of the call
    still runs. ``dispatch`` raises anything else (a TypeError for data
    that cannot be sent) only before it has sent anything to any host.
    """

    num_envs: int
    single_observation_space: gym.Space
    single_action_space: gym.Space
    buffers: Buffers

    def dispatch(self, call: Call) -> None: ...

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        """Replies that have arrived, waiting up to ``timeout`` s for one.

        ``wanted``: how many more envs' answers the caller needs before its
        wait is over (None: every pending env's). It shapes this one wait and
        nothing else: a backend whose every wait is a round trip (Ray) may,
        when ``wanted`` covers every pending env, wait up to ``timeout`` for
        all of them together rather than return on the first. Whatever has
        arrived when the wait ends is returned either way. It never decides
        how a call is run: that a step's caller waits for all of it is the
        step's own :attr:`~parallelenv.calls.Step.awaited`, known at dispatch.
        Backends that wait as cheaply either way ignore it.
        """
        ...

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        """Kill whatever hosts ``env_ids`` (they hang); return every env id lost with them."""
        ...

    def env_pids(self) -> list[int]:
        """Per env, the process that runs it."""
        ...

    def pids(self) -> list[int]:
        """Every live process this backend started ([] when it runs the envs in the caller)."""
        ...

    def close(self) -> None: ...


# Capabilities a backend may add to :class:`Backend`; the tracker asks for each with isinstance.


@runtime_checkable
class Interruptible(Protocol):
    """A backend whose hosts another thread can stop while a call waits on them (ParallelEnv.close() from a
    watchdog). Backends that run the envs in the caller's thread have nothing to stop and are not."""

    def interrupt(self) -> None:
        """Stop whatever hosts the envs at once, so that the waiting collect ends with their deaths;
        touch nothing that the waiting thread reads."""
        ...


@runtime_checkable
class CallsEachBatchOnce(Protocol):
    """A backend of one batched env: a CallMethod runs once for all its envs, as ``env.name(ids, data)``
    (the tensor backend), where the others call ``name`` once per env."""

    calls_each_batch_once: bool


@runtime_checkable
class RestartsWorkers(Protocol):
    """A backend that can replace a dead worker: what ``on_worker_failure="restart"`` needs besides :class:`Backend`."""

    def restart(self, env_ids: Sequence[int]) -> list[int]:
        """Replace the dead hosts of ``env_ids`` with new ones that build their envs again.

        Returns every env id rebuilt. The calls the dead hosts had not
        answered are forgotten: the caller decides what each env owes. A
        :class:`~parallelenv.WorkerDiedError` says a new host failed too.
        """
        ...

    def workers(self) -> list[tuple[tuple[int, ...], int | None]]:
        """Each host's env ids and its process id on this machine (None where it has none here), in a
        fixed order: what recycling counts and measures per worker (``kill`` then ``restart`` replaces one)."""
        ...



class RunsInCaller:
    """The part shared by backends that run each call at once, in the caller's thread.

    ``dispatch`` appends its reply to ``self._replies``; ``collect`` hands
    them over. Nothing can be killed or hang in another process.
    """

    num_envs: int
    _replies: list[Reply]

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        replies, self._replies = self._replies, []
        return replies

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        return []  # a call in the caller's own thread cannot be abandoned

    def env_pids(self) -> list[int]:
        return [os.getpid()] * self.num_envs

    def pids(self) -> list[int]:
        return []  # every env runs in the caller


BackendFactory = Callable[..., Backend]
"""``factory(env_sources, config, **backend_options) -> Backend``."""


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def unknown_options(mode: str, options: dict[str, Any]) -> None:
    if options:
        raise TypeError(f"para_mode={mode!r} takes no option(s) {', '.join(sorted(options))}")
