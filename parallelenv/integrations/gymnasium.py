"""A ParallelEnv seen as a ``gymnasium.vector.VectorEnv``, for code and wrappers written for Gymnasium.

Which Gymnasium autoreset modes each ``asynchronous`` policy serves (the
first is the view's default; pick another with ``autoreset_mode=``):

- ``"restart"``: ``AutoresetMode.SAME_STEP``. A finished env is reset in the
  step that finishes it; ``info["final_obs"]`` is an object array holding
  each ended episode's last obs as the env returned it (None for the other
  envs) and ``info["final_info"]`` its last info, both with their ``_``
  masks, and the top-level info of such an env is its reset's info: as
  Gymnasium's own vector envs report it.
- ``"idle"`` and ``"continue"``: ``AutoresetMode.NEXT_STEP``. The step that
  finishes an env returns its real last obs; the next step resets it
  (reward 0, not terminated, not truncated, the reset's obs and info) and
  ignores its action. This is the mode ``NormalizeObservation`` and the
  other observation wrappers require. Or ``AutoresetMode.DISABLED``: nothing
  resets a finished env but ``reset(options={"reset_mask": mask})``, which
  resets the envs of the mask only; stepping a finished env before that is
  refused, as Gymnasium refuses it.
- ``None`` (one env finishing finishes all, the ParallelEnv's default)
  matches no Gymnasium mode and is refused.

``reset(options={"reset_mask": mask})`` works in every mode.

An env rebuilt after a failure (``on_worker_failure`` / ``on_env_error=
"restart"``) ends its episode, truncated, as any ended episode ends in the
mode: its last obs is the one the view returned last for it (in
``info["final_obs"]`` under SAME_STEP, as the step's obs under NEXT_STEP and
DISABLED), and ``worker_restarted`` or ``env_restarted`` and ``failure`` go
with it (in ``info["final_info"]`` under SAME_STEP, where the top level keeps
them too, beside the new episode's reset info). Under NEXT_STEP the next
step resets it as it resets any env that ended (the ``idle`` policy keeps a
truncated env idle until it is reset, whatever reset the rebuild did).

The part of a space of no fixed shape (Graph, Sequence, Text, OneOf, a
custom Space subclass) is returned as Gymnasium's vector envs return it, a
tuple of per-env values, where the ParallelEnv returns a 1-D object array.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from parallelenv.arrays import copy_tree
from parallelenv.batching import allocate, as_gymnasium_batch, check_batch, private_parts, put, take, unbatch, zeros
from parallelenv.calls import Arguments
from parallelenv.infos import env_info, python_dtypes_as_python, rebuilt_envs
from parallelenv.infos.keys import (
    ENDED_STATE,
    ENDED_STATE_MASK,
    FAILURE_KEYS,
    FINAL_INFO,
    FINAL_OBS,
    RESET_INFO,
    RESTART_KEYS,
)
from parallelenv.integrations.consumers import check_consumer
from parallelenv.policies import Policy


def autoreset_modes(policy: Policy) -> tuple[AutoresetMode, ...]:
    """The Gymnasium autoreset modes a view over ``policy`` can serve, its default first.

    A policy that leaves finished envs to the caller (``"idle"``, ``"continue"``)
    serves DISABLED too: the view then resets only what ``reset_mask`` names.
    """
    default = policy.autoreset_mode()  # a ValueError for a policy with none
    if not policy.restarts_finished_envs and not policy.ends_all:
        return default, AutoresetMode.DISABLED
    return (default,)


class GymnasiumVectorEnv(VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` over a ParallelEnv; closing it closes the ParallelEnv.

    Args:
        penv: the ParallelEnv; its ``asynchronous`` policy decides which
            autoreset modes the view can serve (see the module's docstring).
        autoreset_mode: one of those (an ``AutoresetMode`` or its value);
            None takes the policy's default.

    Seeds are ``SyncVectorEnv``'s: an int seed gives env ``i`` the seed
    ``seed + i``, so that code comparing with Gymnasium's vector envs gets
    the same episodes (``ParallelEnv.reset`` itself derives independent
    seeds instead: child ``i`` of ``SeedSequence(seed)``).

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from gymnasium.vector import AutoresetMode
        >>> from parallelenv import ParallelEnv
        >>> from parallelenv.integrations.gymnasium import GymnasiumVectorEnv
        >>> envs = ParallelEnv.make("CartPole-v1", num_envs=4, para_mode="dummy", asynchronous="restart").as_gymnasium()
        >>> envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
        >>> obs, info = envs.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
        >>> envs.metadata["autoreset_mode"]
        <AutoresetMode.SAME_STEP: 'SameStep'>
        >>> envs.close()
        >>> penv = ParallelEnv.make("CartPole-v1", num_envs=2, para_mode="dummy", asynchronous="continue")
        >>> envs = GymnasiumVectorEnv(penv, autoreset_mode=AutoresetMode.DISABLED)
        >>> obs, info = envs.reset(seed=0)
        >>> obs, info = envs.reset(options={"reset_mask": np.array([True, False])})  # env 0 only
        >>> envs.close()
    """

    # penv: a ParallelEnv, not imported here: ParallelEnv.as_gymnasium imports this module.
    def __init__(self, penv: Any, autoreset_mode: AutoresetMode | str | None = None) -> None:
        modes = autoreset_modes(penv.policy)
        mode = modes[0] if autoreset_mode is None else AutoresetMode(autoreset_mode)
        if mode not in modes:
            served = " or ".join(str(served_mode) for served_mode in modes)
            self.closed = True  # Gymnasium 1.2's VectorEnv.__del__ closes a view not closed: the ParallelEnv stays yours
            raise ValueError(
                f"autoreset_mode={mode} is not what asynchronous={penv.policy.name!r} does: it serves {served}. "
                "SAME_STEP is asynchronous='restart'; NEXT_STEP and DISABLED are 'idle' or 'continue'"
            )
        self.penv = penv
        check_consumer(mode, penv)  # a framework that assumes another mode would record wrong episodes
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
        # NEXT_STEP: the envs to reset in the next step; DISABLED: the envs reset_mask must reset before they step.
        self._finished = np.zeros(self.num_envs, dtype=bool)
        # The observations last returned: a reset_mask reset returns them for the envs it leaves alone,
        # and an env rebuilt after a failure ended its episode on its row.
        self._obs = allocate(self.single_observation_space, self.num_envs, zeros)
        # Parts of no fixed shape come from the ParallelEnv as object arrays; Gymnasium's are tuples.
        self._has_object_parts = bool(private_parts(self._obs))

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's ``np_random_seed``, as ``SyncVectorEnv`` and ``AsyncVectorEnv`` report it."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Each env's ``np_random`` (copies, from the process backends), as Gymnasium's vector envs report it."""
        return self.get_attr("np_random")

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env, or those of ``options["reset_mask"]``; ``seed`` is an int (env ``i`` gets
        ``seed + i``, as in Gymnasium), a list with one per env, or None."""
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seed = [int(seed) + i for i in range(self.num_envs)]
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = _reset_mask(options.pop("reset_mask"), self.num_envs)
            return self._reset_masked(mask, seed, options)
        self._finished[:] = False
        obs, info = self.penv.reset(seed=seed, options=options)
        self._obs = self._own(obs)
        return self._as_gymnasium(self._obs), info

    def _reset_masked(self, mask: np.ndarray, seed: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Reset the envs of ``mask``; the others keep the obs last returned and report no info."""
        ids = np.flatnonzero(mask)
        if isinstance(seed, (list, tuple)):
            if len(seed) != self.num_envs:
                raise ValueError(f"seed has {len(seed)} entries for {self.num_envs} envs")
            seed = [seed[i] for i in ids.tolist()]
        reset_obs, info = self.penv.reset(seed=seed, options=options, id=ids)
        obs = take(self._obs, None)
        put(obs, ids, reset_obs)
        self._finished[ids] = False
        self._obs = obs
        return self._as_gymnasium(obs), _spread(info, ids, self.num_envs)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        mode = self.autoreset_mode
        if mode is AutoresetMode.SAME_STEP:
            obs, reward, terminated, truncated, info = self.penv.step(actions)
            obs = self._own(obs)
            result = obs, reward, terminated, truncated, self._same_step_info(info)
        elif mode is AutoresetMode.DISABLED:
            if self._finished.any():
                raise ValueError(
                    f"envs {np.flatnonzero(self._finished).tolist()} ended and were not reset: with "
                    "AutoresetMode.DISABLED, reset them with reset(options={'reset_mask': mask}) before stepping"
                )
            result = self._step_every_env(actions)
        elif self._finished.any():
            result = self._reset_and_step(actions)
        else:
            result = self._step_every_env(actions)
        if mode is not AutoresetMode.SAME_STEP:
            self._finished = result[2] | result[3]
        self._obs = result[0]
        if self._has_object_parts:
            return (as_gymnasium_batch(result[0]), *result[1:])
        return result

    def _own(self, obs: Any) -> Any:
        """``obs`` of a call on every env, kept: where the ParallelEnv hands over its result buffers
        (``copy=False``) the next call overwrites them, and a rebuilt env's episode ends on this obs."""
        return copy_tree(obs) if self.penv.reuses_result_buffers else obs

    def _step_every_env(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """NEXT_STEP and DISABLED: a step of every env, its rebuilt envs' episodes ended on their last obs."""
        obs, reward, terminated, truncated, info = self.penv.step(actions)
        obs = self._own(obs)
        rebuilt = rebuilt_envs(info, self.num_envs)
        if not rebuilt.any():
            return obs, reward, terminated, truncated, info
        entries = {p: env_info(info, p, python_dtypes_as_python) for p in range(self.num_envs)}
        self._cut(obs, entries, np.flatnonzero(rebuilt))
        return obs, reward, terminated, truncated, self._merge(entries)

    def _cut(self, obs: Any, entries: dict[int, dict[str, Any]], rebuilt: np.ndarray) -> None:
        """NEXT_STEP and DISABLED: the envs ``rebuilt`` answered with their new episode's first obs and
        reset info; in ``obs`` and ``entries`` (by env) their episodes end where they were instead, the
        failure their info. The next reset of each, the reset step's or reset_mask's, starts its new one."""
        put(obs, rebuilt, take(self._obs, rebuilt))
        for i in rebuilt.tolist():
            entries[i] = {key: entries[i][key] for key in FAILURE_KEYS if key in entries[i]}

    def _merge(self, entries: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Per-env infos (by env) merged as ``SyncVectorEnv`` merges them."""
        infos: dict[str, Any] = {}
        for i in sorted(entries):
            infos = self._add_info(infos, entries[i], i)
        return infos

    def _as_gymnasium(self, obs: Any) -> Any:
        """Observations as Gymnasium's vector envs return them (see ``batching.as_gymnasium_batch``)."""
        return as_gymnasium_batch(obs) if self._has_object_parts else obs

    def _reset_and_step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """NEXT_STEP: reset the envs that finished last step, step the others."""
        n = self.num_envs
        batch = check_batch(self.single_action_space, actions, n)
        reset_ids, step_ids = np.flatnonzero(self._finished), np.flatnonzero(~self._finished)
        obs = allocate(self.single_observation_space, n, zeros)
        reward, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        reset_obs, first_info = self.penv.reset(id=reset_ids)
        put(obs, reset_ids, reset_obs)
        parts = [(reset_ids, first_info)]
        rebuilt = np.zeros(0, dtype=np.int64)
        if step_ids.size:
            step_obs, step_reward, step_terminated, step_truncated, info = self.penv.step(
                take(batch, step_ids), id=step_ids
            )
            put(obs, step_ids, step_obs)
            reward[step_ids], terminated[step_ids], truncated[step_ids] = step_reward, step_terminated, step_truncated
            parts.append((step_ids, info))
            rebuilt = step_ids[rebuilt_envs(info, step_ids.size)]
        entries = {
            i: env_info(part, p, python_dtypes_as_python) for ids, part in parts for p, i in enumerate(ids.tolist())
        }
        if rebuilt.size:
            self._cut(obs, entries, rebuilt)
        return obs, reward, terminated, truncated, self._merge(entries)

    def _same_step_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """Gymnasium's SAME_STEP info out of the ``restart`` policy's, merged as ``SyncVectorEnv`` merges it."""
        ended = info.get(ENDED_STATE_MASK)
        rebuilt = rebuilt_envs(info, self.num_envs)
        if ended is None and not rebuilt.any():
            return info
        infos: dict[str, Any] = {}
        # Each env's own values, merged again as SyncVectorEnv merges them: the step's vector info cast
        # each value to the dtype of the first env that set its key (a 0.5 to an int 0), where the
        # ended envs' step infos, now in final_info, came first.
        handed_over = self.penv.last_step_info  # the step just handed over, of every env in order
        for p in range(self.num_envs):
            entry = env_info(info, p, python_dtypes_as_python)
            if handed_over is not None:
                own = handed_over.env_step_info(p, p, python_dtypes_as_python)
                entry = {key: own.get(key, value) for key, value in entry.items()}
            if ended is not None and ended[p]:
                final_obs, reset_info = entry.pop(ENDED_STATE), entry.pop(RESET_INFO, {})
                step_info = {key: value for key, value in entry.items() if key not in RESTART_KEYS}
                infos = self._add_info(infos, {FINAL_OBS: final_obs, FINAL_INFO: step_info}, p)
                entry = reset_info
            elif rebuilt[p]:
                # Rebuilt after a failure, the env answered with its new episode's first obs and reset
                # info: the old episode was cut where the caller last saw it, and the failure ended it.
                # The top level keeps the failure too, where the ParallelEnv reports it.
                cut = {key: entry[key] for key in FAILURE_KEYS if key in entry}
                infos = self._add_info(infos, {FINAL_OBS: unbatch(self._obs, p), FINAL_INFO: cut}, p)
            infos = self._add_info(infos, entry, p)
        return infos

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


def _reset_mask(mask: Any, n: int) -> np.ndarray:
    """``options["reset_mask"]`` checked as Gymnasium's vector envs check it, with their messages."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={mask}"
        )
    return mask


def _spread(info: dict[str, Any], ids: np.ndarray, n: int) -> dict[str, Any]:
    """A vector info over the envs ``ids`` (in that order) as one over all ``n`` envs, the others unset."""
    spread: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            spread[key] = _spread(value, ids, n)
            continue
        if value.dtype == object:
            full = np.full(n, None, dtype=object)
        else:
            full = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
        full[ids] = value
        spread[key] = full
    return spread
