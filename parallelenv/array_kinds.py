"""The array operations of the front and the call tracker, for NumPy buffers and for torch tensors.

A backend's :class:`~parallelenv.backends.buffers.Buffers` are NumPy arrays
(the CPU backends) or torch tensors on a device (the tensor backend); the
front, the call tracker and the policies run the same code over both,
asking the kind of the buffers for the few operations that differ. The
tensor kind never reads a value back to the host in a step: where the
NumPy kind narrows a call to the envs a mask selects, the tensor kind
carries the mask along instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from parallelenv.arrays import is_tensor
from parallelenv.batching import Batched, batch_checker, put, take, zero_positions
from parallelenv.infos.keys import IDLE, IDLE_MASK


@dataclass(frozen=True)
class Selection:
    """Which envs a call is for: every env in order, or these ids in this order.

    ``rows`` indexes host per-env arrays (a slice for every env: cheaper than
    fancy indexing); ``env_ids`` names the envs as calls do.
    """

    ids: np.ndarray
    env_ids: tuple[int, ...]
    everyone: bool
    rows: slice | np.ndarray = field(compare=False)
    count: int = field(compare=False, default=0)  # len(ids), read on every step

    @classmethod
    def of(cls, ids: np.ndarray, num_envs: int) -> Selection:
        everyone = len(ids) == num_envs and bool((ids == np.arange(num_envs)).all())
        return cls(ids, tuple(ids.tolist()), everyone, slice(None) if everyone else ids, len(ids))

    def __len__(self) -> int:
        return self.count

    def without(self, dropped: np.ndarray) -> Selection:
        """These envs less those of the mask ``dropped`` over them (self when it drops none)."""
        if not dropped.any():
            return self
        kept = self.ids[~dropped]
        return Selection(kept, tuple(kept.tolist()), False, kept, len(kept))


def host_rows(env_ids: tuple[int, ...]) -> slice | np.ndarray:
    """Index host per-env arrays by a reply's (distinct) env ids: a slice when they form a range, as
    the whole group of a worker does, since slicing costs far less than fancy indexing."""
    first, size = min(env_ids), len(env_ids)
    if max(env_ids) - first == size - 1:
        return slice(first, first + size)
    return np.array(env_ids, dtype=np.int64)


class NumpyArrays:
    """The CPU backends' buffers: NumPy arrays, read on the host for free."""

    #: Results are NumPy arrays unless ``output="torch"`` asks for tensors.
    native_output = "numpy"
    #: A mask can be read on the host without waiting for anything.
    reads_on_host = True

    def __init__(self, action_space: spaces.Space) -> None:
        self._action_space = action_space
        self._check_actions = batch_checker(action_space)
        if type(self).actions is NumpyArrays.actions:  # the checker itself: no call between it and every step
            self.actions = self._check_actions  # type: ignore[method-assign]

    def bool_zeros(self, n: int) -> Any:
        return np.zeros(n, dtype=bool)

    def rows(self, selection: Selection) -> Any:
        """Index the buffers' rows of ``selection`` with this."""
        return selection.rows

    def reply_rows(self, host_rows: slice | np.ndarray) -> Any:
        """Index the buffers with the host index of a reply's envs."""
        return host_rows

    def actions(self, actions: Any, count: int) -> Batched:
        """The user's actions for ``count`` envs, checked, as the buffers take them."""
        return self._check_actions(actions, count)

    def put_actions(self, buffers: Any, rows: Any, actions: Batched) -> None:
        """Hand a step the actions of its envs: written into the rows of ``buffers.actions``
        (which the subprocess backend's workers read from shared memory)."""
        put(buffers.actions, rows, actions)

    def take(self, batched: Batched, selection: Selection, lend: bool) -> Batched:
        """Rows of ``selection``: fresh arrays, or, when ``lend`` and it is every env, the buffers themselves."""
        if selection.everyone:
            return batched if lend else take(batched, None)
        return take(batched, selection.ids)

    def step_results(self, buffers: Any, selection: Selection, lend: bool,
                     obs: Any = None) -> tuple[Any, Any, Any, Any]:
        """Obs, reward, terminated and truncated of ``selection``, as :meth:`take` gives them
        (``obs``: the observations, already the caller's)."""
        if selection.everyone and lend:
            return buffers.obs, buffers.reward, buffers.terminated, buffers.truncated
        rows = selection.rows
        return (self.take(buffers.obs, selection, lend) if obs is None else obs, buffers.reward[rows].copy(),
                buffers.terminated[rows].copy(), buffers.truncated[rows].copy())

    def to_list(self, array: Any) -> list[Any]:
        return array.tolist()

    def fill_none_results(self, obs: Batched, step_arrays: tuple[Any, Any, Any], info: dict[str, Any],
                          none_result: Any) -> None:
        """Zero obs and reward, set terminated, clear truncated where ``none_result``; mark them in ``info``."""
        if none_result is None or not none_result.any():
            return
        reward, terminated, truncated = step_arrays
        positions = np.flatnonzero(none_result)
        zero_positions(obs, positions)
        reward[positions] = 0.0
        terminated[positions] = True
        truncated[positions] = False
        info[IDLE], info[IDLE_MASK] = none_result.copy(), none_result.copy()


class TorchArrays(NumpyArrays):
    """The tensor backend's buffers: torch tensors on one device, never read back in a step."""

    native_output = "torch"
    reads_on_host = False

    def __init__(self, device: Any, action_space: spaces.Space) -> None:
        import torch

        from parallelenv.tensor.env import torch_dtype

        super().__init__(action_space)
        self._torch = torch
        self.device = device
        self._action_dtype = torch_dtype(action_space)
        self._action_row_shape = tuple(action_space.shape or ())
        self._own_actions: Any = None  # for steps of some envs: the caller's batch has only their rows
        self._device_index = torch.empty(0, device=device).get_device()  # -1: the CPU

    def bool_zeros(self, n: int) -> Any:
        return self._torch.zeros(n, dtype=self._torch.bool, device=self.device)

    def rows(self, selection: Selection) -> Any:
        return slice(None) if selection.everyone else self._index(selection.ids)

    def reply_rows(self, host_rows: slice | np.ndarray) -> Any:
        return host_rows if isinstance(host_rows, slice) else self._index(host_rows)

    def _index(self, ids: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device, non_blocking=True)

    def actions(self, actions: Any, count: int) -> Any:
        torch, space = self._torch, self._action_space
        if isinstance(actions, torch.Tensor):
            if (actions.dtype is self._action_dtype and actions.get_device() == self._device_index
                    and actions.dim() == 1 + len(self._action_row_shape) and actions.shape[0] == count
                    and actions.shape[1:] == self._action_row_shape):
                return actions  # the hot path: the batch as the env takes it
            expected = (count, *self._action_row_shape)
            if actions.dim() == 0:
                raise TypeError(f"actions is the single value {actions!r}; expected a batch of shape {expected}, "
                                f"one row per env ({count} envs of {space})")
            if actions.shape != expected:
                raise ValueError(f"actions has shape {tuple(actions.shape)}; expected {expected} "
                                 f"({count} envs of {space})")
            if actions.dtype != self._action_dtype:
                if actions.is_floating_point() and not self._action_dtype.is_floating_point:
                    raise TypeError(f"actions of dtype {actions.dtype} cannot be cast safely to "
                                    f"{space.dtype} of {space}")
                actions = actions.to(self._action_dtype)
            return actions if actions.device == self.device else actions.to(self.device, non_blocking=True)
        checked = np.asarray(self._check_actions(actions, count))
        return torch.from_numpy(checked.astype(space.dtype, copy=False)).to(self.device)

    def put_actions(self, buffers: Any, rows: Any, actions: Any) -> None:
        """A batch for every env is handed over as it is, not copied: the step only reads
        it. The rows of a step of some envs go into a batch of our own."""
        if isinstance(rows, slice):
            buffers.actions = actions
            return
        if self._own_actions is None:
            self._own_actions = buffers.actions.clone()
        self._own_actions[rows] = actions
        buffers.actions = self._own_actions

    def take(self, batched: Any, selection: Selection, lend: bool) -> Any:
        if selection.everyone:
            return batched if lend else batched.clone()
        return batched[self._index(selection.ids)]

    def step_results(self, buffers: Any, selection: Selection, lend: bool,
                     obs: Any = None) -> tuple[Any, Any, Any, Any]:
        if selection.everyone:
            if lend:
                return buffers.obs, buffers.reward, buffers.terminated, buffers.truncated
            return buffers.obs.clone(), buffers.reward.clone(), buffers.terminated.clone(), buffers.truncated.clone()
        index = self._index(selection.ids)
        return buffers.obs[index], buffers.reward[index], buffers.terminated[index], buffers.truncated[index]

    def fill_none_results(self, obs: Any, step_arrays: tuple[Any, Any, Any], info: dict[str, Any],
                          none_result: Any) -> None:
        """As for NumPy, as masked writes: whether any env is finished is not read from the device.

        ``info["idle"]`` is then always there, its mask saying which envs it is for.
        """
        if none_result is None:
            return
        reward, terminated, truncated = step_arrays
        obs.masked_fill_(none_result.view(-1, *[1] * (obs.dim() - 1)), 0)
        reward.masked_fill_(none_result, 0.0)
        terminated.logical_or_(none_result)
        truncated.logical_and_(~none_result)
        info[IDLE], info[IDLE_MASK] = none_result, none_result.clone()


def array_kind(buffers: Any, action_space: spaces.Space) -> NumpyArrays:
    """The kind of a backend's buffers."""
    if is_tensor(buffers.reward):
        return TorchArrays(buffers.reward.device, action_space)
    return NumpyArrays(action_space)
