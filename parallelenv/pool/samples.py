"""What one call of the pool hands back: each worker's batch, tagged, and the work that was lost."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from parallelenv.arrays import Tree, first_leaf, is_tensor, tree_map
from parallelenv.rollout.trajectories import EpisodeBatch, StepFields, Transitions


@dataclass(frozen=True)
class Collected:
    """One worker's batch, as its :class:`~parallelenv.rollout.VecWorker` returned it.

    Attributes:
        worker: the worker that collected it.
        policy_version: the version of the weights it was collected with
            (0: the policy the pool was built with; each ``agent_update`` adds one).
        env_ids: the pool's numbers of the worker's envs (the batch numbers them from 0).
        data: :class:`~parallelenv.rollout.trajectories.Transitions` (``obtain_samples``) or
            :class:`~parallelenv.rollout.trajectories.EpisodeBatch` (``obtain_exact_episodes``).
    """

    worker: int
    policy_version: int
    env_ids: tuple[int, ...]
    data: Transitions | EpisodeBatch

    @property
    def env_steps(self) -> int:
        if isinstance(self.data, Transitions):
            return self.data.num_steps * len(self.env_ids)
        return int(self.data.lengths.sum())


@dataclass(frozen=True)
class LostWork:
    """A request a worker was serving when it died: its steps, and its episodes in progress, are gone.

    Attributes:
        worker: the worker that died (and was replaced).
        env_ids: the pool's numbers of its envs: their episodes in progress were lost.
        policy_version: the version it was collecting with.
        what: the request, in words (``"collecting 8 steps"``).
        reason: how it died (exit code, signal, lost node).
    """

    worker: int
    env_ids: tuple[int, ...]
    policy_version: int
    what: str
    reason: str


@dataclass(frozen=True)
class Samples:
    """The batches of one ``obtain_samples`` or ``obtain_exact_episodes`` call, and what was lost.

    Attributes:
        parts: the workers' batches, by worker in synchronous mode, else in the order they arrived.
        lost: requests lost with a worker that died during the call (its replacement
            collected the same request again); never mixed into ``parts``.
    """

    parts: tuple[Collected, ...]
    lost: tuple[LostWork, ...] = ()

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def env_steps(self) -> int:
        """Transitions (or episode steps) in ``parts``."""
        return sum(part.env_steps for part in self.parts)

    def transitions(self, min_version: int = 0) -> Transitions:
        """The parts' transitions side by side along the env axis: ``(num_steps, columns, ...)``.

        Each part is a block of columns, as if its envs were more envs of one
        worker; :meth:`column_workers` and :meth:`column_versions` say whose
        each column is. Every part must have the same number of steps, as it
        has in every mode (``chunk_steps`` when stragglers do not set the pace).

        Args:
            min_version: leave out parts collected with an older policy version.
        """
        parts = self._transition_parts(min_version)
        steps = {part.data.num_steps for part in parts}
        if len(steps) != 1:
            raise ValueError(f"the parts have {sorted(steps)} steps; join parts of equal length, or read .parts")
        data = [part.data for part in parts]
        joined = {f.name: _join_columns([getattr(d, f.name) for d in data]) for f in dataclasses.fields(StepFields)}
        return Transitions(
            **joined,
            episode_returns=np.concatenate([d.episode_returns for d in data]),
            episode_lengths=np.concatenate([d.episode_lengths for d in data]),
        )

    def column_workers(self, min_version: int = 0) -> np.ndarray:
        """The worker of each column of :meth:`transitions`."""
        return np.array([p.worker for p in self._transition_parts(min_version) for _ in p.env_ids], dtype=np.int64)

    def column_versions(self, min_version: int = 0) -> np.ndarray:
        """The policy version of each column of :meth:`transitions`."""
        return np.array([p.policy_version for p in self._transition_parts(min_version) for _ in p.env_ids],
                        dtype=np.int64)

    def episodes(self) -> EpisodeBatch:
        """Every part's episodes in one batch, their ``env_ids`` the pool's env numbers."""
        batches = [part.data for part in self.parts if isinstance(part.data, EpisodeBatch)]
        if len(batches) != len(self.parts) or not batches:
            raise ValueError("these samples hold no episodes: obtain_exact_episodes returns episodes")
        shifted = [
            dataclasses.replace(batch, env_ids=np.asarray(part.env_ids, dtype=np.int64)[batch.env_ids])
            for part, batch in zip(self.parts, batches, strict=True)
        ]
        return EpisodeBatch.concatenate(shifted)

    def _transition_parts(self, min_version: int) -> list[Collected]:
        parts = [p for p in self.parts if isinstance(p.data, Transitions) and p.policy_version >= min_version]
        if not parts:
            raise ValueError(f"no transitions of policy version {min_version} or later in these samples")
        return parts


def _join_columns(blocks: Sequence[Tree]) -> Tree:
    """Join time-major blocks along their env axis (NumPy or torch leaves)."""
    if is_tensor(first_leaf(blocks[0])):
        import torch

        return tree_map(lambda *xs: torch.cat(xs, dim=1), *blocks)
    return tree_map(lambda *xs: np.concatenate(xs, axis=1), *blocks)

