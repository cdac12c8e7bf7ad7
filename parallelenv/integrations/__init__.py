"""Views of a ParallelEnv through the vector-env interfaces of other libraries.

Each lives in its own module and imports its library only when loaded:
:mod:`parallelenv.integrations.gymnasium`, :mod:`parallelenv.integrations.sb3`
and :mod:`parallelenv.integrations.tianshou`. :mod:`parallelenv.integrations.registration`
makes ``gym.make_vec`` return the Gymnasium view (it imports Gymnasium only).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from parallelenv.integrations.registration import VECTOR_ENV_ID, make_vector_env, register_vector_env

__all__ = ["VECTOR_ENV_ID", "is_wrapped", "make_vector_env", "register_vector_env"]


def is_wrapped(env: gym.Env, wrapper_class: type) -> bool:
    """Whether a ``wrapper_class`` is anywhere in ``env``'s chain of wrappers (run where the env lives)."""
    current: Any = env
    while isinstance(current, gym.Wrapper):
        if isinstance(current, wrapper_class):
            return True
        current = current.env
    return False
