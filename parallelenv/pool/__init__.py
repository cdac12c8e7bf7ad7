"""A pool of rollout workers: VecWorkers in processes or Ray actors, with garage's sampler calls.

Example:
    >>> import numpy as np
    >>> import gymnasium as gym
    >>> from functools import partial
    >>> from parallelenv.pool import RolloutPool
    >>> def lean(obs):
    ...     return (obs[:, 2] > 0).astype(np.int64)
    >>> envs = [partial(gym.make, "CartPole-v1") for _ in range(4)]
    >>> with RolloutPool(envs, lean, num_workers=2, seed=0) as pool:
    ...     samples = pool.obtain_samples(0, num_samples=64)
    >>> samples.transitions().reward.shape, sorted({part.worker for part in samples.parts})
    ((16, 4), [0, 1])
"""

from parallelenv.pool.checks import MODES
from parallelenv.pool.errors import PoolWorkerError
from parallelenv.pool.rollout_pool import RolloutPool
from parallelenv.pool.samples import Collected, LostWork, Samples

__all__ = ["MODES", "Collected", "LostWork", "PoolWorkerError", "RolloutPool", "Samples"]
