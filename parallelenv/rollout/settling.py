"""Settling a step for :class:`~parallelenv.rollout.VecWorker`: where each env's episode stands after it.

A step is settled once its results are in: the episodes it ended (by the
env, by ``max_episode_length``, or by the ``asynchronous=None`` rule, which
ends every env's episode with the first one's) are counted and their envs
reset where the ParallelEnv did not reset them, and each transition's
``next_obs`` is made the real last obs of its episode, never the next
episode's first. Plain and overlapped collection settle every step here,
the one for every env at once, the other half by half.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from parallelenv.arrays import Tree, copy_tree, put_masked, put_row, put_rows, to_numpy, tree_map
from parallelenv.infos import ended_states, rebuilt_envs
from parallelenv.infos.keys import ENDED_STATE, ENDED_STATE_MASK
from parallelenv.rollout.trajectories import StepFields

if TYPE_CHECKING:
    from parallelenv.parallel_env import ParallelEnv

Rows = slice | np.ndarray  # every env's slice, or a half's ids


@dataclass(frozen=True)
class StepRecord(StepFields):
    """One step of some envs, in the worker's output format, with its vector info."""

    info: dict[str, Any]


@dataclass(frozen=True)
class Settled:
    """One step of some envs, recorded, and where it left them."""

    step: StepRecord
    ended: np.ndarray  # the envs whose episode ended with it
    obs: Tree  # their obs for the next step: a new episode's first where one ended
    returns: list[float]  # of the episodes that ended, in env order
    lengths: list[int]
    # Of ``ended``, the envs rebuilt after a failure: their episode was cut short, not completed. None: none.
    rebuilt: np.ndarray | None = None


class Settler:
    """The return and length of each env's episode in progress, and the settling of each step.

    Args:
        penv: the envs; the settler resets those whose episode ended and
            that the ParallelEnv did not reset itself.
        max_episode_length: episodes are cut (truncated) after this many steps; None: never.
        out: converts results to the worker's output format.
    """

    def __init__(self, penv: ParallelEnv, max_episode_length: int | None, out: Callable[[Tree], Tree]) -> None:
        self.penv = penv
        self.max_episode_length = max_episode_length
        self.out = out
        self.num_envs = len(penv)
        self.returns = np.zeros(self.num_envs)
        self.lengths = np.zeros(self.num_envs, dtype=np.int64)

    def new_episodes(self, ids: Rows) -> None:
        """The envs of ``ids`` start new episodes: nothing returned, no step taken yet."""
        self.returns[ids] = 0
        self.lengths[ids] = 0

    def settle(self, rows: Rows, obs: Tree, action: Tree, results: Any) -> Settled:
        """Record one step of the envs of ``rows`` (``results`` as ``step`` returns them for those
        envs, ``obs`` and ``action`` what they were sent); restart their episodes that ended."""
        next_obs, reward, terminated, truncated, info = results
        terminated_np = to_numpy(terminated).astype(bool)
        truncated_np = to_numpy(truncated).astype(bool)
        done = terminated_np | truncated_np
        self.returns[rows] += to_numpy(reward)
        self.lengths[rows] += 1
        next_obs, reward = self.out(next_obs), self.out(reward)
        cut = np.zeros_like(done)
        if self.max_episode_length is not None:
            cut |= (self.lengths[rows] >= self.max_episode_length) & ~done
        if self.penv.policy.ends_all and done.any():
            cut |= ~done  # the asynchronous=None rule has finished every env (overlap settles all rows together then)
        ended = done | cut
        new_obs = next_obs
        restarted = info.get(ENDED_STATE_MASK)
        rebuilt = rebuilt_envs(info, len(terminated_np))
        if not rebuilt.any():
            rebuilt = None
        if restarted is not None or rebuilt is not None:
            next_obs = copy_tree(next_obs)
        if restarted is not None:  # asynchronous="restart" reset these envs: their real last obs is in the info
            if not put_masked(next_obs, restarted, info[ENDED_STATE]):
                for p, last in ended_states(info).items():
                    put_row(next_obs, p, last)
        if rebuilt is not None:
            # Envs rebuilt after a failure (on_worker_failure / on_env_error="restart")
            # answered with their new episode's first obs: the old episode ends,
            # truncated, where its env last was, and the new one starts from that obs.
            for p in np.flatnonzero(rebuilt).tolist():
                put_row(next_obs, p, tree_map(lambda x, p=p: x[p], obs))
            restarted = rebuilt if restarted is None else to_numpy(restarted) | rebuilt
        step = StepRecord(obs, action, reward, self.out(terminated_np), self.out(truncated_np | cut), next_obs, info)
        if not ended.any():
            return Settled(step, ended, new_obs, [], [])
        returns, lengths = self.returns[rows][ended].tolist(), self.lengths[rows][ended].tolist()
        restarted_np = np.zeros_like(ended) if restarted is None else to_numpy(restarted)
        new_obs = self._end_episodes(rows, new_obs, ended, restarted_np)
        return Settled(step, ended, new_obs, returns, lengths, rebuilt)

    def _end_episodes(self, rows: Rows, obs: Tree, ended: np.ndarray, restarted: np.ndarray) -> Tree:
        """Zero the counters of ended episodes; reset the envs the ParallelEnv did not. Returns ``obs``
        (of the envs of ``rows``) with the first obs of the envs reset here."""
        ids = np.arange(self.num_envs)[rows]
        self.new_episodes(ids[ended])
        to_reset = ended & ~restarted
        if not to_reset.any():
            return obs
        first, _ = self.penv.reset(id=ids[to_reset])
        obs = copy_tree(obs)
        put_rows(obs, np.flatnonzero(to_reset), self.out(first))
        return obs


