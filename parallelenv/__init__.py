"""Run a list of Gymnasium environments in parallel behind one object.

Example:
    >>> from parallelenv import ParallelEnv
    >>> with ParallelEnv.make("CartPole-v1", num_envs=4, para_mode="dummy") as penv:
    ...     obs, info = penv.reset(seed=0)
    >>> obs.shape
    (4, 4)
"""

from parallelenv.backends import register_backend
from parallelenv.backends.ray.cluster import shutdown_ray
from parallelenv.errors import (
    AllEnvsFinishedWarning,
    AlreadyPendingError,
    ClosedError,
    EnvError,
    NoPendingCallError,
    ParallelEnvError,
    ParallelEnvWarning,
    SharedEnvError,
    WorkerDiedError,
    WorkerStartError,
    WorkerTimeoutError,
)
from parallelenv.integrations.registration import VECTOR_ENV_ID, make_vector_env, register_vector_env
from parallelenv.parallel_env import ParallelEnv
from parallelenv.policies import POLICIES
from parallelenv.pool import RolloutPool
from parallelenv.recycling import Recycling
from parallelenv.state import EnvState, StateCheck, StateError, check_state

__all__ = [
    "AllEnvsFinishedWarning",
    "AlreadyPendingError",
    "ClosedError",
    "EnvError",
    "EnvState",
    "NoPendingCallError",
    "POLICIES",
    "ParallelEnv",
    "ParallelEnvError",
    "ParallelEnvWarning",
    "Recycling",
    "RolloutPool",
    "SharedEnvError",
    "StateCheck",
    "StateError",
    "VECTOR_ENV_ID",
    "WorkerDiedError",
    "WorkerStartError",
    "WorkerTimeoutError",
    "check_state",
    "make_vector_env",
    "register_backend",
    "register_vector_env",
    "shutdown_ray",
]

__version__ = "0.1.0"  # the one place; setup.cfg reads it from this line without importing the package
