"""What :class:`~parallelenv.rollout.VecWorker` hands a learner: transitions and whole episodes.

Leaves are NumPy arrays or torch tensors, as the worker was asked for;
the episode statistics (returns, lengths) are always NumPy, for logging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv.arrays import Tree, concatenate, stack
from parallelenv.batching import allocate, zeros


@dataclass(frozen=True)
class StepFields:
    """Transition fields: an observation, the action taken, and what it led to."""

    obs: Tree
    action: Tree
    reward: Any
    terminated: Any
    truncated: Any
    next_obs: Tree


@dataclass(frozen=True)
class Transitions(StepFields):
    """``num_steps`` steps of every env, time-major: each field is shaped ``(num_steps, num_envs, ...)``.

    ``next_obs`` is the observation each action led to. Where an episode
    ended (``terminated | truncated``) it is that episode's real last
    observation, never the first one of the next episode; ``obs`` of the
    following step is then the next episode's first.

    Attributes:
        obs, action, reward, terminated, truncated, next_obs: the transitions.
        episode_returns: the return of every episode that ended during these steps.
        episode_lengths: their lengths, in steps (also counting steps before this batch).
    """

    episode_returns: np.ndarray
    episode_lengths: np.ndarray

    @classmethod
    def from_steps(cls, steps: Sequence[StepFields], episode_returns: Sequence[float],
                   episode_lengths: Sequence[int]) -> Transitions:
        """Stack single steps of every env along a new time axis."""
        stacked = {f.name: stack([getattr(step, f.name) for step in steps]) for f in fields(StepFields)}
        return cls(
            **stacked,
            episode_returns=np.array(episode_returns, dtype=np.float64),
            episode_lengths=np.array(episode_lengths, dtype=np.int64),
        )

    @property
    def num_steps(self) -> int:
        return len(self.reward)


@dataclass(frozen=True)
class EpisodeBatch:
    """Whole episodes, one after another along the first axis of each step field.

    Episode ``k`` occupies rows ``starts[k] : starts[k] + lengths[k]`` of
    ``observations``, ``actions``, ``rewards``, ``terminations``,
    ``truncations`` and ``infos``; ``last_observations[k]`` is the
    observation its last action led to.

    Attributes:
        env_ids: the env each episode ran in.
        lengths: steps per episode.
        returns: undiscounted return per episode.
        observations: the observation each action was chosen from.
        actions, rewards, terminations, truncations: per step.
        infos: the env's info dict of each step.
        last_observations: per episode, its final observation.
    """

    env_ids: np.ndarray
    lengths: np.ndarray
    returns: np.ndarray
    observations: Tree
    actions: Tree
    rewards: Any
    terminations: Any
    truncations: Any
    infos: list[dict[str, Any]]
    last_observations: Tree

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def starts(self) -> np.ndarray:
        """The first row of each episode."""
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    @classmethod
    def empty(cls, observation_space: gym.Space, action_space: gym.Space,
              convert: Callable[[Tree], Tree]) -> EpisodeBatch:
        """No episodes, with fields of the right structure, passed through ``convert`` (to NumPy or torch)."""
        obs = allocate(observation_space, 0, zeros)
        flags = np.zeros(0, dtype=bool)
        return cls(
            env_ids=np.zeros(0, dtype=np.int64),
            lengths=np.zeros(0, dtype=np.int64),
            returns=np.zeros(0),
            observations=convert(obs),
            actions=convert(allocate(action_space, 0, zeros)),
            rewards=convert(np.zeros(0)),
            terminations=convert(flags),
            truncations=convert(flags),
            infos=[],
            last_observations=convert(obs),
        )

    @classmethod
    def concatenate(cls, batches: Sequence[EpisodeBatch]) -> EpisodeBatch:
        """One batch holding the episodes of ``batches``, in order (at least one batch)."""
        if len(batches) == 1:
            return batches[0]
        return cls(
            env_ids=np.concatenate([b.env_ids for b in batches]),
            lengths=np.concatenate([b.lengths for b in batches]),
            returns=np.concatenate([b.returns for b in batches]),
            observations=concatenate([b.observations for b in batches]),
            actions=concatenate([b.actions for b in batches]),
            rewards=concatenate([b.rewards for b in batches]),
            terminations=concatenate([b.terminations for b in batches]),
            truncations=concatenate([b.truncations for b in batches]),
            infos=[info for b in batches for info in b.infos],
            last_observations=concatenate([b.last_observations for b in batches]),
        )
