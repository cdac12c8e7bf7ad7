"""The record behind :class:`~parallelenv.rollout.VecWorker`'s episode API.

``step_episode`` steps every env together, and envs finish their episodes
at different steps; an episode is handed over whole once it ends. The record
keeps the steps since the oldest episode still in progress, so that each
episode is cut out of them when it ends, and no step longer than that.
"""

from __future__ import annotations

import numpy as np

from parallelenv.arrays import Tree, stack, to_numpy, tree_map
from parallelenv.infos import step_info
from parallelenv.rollout.settling import StepRecord
from parallelenv.rollout.trajectories import EpisodeBatch

NOT_RECORDED = -1  # an episode's start: it began before recording did, so it is not handed over


class EpisodeRecord:
    """Steps of every env since the oldest recorded episode in progress, and the episodes completed."""

    def __init__(self, num_envs: int) -> None:
        self.steps: list[StepRecord] = []
        self.first_step = 0  # the step number of steps[0]
        self.episode_start = np.full(num_envs, NOT_RECORDED, dtype=np.int64)
        self.completed: list[EpisodeBatch] = []
        self.recording = False

    def start(self, step_count: int) -> None:
        """Record a new episode in every env, from step ``step_count`` on."""
        self.steps, self.first_step = [], step_count
        self.episode_start[:] = step_count
        self.recording = True

    def resume(self, step_count: int) -> None:
        """Record from step ``step_count`` on, if not recording; the episodes in progress are not recorded."""
        if not self.recording:
            self.steps, self.first_step = [], step_count
            self.recording = True

    def stop(self) -> None:
        """Record nothing: transitions are collected instead of episodes."""
        self.recording = False
        self.steps, self.completed = [], []
        self.episode_start[:] = NOT_RECORDED

    def add(self, step: StepRecord, ended: np.ndarray, step_count: int, cut_short: np.ndarray | None = None) -> int:
        """Record ``step``, which made the step count ``step_count``; ``ended``: the envs whose
        episode ended with it, and start a new one with the next step. Returns how many recorded
        episodes it completed: those of ``cut_short`` (envs rebuilt after a failure) are dropped,
        since a crash, not the env, ended them."""
        self.steps.append(step)
        count = 0
        for i in np.flatnonzero(ended).tolist():
            if self.episode_start[i] != NOT_RECORDED and (cut_short is None or not cut_short[i]):
                self.completed.append(self._episode(i))
                count += 1
            self.episode_start[i] = step_count
        self._forget_old_steps(step_count)
        return count

    def drop(self, ids: np.ndarray, step_count: int) -> None:
        """The episodes in progress of ``ids`` are gone (their envs replaced): record new ones from
        ``step_count`` on, if recording."""
        self.episode_start[ids] = step_count if self.recording else NOT_RECORDED

    def take_completed(self) -> list[EpisodeBatch]:
        """The episodes completed since the last call."""
        completed, self.completed = self.completed, []
        return completed

    def _episode(self, i: int) -> EpisodeBatch:
        """Env ``i``'s episode that ended with the last step, out of the recorded steps."""
        records = self.steps[self.episode_start[i] - self.first_step:]

        def rows(field: str) -> Tree:
            return stack([tree_map(lambda x: x[i], getattr(r, field)) for r in records])

        last = records[-1]
        returns = float(to_numpy(stack([r.reward[i] for r in records])).sum())
        return EpisodeBatch(
            env_ids=np.array([i]),
            lengths=np.array([len(records)]),
            returns=np.array([returns]),
            observations=rows("obs"),
            actions=rows("action"),
            rewards=rows("reward"),
            terminations=rows("terminated"),
            truncations=rows("truncated"),
            infos=[step_info(r.info, i) for r in records],
            last_observations=tree_map(lambda x: x[i : i + 1], last.next_obs),
        )

    def _forget_old_steps(self, step_count: int) -> None:
        """Drop recorded steps that no recorded episode in progress needs."""
        live = self.episode_start[self.episode_start != NOT_RECORDED]
        oldest = int(live.min()) if live.size else step_count
        if oldest > self.first_step:
            del self.steps[: oldest - self.first_step]
            self.first_step = oldest
