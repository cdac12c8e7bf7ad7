"""The arrays a backend exchanges with the front: actions in, results out.

One row per env. The front writes actions and reads results; the env hosts
read actions and write results, each only in the rows of its own envs. For
the subprocess backend these arrays live in shared memory, so observations
cross the process boundary without being pickled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from parallelenv.batching import Allocator, Batched, allocate


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
