"""The factories of ``para_mode="ray"`` and ``"ray-subproc"``: the options each takes, by name.

They name their options in their signatures, not as ``**options``, so that
``ParallelEnv.make`` can tell a backend option from an env's keyword
(:mod:`parallelenv.make_options`) without starting Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallelenv.backends.base import BackendConfig
from parallelenv.backends.env_sources import EnvSource, env_list
from parallelenv.backends.ray.backend import START_TIMEOUT_S, RayBackend


def make_ray(sources: Sequence[EnvSource], config: BackendConfig, *, start_timeout: float | None = START_TIMEOUT_S,
             actor_options: dict[str, Any] | None = None) -> RayBackend:
    """``para_mode="ray"``: one actor per env.

    Options: ``start_timeout`` (seconds the start may go with no actor
    starting, default 60; None: no limit), ``actor_options`` (passed to
    ``.options()`` of every actor, e.g. ``{"resources": {"licence": 1}}``).
    What the actors ask is compared with the cluster first: see
    :mod:`~parallelenv.backends.ray.resources`.
    """
    sources = env_list(sources)
    return RayBackend(sources, config, local_mode="dummy", num_actors=len(sources), start_timeout=start_timeout,
                      actor_options=actor_options)


def make_ray_subproc(sources: Sequence[EnvSource], config: BackendConfig, *, num_actors: int | None = None,
                     num_workers_per_actor: int | None = None, start_timeout: float | None = START_TIMEOUT_S,
                     actor_options: dict[str, Any] | None = None) -> RayBackend:
    """``para_mode="ray-subproc"``: groups of envs, each in an actor's own worker processes.

    Options: ``num_actors`` (default: one per node of the cluster that has
    CPUs), ``num_workers_per_actor`` (default: the actor's share of
    ``num_cpus``), ``start_timeout``, ``actor_options`` (as for ``ray``).
    """
    return RayBackend(sources, config, local_mode="subproc", num_actors=num_actors,
                      num_workers_per_actor=num_workers_per_actor, start_timeout=start_timeout,
                      actor_options=actor_options)
