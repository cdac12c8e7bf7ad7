"""A step's numeric infos in shared memory: one column per key, beside the other results.

MuJoCo and Atari envs return a small info dict on every step (``x_position``,
``reward_ctrl``, ...; ``lives``, ``frame_number``). Sent in the reply, every
such step costs the worker a pickle, wakes the parent for a message, and
costs the parent an unpickle and a merge per env and key: on a cheap env
with four float infos, about three times the parent's CPU per env-step of
its no-info twin (the performance page). Here each such key gets a column of the shared buffers, a
value per env and a presence mask, which the worker writes with the step's
other results and the parent reads as a vector info in a few array copies,
whatever the number of envs.

The columns are learned by the parent from the first step reply that
brings infos: a key gets one if the values of the envs of that reply have
one exact type each and are numbers (Python's or NumPy's) or NumPy arrays of
numbers of one shape (:func:`learn`). Workers are told the layout with their
next call (``wire.INFO_COLUMNS``), a worker started later with its attach.
Anything else (a key seen later, a value of another type than its column's,
a string, a nested dict) travels in the reply as before, and the parent
builds the vector info from both exactly as from the replies alone
(:func:`parallelenv.tracking.results.merged_info`): a value keeps its type, since a
column matches only values of its one type.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parallelenv.infos.keys import ENV_ID, ENV_RESTARTED, RESTART_KEYS, WORKER_RESTARTED

#: 8-byte cells per env: a scalar takes one, an array as many as its bytes
#: need. Keys past them travel in the replies.
INFO_CELLS = 32
CELL_BYTES = 8
# Keys the library itself puts in infos: built by the parent from their own records.
RESERVED_KEYS = frozenset({*RESTART_KEYS, ENV_RESTARTED, WORKER_RESTARTED, ENV_ID})
_PYTHON_NUMBERS = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}


@dataclass(frozen=True)
class Column:
    """One key's column: the exact ``kind`` (type) of its values, their dtype and shape, and its cells."""

    key: str
    kind: type
    dtype: np.dtype
    shape: tuple[int, ...]
    first_cell: int
    cells: int


def _column_type(value: Any) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The dtype and shape a value would have in a column; None if it cannot have one.

    A column gives back its values by their type alone, so it takes only those
    that come back exactly so: Python's numbers, NumPy's numbers, and arrays of
    at least one dimension. A 0-d array would come back as a NumPy scalar; an
    ``np.bool_`` goes into an object array of the vector info, as in Gymnasium.
    """
    kind = type(value)
    if kind in _PYTHON_NUMBERS:
        return _PYTHON_NUMBERS[kind], ()
    if isinstance(value, np.number) or (isinstance(value, np.ndarray) and value.ndim
                                        and value.dtype.kind in "biuf"):
        return value.dtype, value.shape
    return None


def learn(infos: Iterable[dict[str, Any]]) -> tuple[Column, ...]:
    """The columns for the keys of these infos whose values have one exact type and shape each."""
    seen: dict[str, tuple[type, np.dtype, tuple[int, ...]] | None] = {}
    for info in infos:
        for key, value in info.items():
            if seen.get(key, ()) is None:
                continue
            typed = _column_type(value) if type(key) is str and not key.startswith("_") else None
            if typed is None or key in RESERVED_KEYS:
                seen[key] = None
                continue
            entry = (type(value), *typed)
            if key in seen and seen[key] != entry:
                seen[key] = None  # two types in one step: its vector's dtype depends on the envs' order
            else:
                seen[key] = entry
    columns, cell = [], 0
    for key, entry in seen.items():
        if entry is None:
            continue
        kind, dtype, shape = entry
        cells = -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // CELL_BYTES)
        if cell + cells > INFO_CELLS:
            continue
        columns.append(Column(key, kind, dtype, shape, cell, cells))
        cell += cells
    return tuple(columns)


_EVERY_ROW = slice(None)


def _fits(value: Any, column: Column) -> bool:
    """Whether a value of the column's type comes back from it as it is: an array must have the column's
    dtype and shape, or NumPy would cast it or broadcast it into the row."""
    return column.kind is not np.ndarray or (value.dtype == column.dtype and value.shape == column.shape)


def _count(rows: slice | list[int]) -> int:
    return rows.stop - rows.start if type(rows) is slice else len(rows)


class InfoColumns:
    """The info columns over a buffers' ``info_cells`` and ``info_present`` (see Buffers.allocate).

    ``cells`` is ``INFO_CELLS * num_envs * CELL_BYTES`` bytes, cell-major, so
    that a column's cells over every env are one run of bytes; ``present`` has
    a row per cell (as many as there can be columns), column j's mask in row j.
    """

    def __init__(self, cells: np.ndarray, present: np.ndarray, num_envs: int) -> None:
        self._cells = cells
        self._present = present
        self.num_envs = num_envs
        self.lay_out(())

    def lay_out(self, columns: Sequence[Column]) -> None:
        """Use ``columns`` from now on (the parent once it has learned them, a worker once told)."""
        n = self.num_envs
        self.columns = tuple(columns)
        self._values = []
        for column in self.columns:
            start = column.first_cell * n * CELL_BYTES
            nbytes = n * int(np.prod(column.shape, dtype=np.int64)) * column.dtype.itemsize
            self._values.append(self._cells[start:start + nbytes].view(column.dtype).reshape(n, *column.shape))
        # Column j's mask is row j of ``present``: every mask is in the first rows, read as one block.
        self._by_key = {
            column.key: (column.kind, values, self._present[j], column)
            for j, (column, values) in enumerate(zip(self.columns, self._values, strict=True))
        }
        self._keys = tuple(column.key for column in self.columns)
        self._mask_keys = tuple("_" + key for key in self._keys)
        self._all_set = b"\x01" * (len(self.columns) * n)
        self._kinds_and_values = [(column, values)
                                  for column, values in zip(self.columns, self._values, strict=True)]
        self._masks = self._present[:len(self.columns)]
        self._values_of = self._getter(self._keys)
        #: Each column's key and the exact type its values had: what an env's own info holds again.
        self.kinds = {column.key: column.kind for column in self.columns}

    @staticmethod
    def _getter(keys: tuple[str, ...]) -> Any:
        """A function of an info: its values of ``keys``, a tuple (itemgetter gives one key's value bare)."""
        if len(keys) > 1:
            return operator.itemgetter(*keys)
        return lambda info: tuple(info[key] for key in keys)

    def write(self, stepped: slice | list[int], env_ids: Sequence[int], infos: Sequence[dict[str, Any]]
              ) -> dict[int, dict[str, Any]]:
        """A worker's step of the envs at rows ``stepped``: the infos of those of them that answered,
        ``env_ids``, into the columns; what is left of each env's info that no column takes, for the
        reply (empty infos left out). The rows of envs whose step raised then say nothing."""
        self._masks[:, stepped] = False
        if infos and self._write_by_key(stepped, env_ids, infos):
            return {}
        by_key = self._by_key
        left: dict[int, dict[str, Any]] = {}
        for env_id, info in zip(env_ids, infos, strict=True):
            if not info:
                continue
            rest = None
            for key, value in info.items():
                column = by_key.get(key)
                if column is not None and type(value) is column[0] and _fits(value, column[3]):
                    try:
                        column[1][env_id] = value
                        column[2][env_id] = True
                        continue
                    except (ValueError, TypeError, OverflowError):  # an array of another shape, a huge int
                        pass
                if rest is None:
                    rest = {}
                rest[key] = value
            if rest:
                left[env_id] = rest
        return left

    def _write_by_key(self, stepped: slice | list[int], env_ids: Sequence[int], infos: Sequence[dict[str, Any]]
                      ) -> bool:
        """The common step, in one assignment per key: every env's info holds just the columns' keys, each
        value of its column's type. False, with nothing written, where that is not so."""
        width = len(self._keys)
        if not all(len(info) == width for info in infos):
            return False
        rows = stepped if _count(stepped) == len(env_ids) else list(env_ids)
        try:
            # Each env's values in the columns' order, then a column's values over the envs.
            table = [self._values_of(info) for info in infos]
            for (layout, values), column in zip(self._kinds_and_values, zip(*table, strict=True), strict=True):
                if set(map(type, column)) != {layout.kind} or (
                        layout.kind is np.ndarray and not all(_fits(value, layout) for value in column)):
                    raise TypeError(layout.kind)
                values[rows] = column
        except (KeyError, TypeError, ValueError, OverflowError):  # a key missing, of another type or shape
            return False
        self._masks[:, rows] = True
        return True

    def forget(self, env_ids: Sequence[int] | np.ndarray) -> None:
        """Say nothing for these envs: their answer is not a step their worker wrote (a stand-in's, a None result)."""
        if self.columns:
            self._present[:, env_ids] = False

    def vector(self, rows: slice | np.ndarray) -> dict[str, Any]:
        """The vector info of the envs at ``rows`` (copies): each key some env set, and its mask."""
        info: dict[str, Any] = {}
        if not self.columns:
            return info
        every_row = type(rows) is slice and rows == _EVERY_ROW
        masks = self._masks.copy() if every_row else self._masks[:, rows]
        # Which keys every env set, and which none did, from the masks' bytes: a NumPy reduction a
        # step (masks.sum) cost more than copying every column.
        flags = masks.tobytes()
        if every_row and flags == self._all_set:  # a training loop's step: every env set every key
            for key, mask_key, values, mask in zip(self._keys, self._mask_keys, self._values, masks, strict=True):
                info[key] = values.copy()
                info[mask_key] = mask
            return info
        fancy = type(rows) is not slice
        n = masks.shape[1]
        every, none = b"\x01" * n, bytes(n)
        for j, (key, mask_key, values, mask) in enumerate(zip(self._keys, self._mask_keys, self._values, masks,
                                                               strict=True)):
            present = flags[j * n:(j + 1) * n]
            if present == none:
                continue
            taken = values[rows] if fancy else values[rows].copy()
            if present != every:  # as Gymnasium's vector infos: zero where no env set it
                taken[~mask] = 0
            info[key] = taken
            info[mask_key] = mask
        return info
