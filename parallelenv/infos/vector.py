"""Per-env info dicts merged into a Gymnasium vector info dict.

``info[key]`` is an array with one entry per env and ``info["_" + key]`` a
boolean mask of the envs that set it; nested dicts are merged recursively.
This follows ``gymnasium.vector.VectorEnv._add_info`` so that code and
wrappers written for Gymnasium read our infos unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from parallelenv.arrays import to_numpy
from parallelenv.infos.keys import (
    ENDED_STATE,
    ENDED_STATE_MASK,
    ENV_RESTARTED_MASK,
    RESET_INFO,
    RESTART_KEYS,
    WORKER_RESTARTED_MASK,
)

_SCALARS = (bool, int, float)
_OBJECT = np.dtype(object)
_FLOAT64 = np.dtype(np.float64)
_COMPLEX128 = np.dtype(np.complex128)
_PYTHON_NUMBERS = (int, float)


def _empty_like(value: Any, n: int) -> np.ndarray:
    """The array of ``n`` entries that Gymnasium's ``_add_info`` starts for a key whose first value is
    ``value``: Python's and NumPy's numbers by their type, arrays by dtype and shape, anything else
    (an ``np.bool_`` too, which is no ``np.number``) as objects."""
    if type(value) in _SCALARS or isinstance(value, np.number):
        return np.zeros(n, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((n, *value.shape), dtype=value.dtype)
    return np.full(n, None, dtype=object)


def add_info(vector: dict[str, Any], info: dict[str, Any], position: int, n: int,
             made_for: dict[str, type | None] | None = None) -> dict[str, Any]:
    """Merge one env's ``info`` into ``vector`` at ``position``; returns ``vector``.

    ``made_for``: by key, the type of value whose every instance its array takes whole (None: check
    each), kept by :func:`vector_info` across the envs it merges, so that the common value, of the
    type its key's array was made for, goes in with no check.
    """
    if made_for is None:
        made_for = {}
    for key, value in info.items():
        array: Any = vector.get(key)
        kind = type(value)
        try:
            if array is not None and made_for.get(key) is kind:
                array[position] = value  # nearly every value: the type its array was made for
            elif isinstance(value, dict) and (array is None or isinstance(array, dict)):
                array = add_info({} if array is None else array, value, position, n)
            else:
                if array is None:
                    array = _empty_like(value, n)
                    made_for[key] = kind if _always_safe(kind, array.dtype) else None
                elif isinstance(array, dict):  # nested for the envs before, not for this one: each env's own value
                    array = _nested_as_objects(array, vector["_" + key], n)
                    made_for[key] = None
                _put_unless_lossy(array, position, value)
        except (ValueError, TypeError, OverflowError, FloatingPointError):  # unlike the first value, or past its dtype
            array = array.astype(object) if array.ndim == 1 else _as_object(array)
            made_for[key] = None
            array[position] = value
        mask = vector.get("_" + key)
        if mask is None:
            mask = np.zeros(n, dtype=bool)
        mask[position] = True
        vector[key], vector["_" + key] = array, mask
    return vector


# (type of a value, dtype of the array it goes into): whether NumPy's cast can lose nothing silently.
_SAFE_CASTS: dict[tuple[type, np.dtype], bool] = {}


def _always_safe(kind: type, dtype: np.dtype) -> bool:
    """Whether every value of type ``kind`` goes into an array of ``dtype`` whole, or NumPy raises."""
    pair = (kind, dtype)
    safe = _SAFE_CASTS.get(pair)
    if safe is None:
        safe = _SAFE_CASTS[pair] = _judged_safe(kind, dtype)
    return safe


def _judged_safe(kind: type, dtype: np.dtype) -> bool:
    if dtype.kind not in "iufc":
        return True
    if issubclass(kind, np.generic):
        return np.dtype(kind) == dtype
    if dtype.kind == "c":  # a float past complex64's range overflows with a warning only, as into a float32
        return dtype == _COMPLEX128 and kind in _PYTHON_NUMBERS
    return (dtype == _FLOAT64 and kind in _PYTHON_NUMBERS) or (kind is int and dtype.kind != "f")


def _put_unless_lossy(array: np.ndarray, position: int, value: Any) -> None:
    """``array[position] = value``, or a TypeError where NumPy would only warn of what the cast loses:
    a complex's imaginary part, a float past a float16's range, a NaN or an inf into ints."""
    if _always_safe(type(value), array.dtype):
        array[position] = value
        return
    if array.dtype.kind != "c" and (isinstance(value, complex | np.complexfloating)
                                    or (isinstance(value, np.ndarray) and value.dtype.kind == "c")):
        raise TypeError(value)
    with np.errstate(over="raise", invalid="raise"):
        try:
            array[position] = value
        except FloatingPointError as lossy:
            raise TypeError(value) from lossy


def _nested_as_objects(nested: dict[str, Any], mask: np.ndarray, n: int) -> np.ndarray:
    """A nested vector info as an object array of the envs' own dicts (None where ``mask`` is unset)."""
    rows = np.full(n, None, dtype=object)
    for position in np.flatnonzero(mask).tolist():
        rows[position] = env_info(nested, position, _as_it_is)
    return rows


def _as_it_is(item: Any) -> Any:
    return item


def _as_object(array: np.ndarray) -> np.ndarray:
    rows = np.full(len(array), None, dtype=object)
    for i, row in enumerate(array):
        rows[i] = row
    return rows


def vector_info(infos: Iterable[tuple[int, dict[str, Any]]], n: int) -> dict[str, Any]:
    """Merge ``(position, info)`` pairs for ``n`` envs into one vector info."""
    vector: dict[str, Any] = {}
    made_for: dict[str, type | None] = {}
    for position, info in infos:
        if info:
            add_info(vector, info, position, n, made_for)
    return vector


def joined_rows(parts: Sequence[tuple[Mapping[str, Any], np.ndarray, np.ndarray]], n: int) -> dict[str, Any] | None:
    """The vector info of ``n`` envs gathered from several: each part is a vector info, the rows taken
    from it and the positions they go to.

    The parts' arrays are copied as they are, their dtypes kept (the rows of
    one vector info come back as that info holds them); a key a part lacks
    is unset at its positions, and one no row taken has is left out. None where a key's values differ between the
    parts in kind, dtype or shape: then each env's info is merged again
    (:func:`vector_info`), which picks one array for them all.
    """
    joined: dict[str, Any] = {}
    keys = dict.fromkeys(key for info, _, _ in parts for key in info if not key.startswith("_"))
    for key in keys:
        # The parts whose rows taken have the key: another's array (of another dtype, say) is not read.
        present = [(info[key], mask, taken, to) for info, taken, to in parts if key in info
                   for mask in (info.get("_" + key),) if mask is None or mask[taken].any()]
        if not present:  # none of the rows taken has it: left out, as a step of those envs leaves it
            continue
        first = present[0][0]
        if isinstance(first, Mapping):
            if not all(isinstance(value, Mapping) for value, *_ in present):
                return None
            array: Any = joined_rows([(value, taken, to) for value, _, taken, to in present], n)
            if array is None:
                return None
        else:
            if not all(isinstance(value, np.ndarray) and value.dtype == first.dtype
                       and value.shape[1:] == first.shape[1:] for value, *_ in present):
                return None
            shape = (n, *first.shape[1:])
            array = np.full(shape, None, dtype=object) if first.dtype == _OBJECT else np.zeros(shape, first.dtype)
            for value, _, taken, to in present:
                array[to] = value[taken]
        mask = np.zeros(n, dtype=bool)
        for _, part_mask, taken, to in present:
            mask[to] = True if part_mask is None else part_mask[taken]  # no mask: every env's
        joined[key], joined["_" + key] = array, mask
    return joined


# How an env's 0-d values come out of a vector info, for env_info's ``scalars``.
# The callers want different things of the same rows, so each names its choice:


def numpy_scalars_as_python(item: Any) -> Any:
    """NumPy scalars as Python's; a torch tensor's 0-d rows stay tensors, on their device.

    The default: what a loop over one env's infos expects (SB3's info dicts,
    the rollout's per-env infos, overlap's per-env results).
    """
    return item.item() if isinstance(item, np.generic) else item


def every_scalar_as_python(item: Any) -> Any:
    """Every 0-d value as a Python scalar: NumPy's, a 0-d array's and a torch tensor's.

    For ``align="batch"``, whose per-env reward and flags are Python scalars
    too: the tensor backend's infos reach it as tensors with a row per env.
    """
    return item.item() if getattr(item, "ndim", None) == 0 else item


# NumPy's dtypes for Python's own scalars: a 0-d info value of one of these
# was most likely the Python scalar itself when the env returned it.
_PYTHON_SCALAR_DTYPES = frozenset({np.dtype(bool), np.dtype(int), np.dtype(float)})


def python_dtypes_as_python(item: Any) -> Any:
    """NumPy scalars of Python's own dtypes as Python's; the others (an ``np.int32``) keep their type.

    For the Gymnasium view, which merges per-env infos again as Gymnasium's
    ``_add_info`` does, picking an array's dtype from its first value: an
    ``np.int32`` gives an int32 array as in ``SyncVectorEnv``, and an
    ``np.bool_``, no ``np.number``, would give an object array.
    """
    return item.item() if isinstance(item, np.generic) and item.dtype in _PYTHON_SCALAR_DTYPES else item


def as_kind(kind: type, item: Any) -> Any:
    """An entry of an info column (backends.info_columns) as the env gave it, whose type was ``kind``:
    Python's numbers as Python's, NumPy's scalars and arrays as they are."""
    return item.item() if kind in _SCALARS else item


def env_info(
    vector: Mapping[str, Any], position: int, scalars: Callable[[Any], Any] = numpy_scalars_as_python
) -> dict[str, Any]:
    """The info of the env at ``position`` out of a vector info: the keys its masks set, nested dicts as dicts.

    A key without a ``"_" + key`` mask is every env's. ``vector[key]`` may be
    anything indexed by position (NumPy arrays, object arrays, torch
    tensors) and ``vector`` any Mapping of this layout, so a vector info
    read in place from columns, a value column and a presence column per
    key, serves every caller as a dict does. ``scalars`` turns each 0-d value
    into what the caller wants (one of the functions above).
    """
    info: dict[str, Any] = {}
    for key, value in vector.items():
        if key.startswith("_"):
            continue
        mask = vector.get("_" + key)
        if mask is not None and not mask[position]:
            continue
        if isinstance(value, Mapping):
            info[key] = env_info(value, position, scalars)
        elif getattr(value, "dtype", None) == _OBJECT:  # the env's own value, whatever it was
            info[key] = value[position]
        else:
            info[key] = scalars(value[position])
    return info


def ended_states(vector: dict[str, Any]) -> dict[int, Any]:
    """The last obs of each episode a ``restart`` step ended, by position in the step's envs."""
    mask = vector.get(ENDED_STATE_MASK)
    if mask is None:
        return {}
    positions = np.flatnonzero(to_numpy(mask))
    return {int(p): env_info(vector, int(p))[ENDED_STATE] for p in positions}


def step_info(vector: dict[str, Any], position: int) -> dict[str, Any]:
    """The env's own info of a step, without what the ``restart`` policy added to it."""
    return {key: value for key, value in env_info(vector, position).items() if key not in RESTART_KEYS}


def reset_info(vector: dict[str, Any], position: int) -> dict[str, Any]:
    """The info of the reset that the ``restart`` policy did in a step ({} if none, or if it had none)."""
    return env_info(vector, position).get(RESET_INFO, {})


def rebuilt_envs(info: Mapping[str, Any], n: int) -> np.ndarray:
    """The mask of the ``n`` envs that a step's vector ``info`` says were rebuilt after a failure in it:
    their obs is a new episode's first, and the episode they were in ended, cut, where they last were."""
    rebuilt = np.zeros(n, dtype=bool)
    for mask_key in (WORKER_RESTARTED_MASK, ENV_RESTARTED_MASK):  # docs/design.rst, "Surviving failures"
        mask = info.get(mask_key)
        if mask is not None:
            rebuilt |= to_numpy(mask).astype(bool)
    return rebuilt
