"""Gymnasium's front door: ``gym.make_vec`` returning a ParallelEnv's Gymnasium view.

``gym.make_vec(id, num_envs, vectorization_mode="vector_entry_point")`` is how
Gymnasium, and the trainers built on it, ask for a vector env. Two ids lead
to ours:

- :data:`VECTOR_ENV_ID` (``"parallelenv/ParallelEnv-v0"``), registered when
  ``parallelenv`` is imported, runs the env named by ``env_id=``;
- :func:`register_vector_env` registers an id of your own with its defaults.

Every keyword argument of ``make_vec`` reaches :func:`make_vector_env`: the
ParallelEnv's options (``para_mode``, ``asynchronous``, ``call_timeout``,
...), ``autoreset_mode``, the backend's options (``num_workers``, ..., or
``backend_options={...}``), and the rest for ``gym.make`` of each env, as
:meth:`ParallelEnv.make` splits them (:mod:`parallelenv.make_options`): one
that neither the backend nor ``gym.make`` takes is refused before any worker
starts. Gymnasium refuses ``vector_kwargs`` in this
mode, so those keywords are the way to override an id's defaults. The
autoreset mode is Gymnasium's default, ``NEXT_STEP``, unless you ask for
another.

Nothing here imports ray or torch: the backend is loaded when an env is made.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv

from parallelenv.integrations.consumers import check_consumer

VECTOR_ENV_ID = "parallelenv/ParallelEnv-v0"
ENTRY_POINT = "parallelenv.integrations.registration:make_vector_env"

# ``asynchronous`` not given: the policy serving the autoreset mode (asynchronous=None is a policy too).
class _ServingTheMode:
    def __repr__(self) -> str:
        return "<the policy serving autoreset_mode>"


_SERVING_THE_MODE: Any = _ServingTheMode()
# The asynchronous policy that serves each autoreset mode where the caller names none.
POLICY_FOR_MODE = {
    AutoresetMode.NEXT_STEP: "idle",
    AutoresetMode.SAME_STEP: "restart",
    AutoresetMode.DISABLED: "idle",
}


def make_vector_env(
    num_envs: int = 1,
    *,
    env_id: str | None = None,
    para_mode: str = "dummy",
    autoreset_mode: AutoresetMode | str | None = None,
    asynchronous: Any = _SERVING_THE_MODE,
    backend_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> VectorEnv:
    """``num_envs`` copies of the Gymnasium env ``env_id`` in a ParallelEnv, seen as a Gymnasium vector env.

    The vector entry point of :data:`VECTOR_ENV_ID` and of the ids
    :func:`register_vector_env` registers; ``gym.make_vec`` calls it.

    Args:
        num_envs: how many envs.
        env_id: the Gymnasium id of the envs, made where they run.
        para_mode: the ParallelEnv's backend (``"dummy"``, ``"subproc"``, ``"ray"``, ``"ray-subproc"``, ...).
        autoreset_mode: the view's ``AutoresetMode`` (or its value); default
            ``NEXT_STEP``, Gymnasium's, or what ``asynchronous`` serves when it is given.
        asynchronous: the ParallelEnv's policy; default the one serving
            ``autoreset_mode`` (``"idle"`` for ``NEXT_STEP`` and ``DISABLED``, ``"restart"`` for ``SAME_STEP``).
        backend_options: passed to the backend (``num_workers``, ``num_actors``, ...).
        **kwargs: the ParallelEnv's other options (``call_timeout``, ``num_cpus``, ...), the
            backend's options and ``gym.make``'s keyword arguments for each env, as
            :meth:`ParallelEnv.make` splits them.

    Example:
        >>> import gymnasium as gym
        >>> import parallelenv
        >>> envs = gym.make_vec(
        ...     "parallelenv/ParallelEnv-v0", num_envs=4, vectorization_mode="vector_entry_point",
        ...     env_id="CartPole-v1", para_mode="dummy",
        ... )
        >>> envs.metadata["autoreset_mode"]
        <AutoresetMode.NEXT_STEP: 'NextStep'>
        >>> obs, info = envs.reset(seed=0)
        >>> obs.shape
        (4, 4)
        >>> envs.close()
    """
    from parallelenv.integrations.gymnasium import GymnasiumVectorEnv
    from parallelenv.parallel_env import ParallelEnv

    if env_id is None:
        raise ValueError(
            "say which env to run: gym.make_vec(..., env_id='CartPole-v1'), or register an id with "
            "parallelenv.register_vector_env(id, env_id=...)"
        )
    if autoreset_mode is not None:
        autoreset_mode = AutoresetMode(autoreset_mode)
    elif asynchronous is _SERVING_THE_MODE:
        autoreset_mode = AutoresetMode.NEXT_STEP
    if asynchronous is _SERVING_THE_MODE:
        asynchronous = POLICY_FOR_MODE[autoreset_mode]
    if autoreset_mode is not None:
        check_consumer(autoreset_mode)  # before any worker starts
    penv = ParallelEnv.make(
        env_id, num_envs, para_mode, asynchronous=asynchronous, backend_options=backend_options, **kwargs
    )
    try:
        return GymnasiumVectorEnv(penv, autoreset_mode=autoreset_mode)
    except ValueError:
        penv.close()
        raise


def register_vector_env(id: str, env_id: str, para_mode: str = "dummy", **defaults: Any) -> None:
    """Register ``id`` with Gymnasium so that ``gym.make_vec(id, num_envs)`` runs ``env_id`` in a ParallelEnv.

    ``para_mode`` and ``defaults`` (any keyword argument of :func:`make_vector_env`)
    are the id's defaults; ``make_vec``'s keyword arguments override them.
    ``gym.make_vec(id, num_envs)`` takes the vector entry point without being told.

    Example:
        >>> import gymnasium as gym
        >>> from parallelenv import register_vector_env
        >>> register_vector_env("MyProject/CartPole-v1", env_id="CartPole-v1", para_mode="dummy")
        >>> envs = gym.make_vec("MyProject/CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
        >>> type(envs).__name__, envs.num_envs
        ('GymnasiumVectorEnv', 2)
        >>> envs.close()
    """
    gym.register(id, vector_entry_point=ENTRY_POINT, kwargs={"env_id": env_id, "para_mode": para_mode, **defaults})


if VECTOR_ENV_ID not in gym.registry:  # a reload of this module registers nothing twice
    gym.register(VECTOR_ENV_ID, vector_entry_point=ENTRY_POINT)
