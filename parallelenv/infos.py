"""Per-env info dicts merged into a Gymnasium vector info dict.

``info[key]`` is an array with one entry per env and ``info["_" + key]`` a
boolean mask of the envs that set it; nested dicts are merged recursively.
This follows ``gymnasium.vector.VectorEnv._add_info`` so that code and
wrappers written for Gymnasium read our infos unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from parallelenv.arrays import to_numpy

_SCALARS = (bool, int, float)


def _empty_like(value: Any, n: int) -> np.ndarray:
    if type(value) in _SCALARS or isinstance(value, np.number | np.bool_):
        return np.zeros(n, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((n, *value.shape), dtype=value.dtype)
    return np.full(n, None, dtype=object)


def add_info(vector: dict[str, Any], info: dict[str, Any], position: int, n: int) -> dict[str, Any]:
    """Merge one env's ``info`` into ``vector`` at ``position``; returns ``vector``."""
    for key, value in info.items():
        array: Any
        if isinstance(value, dict):
            array = add_info(vector.get(key, {}), value, position, n)
        else:
            array = vector[key] if key in vector else _empty_like(value, n)
            try:
                array[position] = value
            except (ValueError, TypeError):  # a value unlike the first one seen: keep objects
                array = array.astype(object) if array.ndim == 1 else _as_object(array)
                array[position] = value
        mask = vector.get("_" + key)
        if mask is None:
            mask = np.zeros(n, dtype=bool)
        mask[position] = True
        vector[key], vector["_" + key] = array, mask
    return vector


def _as_object(array: np.ndarray) -> np.ndarray:
    rows = np.full(len(array), None, dtype=object)
    for i, row in enumerate(array):
        rows[i] = row
    return rows


def vector_info(infos: Iterable[tuple[int, dict[str, Any]]], n: int) -> dict[str, Any]:
    """Merge ``(position, info)`` pairs for ``n`` envs into one vector info."""
    vector: dict[str, Any] = {}
    for position, info in infos:
        if info:
            add_info(vector, info, position, n)
    return vector


def env_info(vector: dict[str, Any], position: int) -> dict[str, Any]:
    """The info of the env at ``position`` out of a vector info: the keys its masks set."""
    info: dict[str, Any] = {}
    for key, value in vector.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict):
            nested = env_info(value, position)
            if nested or vector.get("_" + key, np.zeros(position + 1, bool))[position]:
                info[key] = nested
            continue
        mask = vector.get("_" + key)
        if mask is None or mask[position]:
            item = value[position]
            info[key] = item.item() if isinstance(item, np.generic) else item
    return info


def ended_states(vector: dict[str, Any]) -> dict[int, Any]:
    """The last obs of each episode a ``restart`` step ended, by position in the step's envs."""
    mask = vector.get("_ended_state")
    if mask is None:
        return {}
    positions = np.flatnonzero(to_numpy(mask))
    return {int(p): env_info(vector, int(p))["ended_state"] for p in positions}


# What the ``restart`` policy adds to the info of an env it reset in a step.
RESTART_KEYS = frozenset({"ended_state", "reset", "reset_info"})


def step_info(vector: dict[str, Any], position: int) -> dict[str, Any]:
    """The env's own info of a step, without what the ``restart`` policy added to it."""
    return {key: value for key, value in env_info(vector, position).items() if key not in RESTART_KEYS}


def reset_info(vector: dict[str, Any], position: int) -> dict[str, Any]:
    """The info of the reset that the ``restart`` policy did in a step ({} if none, or if it had none)."""
    return env_info(vector, position).get("reset_info", {})
