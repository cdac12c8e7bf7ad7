"""Batched arrays for a space: allocate them, write one env's row, read rows.

Observations and actions of every env live in one row each of arrays shaped
like ``gymnasium.vector.utils.batch_space``. The arrays can be placed in any
buffer (shared memory for the subprocess backend) through an allocator, and
are nested dicts/tuples of arrays for Dict and Tuple spaces.

A space of no fixed shape (Graph, Sequence, Text, OneOf, a custom ``Space``
subclass) has no rows of bytes to preallocate: its part is a 1-D object
array, one Python value per env, which Gymnasium batches as a tuple of
per-env values. Such a part is always private to the process that holds it,
whatever the allocator (no shared memory can hold Python objects), so a
backend whose envs run in another process carries its rows in its messages
(:func:`private_parts`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]
Batched = Any  # an ndarray, or a dict / tuple of Batched
ALIGNMENT = 64  # cache-line aligned rows keep workers from sharing lines at the edges


class UnsupportedSpaceError(TypeError):
    """What was given as a space is not a ``gymnasium.spaces.Space``."""


@singledispatch
def allocate(space: spaces.Space, n: int, alloc: Allocator) -> Batched:
    """Allocate arrays holding ``n`` elements of ``space``."""
    raise UnsupportedSpaceError(f"{space!r} is not a gymnasium.spaces.Space")


@allocate.register(spaces.Space)
def _(space: spaces.Space, n: int, alloc: Allocator) -> Batched:
    # Every space not registered below has no fixed shape, as for Gymnasium's
    # batch_space, which batches them as a Tuple of per-env spaces.
    return per_env_objects(n)


def per_env_objects(n: int) -> np.ndarray:
    """The part of ``n`` envs for a space of no fixed shape: one object per env, None until written."""
    return np.full(n, None, dtype=object)


def is_per_env_objects(batched: Any) -> bool:
    """Whether ``batched`` is a part of no fixed shape (an object array), not an array of fixed-shape rows."""
    return isinstance(batched, np.ndarray) and batched.dtype.hasobject


@allocate.register(spaces.Box)
@allocate.register(spaces.MultiBinary)
@allocate.register(spaces.MultiDiscrete)
def _(space: spaces.Space, n: int, alloc: Allocator) -> Batched:
    return alloc((n, *_shape(space)), np.dtype(space.dtype))


@allocate.register(spaces.Discrete)
def _(space: spaces.Discrete, n: int, alloc: Allocator) -> Batched:
    return alloc((n,), np.dtype(space.dtype))


@allocate.register(spaces.Dict)
def _(space: spaces.Dict, n: int, alloc: Allocator) -> Batched:
    return {key: allocate(sub, n, alloc) for key, sub in space.spaces.items()}


@allocate.register(spaces.Tuple)
def _(space: spaces.Tuple, n: int, alloc: Allocator) -> Batched:
    return tuple(allocate(sub, n, alloc) for sub in space.spaces)


def _shape(space: spaces.Space) -> tuple[int, ...]:
    # Space.shape is Optional in general; the fixed-shape spaces handled here always set it.
    assert space.shape is not None, space
    return space.shape


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The allocator for buffers private to one process."""
    return np.zeros(shape, dtype)


class BufferLayout:
    """Places arrays one after another in a byte buffer, each aligned.

    Run once with ``buffer=None`` to learn ``size``; then with a buffer of that
    size to get arrays over it. Parent and worker build the same layout from
    the same spaces, so only the buffer's name crosses the process boundary.
    """

    def __init__(self, buffer: Any = None) -> None:
        self.buffer = buffer
        self.size = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        offset = -(-self.size // ALIGNMENT) * ALIGNMENT
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.size = offset + nbytes
        if self.buffer is None:
            return np.empty(0, dtype)
        return np.ndarray(shape, dtype, buffer=self.buffer, offset=offset)


def row_writer(batched: Batched) -> Callable[[int, Any], None]:
    """A function ``write(row, value)`` storing one env's value into ``batched``."""
    if isinstance(batched, np.ndarray):
        return batched.__setitem__
    if isinstance(batched, dict):
        writers = {key: row_writer(sub) for key, sub in batched.items()}

        def write_dict(row: int, value: Any) -> None:
            for key, write in writers.items():
                write(row, value[key])

        return write_dict
    tuple_writers = [row_writer(sub) for sub in batched]

    def write_tuple(row: int, value: Any) -> None:
        for write, item in zip(tuple_writers, value, strict=True):
            write(row, item)

    return write_tuple


def rows_reader(batched: Batched) -> Callable[[Any], list[Any]]:
    """A function ``read(rows)`` returning a list with each row's value, each its own copy;
    ``read(None)`` reads every row.

    One C-level pass per array instead of one indexing call per env: this
    sits in the step loop of every env host.
    """
    if isinstance(batched, np.ndarray):
        if batched.ndim == 1:
            # NumPy scalars, copies by nature; a list of the array itself costs less than one of a view.
            return lambda rows: list(batched if rows is None else batched[rows])
        return lambda rows: list((batched if rows is None else batched[rows]).copy())
    if isinstance(batched, dict):
        readers = {key: rows_reader(sub) for key, sub in batched.items()}

        def read_dict(rows: Any) -> list[Any]:
            columns = {key: read(rows) for key, read in readers.items()}
            return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

        return read_dict
    tuple_readers = [rows_reader(sub) for sub in batched]
    return lambda rows: list(zip(*(read(rows) for read in tuple_readers), strict=True))


def rows_view(batched: Batched, rows: slice) -> Batched:
    """The rows ``rows`` of ``batched``, as views of its arrays."""
    if isinstance(batched, dict):
        return {key: rows_view(sub, rows) for key, sub in batched.items()}
    if isinstance(batched, tuple):
        return tuple(rows_view(sub, rows) for sub in batched)
    return batched[rows]


def private_parts(batched: Batched) -> list[np.ndarray]:
    """The parts of ``batched`` that no shared memory holds (see the module's docstring), in a fixed order."""
    if isinstance(batched, dict):
        return [part for sub in batched.values() for part in private_parts(sub)]
    if isinstance(batched, tuple):
        return [part for sub in batched for part in private_parts(sub)]
    return [batched] if is_per_env_objects(batched) else []


def read_private_rows(parts: list[np.ndarray], env_ids: tuple[int, ...]) -> list[np.ndarray]:
    """The rows ``env_ids`` of each private part, to send where another process writes them (:func:`write_private_rows`)."""
    index = list(env_ids)
    return [part[index] for part in parts]


def write_private_rows(parts: list[np.ndarray], env_ids: tuple[int, ...], rows: list[np.ndarray]) -> None:
    """Write what :func:`read_private_rows` read in another process into the rows ``env_ids`` of ``parts``."""
    index = list(env_ids)
    for part, values in zip(parts, rows, strict=True):
        part[index] = values


def as_gymnasium_batch(batched: Batched) -> Batched:
    """``batched`` as ``gymnasium.vector.utils.concatenate`` makes it: each part of no fixed shape a tuple.

    Within parallelenv such a part is an object array, which indexes, copies
    and fills like the other parts; a tuple would read as a Tuple space's parts.
    """
    if isinstance(batched, dict):
        return {key: as_gymnasium_batch(sub) for key, sub in batched.items()}
    if isinstance(batched, tuple):
        return tuple(as_gymnasium_batch(sub) for sub in batched)
    return tuple(batched) if is_per_env_objects(batched) else batched


def take(batched: Batched, rows: np.ndarray | None) -> Batched:
    """Copy the given rows (all rows when None) into fresh arrays."""
    if isinstance(batched, dict):
        return {key: take(sub, rows) for key, sub in batched.items()}
    if isinstance(batched, tuple):
        return tuple(take(sub, rows) for sub in batched)
    return batched.copy() if rows is None else batched[rows]


def put(batched: Batched, rows: np.ndarray | slice, values: Batched) -> None:
    """Write batched ``values`` into ``rows`` of ``batched``."""
    if isinstance(batched, np.ndarray):
        if batched.dtype.hasobject and not is_per_env_objects(values):
            values = _objects(values)  # NumPy would read nested sequences as more dimensions
        batched[rows] = values
    elif isinstance(batched, dict):
        for key, sub in batched.items():
            put(sub, rows, values[key])
    else:
        for sub, sub_values in zip(batched, values, strict=True):
            put(sub, rows, sub_values)


def zero_positions(batched: Batched, positions: np.ndarray) -> None:
    """Zero the given positions of freshly taken arrays (None results); a part of no fixed shape holds None."""
    if is_per_env_objects(batched):
        batched[positions] = None
    elif isinstance(batched, np.ndarray):
        batched[positions] = 0
    else:
        for sub in batched.values() if isinstance(batched, dict) else batched:
            zero_positions(sub, positions)


def unbatch(batched: Batched, position: int) -> Any:
    """One env's value out of taken arrays, as its own copy."""
    if isinstance(batched, dict):
        return {key: unbatch(sub, position) for key, sub in batched.items()}
    if isinstance(batched, tuple):
        return tuple(unbatch(sub, position) for sub in batched)
    value = batched[position]
    return value.copy() if isinstance(value, np.ndarray) else value


@singledispatch
def check_batch(space: spaces.Space, values: Any, n: int, what: str = "actions") -> Batched:
    """Validate user-given values for ``n`` envs of ``space``; return them batched.

    Accepts the batched form (an array with one row per env, or a dict/tuple of
    such; for a space of no fixed shape a tuple, list or 1-D array with one
    value per env) and, for Dict and Tuple spaces, a list with one value per env.
    Raises ValueError/TypeError naming what is wrong before anything is sent.
    """
    raise UnsupportedSpaceError(f"{what}: {space!r} is not a gymnasium.spaces.Space")


@check_batch.register(spaces.Space)
def _(space: spaces.Space, values: Any, n: int, what: str = "actions") -> Batched:
    # What each value holds is the env's to judge, as for Gymnasium's vector
    # envs: a custom space's contains() may not even take what its env takes.
    if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list, np.ndarray)) or (
        isinstance(values, np.ndarray) and values.ndim == 0
    ):
        raise TypeError(f"{what} is {values!r}; expected a tuple, list or 1-D array with one value per env "
                        f"({n} envs of {space})")
    if len(values) != n:
        raise ValueError(f"{what} has {len(values)} values; expected one per env ({n} envs of {space})")
    return _objects(values)


def _objects(values: Any) -> np.ndarray:
    """A 1-D object array of ``values``, one entry each: a GraphInstance or a sequence stays one entry."""
    objects = per_env_objects(len(values))
    for i, value in enumerate(values):
        objects[i] = value
    return objects


def _check_array(space: spaces.Space, values: Any, n: int, what: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{what} cannot form an array of shape {(n, *_shape(space))}: {exc}") from None
    expected = (n, *_shape(space))
    if array.ndim == 0:  # a TypeError, as Gymnasium's vector envs raise for one action where a batch is due
        raise TypeError(f"{what} is the single value {array.item()!r}; expected a batch of shape {expected}, one row "
                        f"per env ({n} envs of {space})")
    if array.shape != expected:
        raise ValueError(f"{what} has shape {array.shape}; expected {expected} ({n} envs of {space})")
    if not np.can_cast(array.dtype, np.dtype(space.dtype), casting="same_kind"):
        raise TypeError(f"{what} of dtype {array.dtype} cannot be cast safely to {space.dtype} of {space}")
    return array


@check_batch.register(spaces.Box)
@check_batch.register(spaces.MultiBinary)
@check_batch.register(spaces.MultiDiscrete)
def _check_fixed_shape(space: spaces.Space, values: Any, n: int, what: str = "actions") -> Batched:
    return _check_array(space, values, n, what)


@check_batch.register(spaces.Discrete)
def _check_discrete(space: spaces.Discrete, values: Any, n: int, what: str = "actions") -> Batched:
    array = _check_array(space, values, n, what)
    if array.size and (array.min() < space.start or array.max() >= space.start + space.n):
        outside = np.flatnonzero((array < space.start) | (array >= space.start + space.n))
        p = int(outside[0])
        raise ValueError(f"{what}[{p}] = {array[p]} is outside {space}")
    return array


# Up to this many actions, bounds are checked on a Python list: two NumPy
# reductions of a few values cost more than the list's conversion.
SMALL_BATCH = 256


def batch_checker(space: spaces.Space, what: str = "actions") -> Callable[[Any, int], Batched]:
    """:func:`check_batch` for one space, as a function ``check(values, n)`` for the step path.

    What a check of an array space learns from the space alone (its row
    shape, the dtypes that cast to its own, a Discrete's bounds) is worked
    out here once, so that a batch already in the space's form costs a few
    comparisons per step. Anything else (other types, other shapes, a value
    out of bounds) goes to :func:`check_batch`, which accepts it or raises
    its error.
    """
    impl = check_batch.dispatch(type(space))
    if impl is _check_discrete:
        bounds: tuple[int, int] | None = (int(space.start), int(space.start + space.n))
    elif impl is _check_fixed_shape:
        bounds = None
    else:
        return lambda values, n: check_batch(space, values, n, what)
    row_shape = _shape(space) if bounds is None else ()
    target = np.dtype(space.dtype)
    casts: dict[np.dtype, bool] = {}

    def check(values: Any, n: int) -> Batched:
        if type(values) is np.ndarray and values.shape == (n, *row_shape):
            safe = casts.get(values.dtype)
            if safe is None:
                safe = casts[values.dtype] = bool(np.can_cast(values.dtype, target, casting="same_kind"))
            if safe and (bounds is None or not n or _within(values, *bounds)):
                return values
        return check_batch(space, values, n, what)

    return check


def _within(values: np.ndarray, low: int, stop: int) -> bool:
    if values.size <= SMALL_BATCH:
        listed = values.tolist()
        return low <= min(listed) and max(listed) < stop
    return low <= np.minimum.reduce(values) and np.maximum.reduce(values) < stop


@check_batch.register(spaces.Dict)
def _(space: spaces.Dict, values: Any, n: int, what: str = "actions") -> Batched:
    if isinstance(values, (list, np.ndarray)) and len(values) == n:
        values = {key: [v[key] for v in values] for key in space.spaces}
    if not isinstance(values, dict) or set(values) != set(space.spaces):
        raise TypeError(f"{what} must be a dict with keys {sorted(space.spaces)} or a list of {n} such dicts")
    return {key: check_batch(sub, values[key], n, f"{what}[{key!r}]") for key, sub in space.spaces.items()}


@check_batch.register(spaces.Tuple)
def _(space: spaces.Tuple, values: Any, n: int, what: str = "actions") -> Batched:
    if isinstance(values, list) and len(values) == n:
        values = tuple(zip(*values, strict=True))
    if not isinstance(values, tuple) or len(values) != len(space.spaces):
        raise TypeError(f"{what} must be a tuple of {len(space.spaces)} batched parts or a list of {n} tuples")
    return tuple(check_batch(sub, part, n, f"{what}[{i}]") for i, (sub, part) in enumerate(zip(space.spaces, values, strict=True)))
