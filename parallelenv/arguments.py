"""Checks of the user's ``id``, ``seed``, ``options`` and ``data`` arguments.

Everything here runs before a call reaches a backend, so a bad argument is
reported by name and never half-applied to some envs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from parallelenv.errors import NoPendingCallError


def env_ids(id: Any, num_envs: int) -> np.ndarray:
    """Turn ``id`` (None, an int, a sequence or an array of ints) into an int64 index array."""
    if id is None:
        return np.arange(num_envs)
    if isinstance(id, np.ndarray):
        if id.ndim != 1 or not (np.issubdtype(id.dtype, np.integer) or id.size == 0):
            raise TypeError(f"id must be a 1-D integer array, got shape {id.shape} of dtype {id.dtype}")
        items = id.tolist()  # Python ints: no wrap-around of huge unsigned values
    elif _is_int(id):
        items = [int(id)]
    elif isinstance(id, Sequence) and not isinstance(id, (str, bytes)):
        items = list(id)
        for position, item in enumerate(items):
            if not _is_int(item):
                raise TypeError(f"id[{position}] = {item!r} is not an int")
    else:
        raise TypeError(f"id must be None, an int, or a sequence/array of ints, not {id!r}")
    if not items:
        raise ValueError("id names no env")
    seen: set[int] = set()
    for item in items:
        if item < 0:
            # Not taken as counting from the end, as a list index would be: an index gone wrong would
            # then quietly name another env.
            counted = f"; for the env it would name as a list index, use {num_envs + item}" if item >= -num_envs else ""
            raise ValueError(f"id {item} is negative: ids are env indices from 0 to {num_envs - 1}, and negative "
                             f"ids are not taken as counting from the end{counted}")
        if item >= num_envs:
            raise ValueError(f"id {item} is out of range for {num_envs} envs")
        if item in seen:
            raise ValueError(f"id {item} is given more than once")
        seen.add(item)
    return np.array(items, dtype=np.int64)


def env_seeds(seed: Any, ids: np.ndarray) -> Sequence[int | None]:
    """One seed per env of ``ids``.

    An int seed gives env ``i`` the child ``i`` of ``SeedSequence(seed)``:
    independent streams that do not depend on which ids are reset together
    and do not overlap between neighbouring base seeds, unlike ``seed + i``.
    """
    checked = seed_argument(seed, ids)
    if checked is None:
        return (None,) * len(ids)
    if isinstance(checked, int):
        return DerivedSeeds(checked, ids)
    return checked


class DerivedSeeds(Sequence):
    """The seeds of ``env_seeds(base, ids)``, each derived when read.

    A batched env seeds all its envs from ``base`` at once (its own way, per
    env id), so it need not derive tens of thousands of seeds it never reads.
    """

    def __init__(self, base: int, ids: np.ndarray) -> None:
        self.base = base
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return tuple(self)[position]
        env_id = int(self._ids[position])
        return int(np.random.SeedSequence(self.base, spawn_key=(env_id,)).generate_state(1, np.uint64)[0])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"DerivedSeeds(base={self.base}, ids={self._ids.tolist()})"


def seed_argument(seed: Any, ids: np.ndarray) -> int | tuple[int | None, ...] | None:
    """The checked ``seed``: None, a non-negative int, or one seed (or None) per env of ``ids``."""
    if seed is None:
        return None
    if _is_int(seed):
        return _non_negative(seed, "seed")
    seeds = per_env(seed, ids, "seed")
    return tuple(None if s is None else _non_negative(s, f"seed[{p}]") for p, s in enumerate(seeds))


def per_env(values: Any, ids: np.ndarray, what: str) -> tuple[Any, ...]:
    """Check that ``values`` has exactly one entry per env of ``ids``."""
    if not isinstance(values, (Sequence, np.ndarray)) or isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a list with one entry per id, not {type(values).__name__}")
    if len(values) != len(ids):
        raise ValueError(f"{what} has {len(values)} entries for {len(ids)} envs")
    return tuple(values)


def env_options(options: Any, ids: np.ndarray) -> tuple[dict[str, Any] | None, ...]:
    """Reset options: None, one dict for every env, or a list with one per env."""
    if options is None or isinstance(options, dict):
        return (options,) * len(ids)
    checked = per_env(options, ids, "options")
    for position, item in enumerate(checked):
        if item is not None and not isinstance(item, dict):
            raise TypeError(f"options[{position}] must be a dict or None, not {type(item).__name__}")
    return checked


def check_limits(num_cpus: Any, call_timeout: Any) -> None:
    """``num_cpus`` and ``call_timeout`` of a ParallelEnv: positive numbers, or None."""
    if num_cpus is not None and (not isinstance(num_cpus, (int, float)) or num_cpus <= 0):
        raise ValueError(f"num_cpus={num_cpus!r}; use a positive number")
    if call_timeout is not None and not call_timeout > 0:
        raise ValueError(f"call_timeout={call_timeout!r}; use a positive number of seconds or None")


def wait_count(wait_num: Any, outstanding: int) -> int:
    """How many envs ``recv`` waits for: ``wait_num``, or every one of the ``outstanding`` when None."""
    if outstanding == 0:
        raise NoPendingCallError("recv() with no call pending: send() actions first")
    if wait_num is None:
        return outstanding
    if not isinstance(wait_num, int) or not 1 <= wait_num <= outstanding:
        raise ValueError(f"wait_num={wait_num!r}; use an int from 1 to the {outstanding} envs pending")
    return wait_num


def attribute_name(name: Any) -> str:
    """An env attribute's or method's name, checked."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"an attribute or method name must be a non-empty str, not {name!r}")
    return name


def check_align(align: str) -> str:
    if align not in ("item", "batch"):
        raise ValueError(f"align={align!r}; use 'item' or 'batch'")
    return align


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _non_negative(value: Any, what: str) -> int:
    if not _is_int(value):
        raise TypeError(f"{what} must be an int or None, not {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be non-negative, got {value}")
    return int(value)
