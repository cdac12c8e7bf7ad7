"""A ParallelEnv seen as a Stable-Baselines3 ``VecEnv``, for SB3 algorithms and VecEnv wrappers.

Importing this module imports SB3 (the extra ``parallelenv[sb3]``);
nothing else in parallelenv does. SB3 resets a finished env in the step
that finishes it and puts the ended episode's last obs in
``info["terminal_observation"]``; ``info["TimeLimit.truncated"]`` says the
episode was truncated rather than terminated. Under ``asynchronous="restart"``
the env hosts do that reset; under ``"idle"`` and ``"continue"`` this view
resets the finished envs itself after the step. ``None`` (one env finishing
finishes all, the ParallelEnv's default) has no SB3 equivalent and is
refused: build the ParallelEnv with one of the other three. ``reset_infos`` holds
each env's latest reset info (under ``"restart"``, the env host's
``info["reset_info"]``). ``indices`` are Python list indices, as in SB3's own
VecEnvs: negative ones count from the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from parallelenv.extras import missing_extra

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError as missing:
    if not (missing.name or "").startswith("stable_baselines3"):
        raise  # SB3 is there; something it imports is not, and its own error says what
    raise ModuleNotFoundError(
        missing_extra("the SB3 view needs Stable-Baselines3", "sb3"),
        name=missing.name,
    ) from None

from parallelenv.arrays import copy_tree
from parallelenv.batching import put, unbatch
from parallelenv.calls import Arguments
from parallelenv.infos import ended_states, env_info, rebuilt_envs, reset_info, step_info
from parallelenv.infos.keys import ENV_ID, TERMINAL_OBSERVATION, TIMELIMIT_TRUNCATED
from parallelenv.integrations import is_wrapped
from parallelenv.parallel_env import ParallelEnv


class SB3VecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over a ParallelEnv; closing it closes the ParallelEnv.

    ``seed(s)`` gives env ``i`` the seed ``s + i`` at the next ``reset()``,
    as SB3's own VecEnvs do.

    Example:
        >>> from stable_baselines3 import PPO
        >>> from parallelenv import ParallelEnv
        >>> from parallelenv.integrations.sb3 import SB3VecEnv
        >>> venv = SB3VecEnv(ParallelEnv.make("CartPole-v1", num_envs=4, para_mode="dummy", asynchronous="restart"))
        >>> model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, device="cpu").learn(128)
        >>> venv.close()
    """

    def __init__(self, penv: ParallelEnv) -> None:
        if penv.policy.ends_all:
            raise ValueError(
                f"asynchronous={penv.policy.name!r} has no SB3 equivalent: when one env finishes it finishes them "
                "all. Use asynchronous='restart' (or 'idle' or 'continue')"
            )
        self.penv = penv
        self._restarts = penv.policy.restarts_finished_envs  # the env hosts reset finished envs, not this view
        self._stepping = False  # step_async sent actions that step_wait has not received
        # The obs last handed to SB3: an env rebuilt after a failure ends its episode there.
        self._last_obs: Any = None
        super().__init__(len(penv), penv.single_observation_space, penv.single_action_space)

    def reset(self) -> VecEnvObs:
        if self._stepping:  # SB3 lets reset cancel a step in flight: receive and drop it
            self.penv.recv()
            self._stepping = False
        seeds = None if all(seed is None for seed in self._seeds) else list(self._seeds)
        options = [opts or None for opts in self._options]
        obs, info = self.penv.reset(seed=seeds, options=None if not any(options) else options)
        self.reset_infos = [env_info(info, i) for i in range(self.num_envs)]
        self._reset_seeds()  # seeds and options apply to one reset only
        self._reset_options()
        return self._remember(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self.penv.send(actions)
        self._stepping = True

    def step_wait(self) -> VecEnvStepReturn:
        obs, reward, terminated, truncated, info = self.penv.recv()
        self._stepping = False
        ended = ended_states(info)
        infos = [step_info(info, i) for i in range(self.num_envs)]
        for i, own in enumerate(infos):
            own.pop(ENV_ID, None)
            own[TIMELIMIT_TRUNCATED] = bool(truncated[i] and not terminated[i])
        dones = terminated | truncated
        done_ids = np.flatnonzero(dones)
        # An env rebuilt after a failure answered with a new episode's first obs: its
        # episode ended, cut, on the last obs SB3 saw of it.
        rebuilt = rebuilt_envs(info, self.num_envs) if self._last_obs is not None else np.zeros(self.num_envs, bool)
        if self._restarts:
            for i in done_ids.tolist():
                infos[i][TERMINAL_OBSERVATION] = unbatch(self._last_obs, i) if rebuilt[i] else ended[i]
                self.reset_infos[i] = reset_info(info, i)
        elif done_ids.size:
            for i in done_ids.tolist():
                infos[i][TERMINAL_OBSERVATION] = unbatch(self._last_obs if rebuilt[i] else obs, i)
            reset_obs, first_info = self.penv.reset(id=done_ids)
            put(obs, done_ids, reset_obs)
            for p, i in enumerate(done_ids.tolist()):
                self.reset_infos[i] = env_info(first_info, p)
        return self._remember(obs), reward.astype(np.float32), dones, infos

    def _remember(self, obs: Any) -> Any:
        """``obs``, handed to SB3, kept as the last obs of each env (a copy where the next step rewrites it)."""
        self._last_obs = copy_tree(obs) if self.penv.reuses_result_buffers else obs
        return obs

    def close(self) -> None:
        self.penv.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The attribute of each env of ``indices``; an AttributeError if one has none, as in SB3."""
        ids = self._ids(indices)
        has = self.penv.customized_method("has_wrapper_attr", data=[attr_name] * len(ids), id=ids)
        missing = [i for i, found in zip(ids, has, strict=True) if not found]
        if missing:
            raise AttributeError(f"envs {missing} have no attribute {attr_name!r}")
        return self.penv.get_env_attr(attr_name, id=ids)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self.penv.set_env_attr(attr_name, value, id=self._ids(indices))

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        ids = self._ids(indices)
        data = [Arguments(method_args, method_kwargs)] * len(ids)
        return self.penv.customized_method(method_name, data=data, id=ids)

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        ids = self._ids(indices)
        return [bool(x) for x in self.penv.customized_method(is_wrapped, data=[wrapper_class] * len(ids), id=ids)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return self.penv.customized_method("render")

    def _ids(self, indices: VecEnvIndices) -> list[int]:
        """``indices`` as env ids: negative ones count from the end, as in SB3's VecEnvs (Python list indices)."""
        envs = range(self.num_envs)
        ids = []
        for index in self._get_indices(indices):
            try:
                ids.append(envs[int(index)])
            except IndexError:
                raise IndexError(f"index {index} is out of range for {self.num_envs} envs") from None
        return ids
