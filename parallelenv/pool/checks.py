"""A pool's arguments, checked before any worker starts, and the transport they choose."""

from __future__ import annotations

from typing import Any

import numpy as np

from parallelenv.backends import resolve_backend
from parallelenv.rollout import OUTPUTS

MODES = ("sync", "first", "async")
BACKENDS = ("processes", "ray")


def check_arguments(num_envs: int, policy: Any, num_workers: Any, options: dict[str, Any]) -> None:
    """Raise the ValueError or TypeError of the first argument that cannot work, naming it."""
    _check_choice("backend", options["backend"], BACKENDS)
    _check_choice("mode", options["mode"], MODES)
    _check_choice("output", options["output"], OUTPUTS)
    for name in ("chunk_steps", "prefetch", "start_timeout"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name}={value!r}; use a positive number")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or not 1 <= num_workers <= num_envs:
        raise ValueError(f"num_workers={num_workers!r}; use an int from 1 to the number of envs ({num_envs})")
    if not callable(policy):
        raise TypeError(f"policy must be callable (observations -> actions), not {type(policy).__name__}")
    call_timeout = options["call_timeout"]
    if call_timeout is not None and not call_timeout > 0:
        raise ValueError(f"call_timeout={call_timeout!r}; use a number of seconds > 0, or None")
    length = options["max_episode_length"]
    if length is not None:
        check_count("max_episode_length", length)
    resolve_backend(options["para_mode"])  # an unknown name is refused here, with the valid ones
    seed = options["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed={seed!r}; use a non-negative int or None")


def make_fleet(backend: str, start_method: str | None, actor_options: dict[str, Any] | None) -> Any:
    """The transport of ``backend``: Ray is imported only where it is asked for."""
    if backend == "ray":
        from parallelenv.pool.actors import ActorFleet

        if start_method is not None:
            raise ValueError("start_method is for backend='processes'; Ray starts its actors itself")
        return ActorFleet(actor_options)
    from parallelenv.pool.processes import ProcessFleet

    if actor_options is not None:
        raise ValueError("actor_options is for backend='ray'")
    return ProcessFleet(start_method)


def check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}; use a positive int")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}; use one of {', '.join(map(repr, choices))}")
