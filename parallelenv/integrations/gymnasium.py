"""A ParallelEnv seen as a ``gymnasium.vector.VectorEnv``, for code and wrappers written for Gymnasium.

The autoreset mode follows the ParallelEnv's ``asynchronous`` policy (``penv.policy.autoreset_mode()``):

- ``"restart"`` is Gymnasium's ``AutoresetMode.SAME_STEP``: a finished env
  is reset in the step that finishes it; ``info["final_obs"]`` and
  ``info["final_info"]`` (with their ``_`` masks) hold the ended episode's
  last obs and info, and the top-level info of such an env is its reset's
  info, as Gymnasium's own vector envs report it.
- ``"idle"`` and ``"continue"`` are ``AutoresetMode.NEXT_STEP``: the step that
  finishes an env returns its real last obs; the next step resets it
  (reward 0, not terminated, not truncated, the reset's obs and info) and
  ignores its action. This is the mode ``NormalizeObservation`` and the other
  observation wrappers require.
- ``None`` (one env finishing finishes all, the ParallelEnv's default)
  matches no Gymnasium mode and is refused: build the ParallelEnv with
  ``asynchronous="restart"``, ``"idle"`` or ``"continue"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from parallelenv.batching import allocate, check_batch, put, take, zeros
from parallelenv.calls import Arguments
from parallelenv.infos import ended_states, env_info, reset_info, step_info, vector_info
from parallelenv.parallel_env import ParallelEnv


class GymnasiumVectorEnv(VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` over a ParallelEnv; closing it closes the ParallelEnv.

    Seeds differ from ``SyncVectorEnv``'s ``seed + i``: an int seed gives env
    ``i`` the child ``i`` of ``SeedSequence(seed)``, as ``ParallelEnv.reset`` does.

    Example:
        >>> import gymnasium as gym
        >>> from parallelenv import ParallelEnv
        >>> envs = ParallelEnv.make("CartPole-v1", num_envs=4, para_mode="dummy", asynchronous="restart").as_gymnasium()
        >>> envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
        >>> obs, info = envs.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
        >>> envs.metadata["autoreset_mode"]
        <AutoresetMode.SAME_STEP: 'SameStep'>
        >>> envs.close()
    """

    def __init__(self, penv: ParallelEnv) -> None:
        mode = penv.policy.autoreset_mode()
        self.penv = penv
        self.num_envs = len(penv)
        self.single_observation_space = penv.single_observation_space
        self.single_action_space = penv.single_action_space
        self.observation_space = penv.observation_space
        self.action_space = penv.action_space
        self.render_mode = penv.get_env_attr("render_mode", id=0)[0]
        self.spec = penv.get_env_attr("spec", id=0)[0]
        env_metadata = penv.get_env_attr("metadata", id=0)[0] or {}
        self.metadata = {**env_metadata, "autoreset_mode": mode}
        self.autoreset_mode = mode
        self._autoreset = np.zeros(self.num_envs, dtype=bool)  # NEXT_STEP: reset these in the next step

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env; ``seed`` is an int, a list with one per env, or None."""
        if options and "reset_mask" in options:
            raise ValueError("options['reset_mask'] is not supported: reset envs by id with ParallelEnv.reset")
        self._autoreset[:] = False
        return self.penv.reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            obs, reward, terminated, truncated, info = self.penv.step(actions)
            return obs, reward, terminated, truncated, _same_step_info(info, self.num_envs)
        if not self._autoreset.any():
            result = self.penv.step(actions)
        else:
            result = self._reset_and_step(actions)
        self._autoreset = result[2] | result[3]
        return result

    def _reset_and_step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """NEXT_STEP: reset the envs that finished last step, step the others."""
        n = self.num_envs
        batch = check_batch(self.single_action_space, actions, n)
        reset_ids, step_ids = np.flatnonzero(self._autoreset), np.flatnonzero(~self._autoreset)
        obs = allocate(self.single_observation_space, n, zeros)
        reward, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        reset_obs, first_info = self.penv.reset(id=reset_ids)
        put(obs, reset_ids, reset_obs)
        parts = [(reset_ids, first_info)]
        if step_ids.size:
            step_obs, step_reward, step_terminated, step_truncated, info = self.penv.step(
                take(batch, step_ids), id=step_ids
            )
            put(obs, step_ids, step_obs)
            reward[step_ids], terminated[step_ids], truncated[step_ids] = step_reward, step_terminated, step_truncated
            parts.append((step_ids, info))
        merged = [(int(i), env_info(part, p)) for ids, part in parts for p, i in enumerate(ids)]
        return obs, reward, terminated, truncated, vector_info(sorted(merged, key=lambda pair: pair[0]), n)

    def render(self) -> tuple[Any, ...] | None:
        """Each env's ``render()``."""
        return tuple(self.penv.customized_method("render"))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call the method ``name`` of every env with these arguments (an attribute is returned as is)."""
        data = [Arguments(args, kwargs)] * self.num_envs
        return tuple(self.penv.customized_method(name, data=data))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env (None where an env has none)."""
        return tuple(self.penv.get_env_attr(name))

    def set_attr(self, name: str, values: Any) -> None:
        """Set ``name`` on every env: to ``values`` if it is not a list or tuple, else one value per env."""
        if not isinstance(values, (list, tuple)):
            self.penv.set_env_attr(name, values)
            return
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr({name!r}) got {len(values)} values for {self.num_envs} envs")
        data = [Arguments((name, value)) for value in values]
        self.penv.customized_method("set_wrapper_attr", data=data)

    def close_extras(self, **kwargs: Any) -> None:
        self.penv.close()


def _same_step_info(info: dict[str, Any], n: int) -> dict[str, Any]:
    """Gymnasium's SAME_STEP info out of the ``restart`` policy's: ``final_obs`` and ``final_info``."""
    ended = ended_states(info)
    if not ended:
        return info
    per_env = []
    for p in range(n):
        if p in ended:
            per_env.append((p, {**reset_info(info, p), "final_obs": ended[p], "final_info": step_info(info, p)}))
        else:
            per_env.append((p, env_info(info, p)))
    return vector_info(per_env, n)
