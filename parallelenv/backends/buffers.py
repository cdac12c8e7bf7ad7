"""The arrays a backend exchanges with the front: actions in, results out.

One row per env. The front writes actions and reads results; the env hosts
read actions and write results, each only in the rows of its own envs. For
the subprocess backend these arrays live in shared memory, so observations
cross the process boundary without being pickled; the parts of spaces of no
fixed shape never do (see :mod:`parallelenv.batching`), and travel with the
messages instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gymnasium import spaces

from parallelenv.batching import Allocator, Batched, allocate, private_parts


@dataclass
class Buffers:
    obs: Batched
    actions: Batched
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    #: Results of a call on every env are these arrays themselves, lent to the
    #: caller until the next call rewrites them, rather than copies.
    lent: bool = False
    #: The parts of ``obs`` and ``actions`` private to this process (spaces of
    #: no fixed shape), in a fixed order: what a backend whose envs run in other
    #: processes sends along with its calls and replies. Empty for fixed shapes.
    private_obs: list[np.ndarray] = field(init=False, repr=False)
    private_actions: list[np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.private_obs = private_parts(self.obs)
        self.private_actions = private_parts(self.actions)

    @classmethod
    def allocate(
        cls, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, alloc: Allocator
    ) -> Buffers:
        return cls(
            obs=allocate(obs_space, num_envs, alloc),
            actions=allocate(action_space, num_envs, alloc),
            reward=alloc((num_envs,), np.dtype(np.float64)),
            terminated=alloc((num_envs,), np.dtype(np.bool_)),
            truncated=alloc((num_envs,), np.dtype(np.bool_)),
        )
