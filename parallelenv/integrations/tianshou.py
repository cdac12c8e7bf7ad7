"""A ParallelEnv seen as a Tianshou ``BaseVectorEnv`` (Tianshou 2.x), for its collectors and trainers.

Tianshou resets finished envs itself, by id, after the step that finished
them, so the ParallelEnv must leave finished envs alone: ``asynchronous=
"idle"`` (or ``"continue"``). ``"restart"`` would reset them a second time,
out of Tianshou's sight, and ``None`` would finish every env when one does;
both are refused.

What Tianshou reads, it gets in its own form: ``len()``, ``is_async``, a
list of per-env ``action_space`` (its random policy samples each env's own;
one batched space would repeat one action), ``reset(env_id)`` and
``step(action, id)`` returning an object array of per-env info dicts (its
collector indexes them by env), each step's info naming its ``env_id``.
Given ``wait_num`` or ``timeout``, the adapter is asynchronous as Tianshou's
own are (its ``AsyncCollector``): ``step`` hands actions over with the
ParallelEnv's ``send`` and returns the envs that ``recv`` found ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tianshou.env import BaseVectorEnv

from parallelenv.infos.keys import ENV_ID
from parallelenv.parallel_env import ParallelEnv


class TianshouVectorEnv(BaseVectorEnv):
    """A ``tianshou.env.BaseVectorEnv`` over a ParallelEnv; closing it closes the ParallelEnv.

    Args:
        penv: the ParallelEnv, with ``asynchronous="idle"`` or ``"continue"``.
        wait_num: asynchronous stepping: ``step`` returns once this many envs answered.
        timeout: asynchronous stepping: ``step`` returns what answered within this many seconds.

    An int ``seed`` (to ``reset`` or ``seed``) gives env ``i`` the seed
    ``seed + i``, as Tianshou's ``seed`` does.

    Example:
        >>> import numpy as np
        >>> from parallelenv import ParallelEnv
        >>> from parallelenv.integrations.tianshou import TianshouVectorEnv
        >>> envs = TianshouVectorEnv(ParallelEnv.make("CartPole-v1", num_envs=4, asynchronous="idle"))
        >>> obs, info = envs.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = envs.step(np.array([0, 1]), id=[1, 3])
        >>> len(envs), obs.shape, info[1]["env_id"]
        (4, (2, 4), 3)
        >>> envs.close()
    """

    def __init__(self, penv: ParallelEnv, wait_num: int | None = None, timeout: float | None = None) -> None:
        # BaseVectorEnv.__init__ builds one Tianshou worker per env: the ParallelEnv is ours instead.
        policy = penv.policy
        if policy.restarts_finished_envs or policy.ends_all:
            raise ValueError(
                f"Tianshou resets finished envs itself: build the ParallelEnv with asynchronous='idle' "
                f"(or 'continue'), not {policy.name!r}"
            )
        self.penv = penv
        self.workers = []
        self.env_num = len(penv)
        self.wait_num = wait_num or self.env_num
        if not 1 <= self.wait_num <= self.env_num:
            raise ValueError(f"wait_num={wait_num}; use 1 to {self.env_num}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout={timeout}; use a positive number of seconds")
        self.timeout = timeout
        self.is_async = self.wait_num != self.env_num or timeout is not None
        self.waiting_id: list[int] = []  # sent an action, not answered yet
        self.ready_id = list(range(self.env_num))
        self.is_closed = False

    def get_env_attr(self, key: str, id: int | Sequence[int] | np.ndarray | None = None) -> list[Any]:
        """Attribute ``key`` of each env of ``id`` (all when None), as a list; None where one has none."""
        return self.penv.get_env_attr(key, id=self._ids(id))

    def set_env_attr(self, key: str, value: Any, id: int | Sequence[int] | np.ndarray | None = None) -> None:
        """Set ``key`` to ``value`` on each env of ``id`` (all when None)."""
        self.penv.set_env_attr(key, value, id=self._ids(id))

    def reset(
        self, env_id: int | Sequence[int] | np.ndarray | None = None, **kwargs: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs of ``env_id`` (all when None); ``seed`` and ``options`` in ``kwargs`` as Gymnasium's."""
        ids = self._ids(env_id)
        self._check_ready(ids)
        seed = kwargs.pop("seed", None)
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seed = [int(seed) + i for i in ids]
        options = kwargs.pop("options", None)
        if kwargs:
            raise TypeError(f"reset() got unexpected keyword arguments {sorted(kwargs)}")
        results = self.penv.reset(seed=seed, options=options, id=ids, align="batch")
        return _stack([obs for obs, _ in results]), _infos([info for _, info in results])

    def step(
        self, action: Any, id: int | Sequence[int] | np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step the envs of ``id`` (all when None) with one action each.

        Asynchronous: ``action=None`` only fetches envs still stepping; the
        results are those of the envs that answered, ``info[k]["env_id"]`` saying which.
        """
        ids = self._ids(id)
        if not self.is_async:
            if action is None:
                raise ValueError("action must not be None unless the env is asynchronous (wait_num or timeout)")
            results = self.penv.step(action, id=ids, align="batch")
            for env, result in zip(ids, results, strict=True):
                result[4][ENV_ID] = env
        else:
            results = self._step_async(action, ids)
        obs, reward, terminated, truncated, info = zip(*results, strict=True) if results else ([],) * 5
        return _stack(list(obs)), np.array(reward), np.array(terminated), np.array(truncated), _infos(list(info))

    def _step_async(self, action: Any, ids: list[int]) -> list[tuple[Any, ...]]:
        """Send ``action`` to the envs of ``ids`` (none when None), then what answered, one or more."""
        if action is not None:
            self._check_ready(ids)
            if len(action) != len(ids):
                raise ValueError(f"{len(action)} actions for {len(ids)} envs")
            self.penv.send(action, id=ids)
            self.waiting_id.extend(ids)
            sent = set(ids)
            self.ready_id = [i for i in self.ready_id if i not in sent]
        if not self.waiting_id:
            return []
        results: list[tuple[Any, ...]] = []
        while not results:  # a timeout that found nobody ready waits again, as Tianshou's own do
            results = self.penv.recv(
                wait_num=min(self.wait_num, len(self.waiting_id)), timeout=self.timeout, align="batch"
            )
        for result in results:
            env = int(result[4][ENV_ID])
            self.waiting_id.remove(env)
            self.ready_id.append(env)
        return results

    def seed(self, seed: int | Sequence[int | None] | None = None) -> list[list[int] | None]:
        """Reset every env with its seed (an int ``s`` gives env ``i`` the seed ``s + i``); the seeds used."""
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.env_num)]
        else:
            seeds = list(seed)
        self.penv.reset(seed=seeds)
        return [None if s is None else [s] for s in seeds]

    def render(self, **kwargs: Any) -> list[Any]:
        """Each env's ``render()``."""
        if self.waiting_id:
            raise RuntimeError(f"envs {self.waiting_id} are still stepping, cannot render them now")
        return self.penv.customized_method("render")

    def close(self) -> None:
        """Close the ParallelEnv (again: nothing happens)."""
        self.penv.close()
        self.is_closed = True

    def _ids(self, id: int | Sequence[int] | np.ndarray | None) -> list[int]:
        if id is None:
            return list(range(self.env_num))
        if np.isscalar(id):
            return [int(id)]  # type: ignore[arg-type]  # np.isscalar admits only numbers here
        return [int(i) for i in id]  # type: ignore[union-attr]  # a sequence or array of ints

    def _check_ready(self, ids: list[int]) -> None:
        if self.is_async:
            stepping = sorted(set(ids) & set(self.waiting_id))
            if stepping:
                raise ValueError(f"envs {stepping} are still stepping: fetch them with step(None) first")


def _stack(obs: list[Any]) -> np.ndarray:
    """Per-env observations stacked as Tianshou stacks them (an object array where shapes differ)."""
    if not obs:
        return np.array([])
    try:
        return np.stack(obs)
    except ValueError:
        return np.array(obs, dtype=object)


def _infos(infos: list[dict[str, Any]]) -> np.ndarray:
    """An object array of per-env info dicts, which Tianshou's collector indexes by env."""
    array = np.empty(len(infos), dtype=object)
    array[:] = infos
    return array
