"""Batched tensor envs shipped with parallelenv, and the Gymnasium ids they stand for.

``ParallelEnv.make("CartPole-v1", num_envs=4096, para_mode="tensor")`` looks
the id up in :data:`TENSOR_ENVS`; :func:`register_tensor_env` adds more.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from parallelenv.arrays import import_torch

import_torch("the shipped tensor envs")  # or says which extra to install, before the envs' own imports need it

from parallelenv.envs.cartpole import CartPole  # noqa: E402
from parallelenv.envs.chasing import Chasing  # noqa: E402
from parallelenv.envs.pendulum import Pendulum  # noqa: E402
from parallelenv.tensor import TensorEnv  # noqa: E402

__all__ = ["TENSOR_ENVS", "CartPole", "Chasing", "Pendulum", "make_tensor_env", "register_tensor_env"]

TENSOR_ENVS: dict[str, type[TensorEnv]] = {"CartPole-v1": CartPole, "Pendulum-v1": Pendulum}


def register_tensor_env(env_id: str, env_class: type[TensorEnv]) -> None:
    """Make ``ParallelEnv.make(env_id, ..., para_mode="tensor")`` build ``env_class``."""
    if not (isinstance(env_class, type) and issubclass(env_class, TensorEnv)):
        raise TypeError(f"{env_class!r} is not a TensorEnv subclass")
    TENSOR_ENVS[env_id] = env_class


def make_tensor_env(env_id: str, num_envs: int, **kwargs: Any) -> TensorEnv:
    """The tensor env registered for the Gymnasium id ``env_id``, with ``num_envs`` envs.

    Example:
        >>> from parallelenv.envs import make_tensor_env
        >>> make_tensor_env("CartPole-v1", num_envs=8, device="cpu").num_envs
        8
    """
    try:
        env_class = TENSOR_ENVS[env_id]
    except KeyError:
        known = ", ".join(sorted(TENSOR_ENVS))
        raise ValueError(f"no tensor env stands for {env_id!r}; registered: {known}") from None
    env = env_class(num_envs=num_envs, **kwargs)
    env.spec = gym.spec(env_id)  # what get_env_attr("spec") tells, as for Gymnasium's own envs
    return env
