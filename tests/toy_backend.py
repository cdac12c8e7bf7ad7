"""The smallest backend: envs run in the caller, one call at a time, each when ``collect`` asks."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from parallelenv.backends import BackendConfig
from parallelenv.backends.buffers import Buffers
from parallelenv.backends.env_group import EnvGroup
from parallelenv.backends.env_sources import EnvSource, make_envs
from parallelenv.backends.silencing import silenced
from parallelenv.backends.spaces import common_spaces
from parallelenv.batching import zeros
from parallelenv.calls import Call, Failure, Reply


class ToyBackend:
    def __init__(self, sources: Sequence[EnvSource], config: BackendConfig) -> None:
        with silenced(config.no_warning):
            envs = make_envs(sources, first_id=0)
        if isinstance(envs, Failure):
            envs.raise_error()  # an EnvError naming the env that could not be built
        # The group runs calls on the envs, the policy's restarts included, and answers each with a Reply.
        self.group = EnvGroup(envs, first_id=0, restart=config.policy.restarts_finished_envs, timed=config.times_envs)
        self.num_envs = len(envs)
        self.single_observation_space, self.single_action_space = common_spaces(self.group.spaces())
        # One row per env: the front writes actions there, the group writes results.
        self.buffers = Buffers.allocate(self.single_observation_space, self.single_action_space, len(envs), zeros)
        self.group.attach(self.buffers)
        self.no_warning = config.no_warning
        self.queued: deque[Call] = deque()

    def dispatch(self, call: Call) -> None:
        self.queued.append(call)

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        if not self.queued:
            return []
        with silenced(self.no_warning):
            return [self.group.run(self.queued.popleft())]  # one Reply, naming the call's envs

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        return []  # a call running in the caller's own thread cannot be abandoned

    def env_pids(self) -> list[int]:
        return [os.getpid()] * self.num_envs

    def pids(self) -> list[int]:
        return []  # no process of its own

    def close(self) -> None:
        self.group.close()
