"""What a backend is: the protocol between the front object and where envs run."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym

from parallelenv.backends.buffers import Buffers
from parallelenv.calls import Call, Reply


@dataclass(frozen=True)
class BackendConfig:
    """The ParallelEnv arguments every backend receives."""

    restart: bool  # the env host resets an env in the step that finishes it
    num_cpus: int | None  # None: all cores (of this machine, or of the Ray cluster)
    num_gpus: float
    no_warning: bool
    call_timeout: float | None


class Backend(Protocol):
    """Runs calls on envs, asynchronously.

    ``dispatch`` hands a call over and returns at once; ``collect`` returns
    the replies that have arrived, waiting up to ``timeout`` seconds for at
    least one. A call dispatched ``awaited_together`` (a ``step`` of every
    env, not a ``send``) is only ever collected with ``want_all``, so its
    replies may arrive in one piece. Step actions are read from
    ``buffers.actions`` and results written into the other buffers, rows
    indexed by env id. A backend that loses envs raises
    :class:`~parallelenv.WorkerDiedError` from either.

    Every call gets one :class:`~parallelenv.calls.Done` per host (worker,
    actor) it reached, naming the envs of the call that host ran; an env
    that raised is among its ``failures`` and every other env of the call
    still runs. ``dispatch`` raises anything else (a TypeError for data
    that cannot be sent) only before it has sent anything to any host.
    """

    num_envs: int
    single_observation_space: gym.Space
    single_action_space: gym.Space
    buffers: Buffers
    #: Replies exist by the time ``dispatch`` returns (calls run in the caller).
    runs_in_caller: bool

    def dispatch(self, call: Call, awaited_together: bool = False) -> None: ...

    def collect(self, timeout: float | None, want_all: bool = False) -> list[Reply]:
        """Replies that have arrived; with ``want_all`` the caller needs every pending one,
        so a backend may wait for all of them (up to ``timeout``) instead of the first."""
        ...

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        """Kill whatever hosts ``env_ids`` (they hang); return every env id lost with them."""
        ...

    def close(self) -> None: ...


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
