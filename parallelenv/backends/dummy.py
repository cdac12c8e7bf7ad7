"""The ``dummy`` backend: every env in the caller, one after another."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallelenv.backends.base import BackendConfig, RunsInCaller, unknown_options
from parallelenv.backends.buffers import Buffers, renewable
from parallelenv.backends.env_group import EnvGroup
from parallelenv.backends.env_sources import EnvSource, make_envs, refuse_instances_to_rebuild
from parallelenv.backends.silencing import silenced
from parallelenv.backends.spaces import common_spaces
from parallelenv.batching import zeros
from parallelenv.calls import Call, Failure, Reply


class DummyBackend(RunsInCaller):
    """Runs each call at once, in the caller; ``collect`` hands back the replies."""

    def __init__(self, sources: Sequence[EnvSource], config: BackendConfig, **options: Any) -> None:
        unknown_options("dummy", options)
        if config.rebuilds_envs:
            refuse_instances_to_rebuild(sources)
        self._silenced = silenced(config.no_warning)  # entered again around every call
        with silenced(config.no_warning):
            envs = make_envs(sources, first_id=0)
        if isinstance(envs, Failure):
            envs.raise_error()
        self._group = EnvGroup(envs, first_id=0, restart=config.policy.restarts_finished_envs,
                               timed=config.times_envs)
        try:
            obs_space, action_space = common_spaces(self._group.spaces())
            self.buffers = Buffers.allocate(
                obs_space, action_space, len(envs), zeros, config.policy.restarts_finished_envs
            )
            self.buffers.renews_obs = renewable(self.buffers.obs)
        except Exception:
            self._group.close()
            raise
        self._group.attach(self.buffers)
        self.num_envs = len(envs)
        self.single_observation_space = obs_space
        self.single_action_space = action_space
        self._replies: list[Reply] = []

    def dispatch(self, call: Call) -> None:
        with self._silenced:
            self._replies.append(self._group.run(call))

    def close(self) -> None:
        self._group.close()
