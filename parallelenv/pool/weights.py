"""Agent updates: checked once in the caller, published once, loaded by each worker between two steps.

An update is a new policy (a callable, sent pickled), a state dict (for a
policy with ``load_state_dict``: a torch module), or parameters (for a
policy with ``set_param_values``, as garage's). A state dict is checked
against the policy's own before anything is sent, so that a wrong shape is
the caller's error, not four workers' at once.

Worker processes read state dicts from one shared-memory block
(:class:`SharedWeights`) that the caller writes once per update, however
many workers there are; Ray actors get one object-store reference. The
block is guarded by a sequence lock, not a lock: a worker killed while
reading it would hold a lock forever, while a reader of a sequence lock
only retries when a write overlapped its copy.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from parallelenv.backends import pickling
from parallelenv.backends.subproc.shm import MemfdSegment, dev_shm_segment, open_segment

ALIGN = 64
HEADER = 3  # int64s: writes begun, writes done, version of the weights in the block

Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]  # (name, dtype, shape, offset)


@dataclass(frozen=True)
class Update:
    """A checked agent update: ``kind`` is ``"policy"`` (pickled bytes), ``"state"`` or ``"params"``."""

    kind: str
    value: Any


def state_arrays(policy: Any) -> dict[str, np.ndarray] | None:
    """The policy's state dict as NumPy arrays; None for a policy without one (or one not all arrays)."""
    if not hasattr(policy, "state_dict"):
        return None
    arrays = {}
    for name, value in policy.state_dict().items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        if not isinstance(value, np.ndarray):
            return None
        arrays[name] = value
    return arrays


def pickle_policy(policy: Any, workers: str) -> bytes:
    try:
        return pickling.dumps(policy)
    except Exception as exc:
        raise TypeError(
            f"the policy {policy!r} cannot be pickled to send it to {workers}: {type(exc).__name__}: {exc}"
        ) from exc


def check_update(template: Any, update: Any, workers: str) -> Update:
    """``update`` as an :class:`Update` for a pool whose policy is ``template``; errors name ``workers``."""
    if callable(update) and not isinstance(update, Mapping):
        own, new = state_arrays(template), state_arrays(update)
        if own is not None and (new is None or _shapes(new) != _shapes(own)):
            raise ValueError(f"the new policy for {workers} has other parameters than their policy: "
                             "build a new pool for another architecture")
        return Update("policy", pickle_policy(update, workers))
    if isinstance(update, Mapping):
        own = state_arrays(template)
        if own is None:
            raise TypeError(f"a state dict cannot update {workers}: their policy {template!r} has no load_state_dict")
        given = {name: _array(value) for name, value in update.items()}
        if set(given) != set(own):
            missing, unexpected = sorted(set(own) - set(given)), sorted(set(given) - set(own))
            raise ValueError(f"the weights for {workers} do not fit their policy: missing {missing}, "
                             f"unexpected {unexpected}")
        for name, array in given.items():
            if array.shape != own[name].shape:
                raise ValueError(f"the weights for {workers} do not fit their policy: {name!r} has shape "
                                 f"{array.shape}, the policy's has {own[name].shape}")
        return Update("state", {name: given[name].astype(own[name].dtype, copy=False) for name in own})
    if not hasattr(template, "set_param_values"):
        raise TypeError(
            f"cannot update {workers}, whose policy is a {type(template).__name__}, with a {type(update).__name__}: "
            "pass a new policy, a state dict for a policy with load_state_dict, or parameters for one with "
            "set_param_values"
        )
    if hasattr(template, "get_param_values"):
        shape, own_shape = np.shape(update), np.shape(template.get_param_values())
        if shape != own_shape:
            raise ValueError(f"the parameters for {workers} have shape {shape}, their policy's {own_shape}")
    return Update("params", update)


def load(vec_worker: Any, update: Update) -> None:
    """Apply ``update`` to a VecWorker's policy, in the worker."""
    if update.kind == "policy":
        import cloudpickle

        vec_worker.update_agent(cloudpickle.loads(update.value))
        return
    value = update.value
    torch = sys.modules.get("torch")
    if update.kind == "state" and torch is not None and isinstance(vec_worker.policy, torch.nn.Module):
        # Object-store arrays are read-only: torch wants its own writable memory.
        value = {name: torch.from_numpy(array if array.flags.writeable else array.copy())
                 for name, array in value.items()}
    vec_worker.update_agent(value)


def _shapes(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {name: (array.shape, array.dtype) for name, array in arrays.items()}


def _array(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


class SharedWeights:
    """A state dict in shared memory: the caller writes each version once, every worker process reads it."""

    def __init__(self, segment: shared_memory.SharedMemory | MemfdSegment, layout: Layout, owner: bool) -> None:
        self._segment = segment
        self.layout = layout
        self._owner = owner
        buffer = segment.buf
        self._header = np.ndarray((HEADER,), np.int64, buffer)
        self._views = {name: np.ndarray(shape, np.dtype(dtype), buffer, offset)
                       for name, dtype, shape, offset in layout}

    @classmethod
    def create(cls, arrays: Mapping[str, np.ndarray]) -> SharedWeights:
        offset, layout = ALIGN, []
        for name, array in arrays.items():
            layout.append((name, array.dtype.str, tuple(array.shape), offset))
            offset += -(-array.nbytes // ALIGN) * ALIGN
        # Without a name where it can (see backends.subproc.shm): a job killed whole leaves nothing in /dev/shm.
        segment = dev_shm_segment(max(offset, ALIGN), kind="pool_")
        shared = cls(segment, tuple(layout), owner=True)
        shared._header[:] = 0
        return shared

    @property
    def handle(self) -> tuple[str, Layout]:
        """What a worker process needs to :meth:`attach`."""
        return self._segment.name, self.layout

    @classmethod
    def attach(cls, handle: tuple[str, Layout]) -> SharedWeights:
        name, layout = handle
        return cls(open_segment(name), layout, owner=False)

    @property
    def version(self) -> int:
        """The version in the block (0 before the first write)."""
        return int(self._header[2])

    def write(self, version: int, arrays: Mapping[str, np.ndarray]) -> None:
        header = self._header
        header[0] += 1
        for name, view in self._views.items():
            view[...] = arrays[name]
        header[2] = version
        header[1] = header[0]

    def read(self) -> tuple[int, dict[str, np.ndarray]]:
        """The latest version and a copy of its weights, taken while no write overlapped."""
        header = self._header
        while True:
            done = int(header[1])
            if int(header[0]) == done:
                arrays = {name: view.copy() for name, view in self._views.items()}
                version = int(header[2])
                if int(header[0]) == done:
                    return version, arrays
            time.sleep(0)

    def close(self) -> None:
        """Let go of the block; the caller's copy also removes it."""
        self._views.clear()
        del self._header
        self._segment.close()
        if self._owner:
            try:
                self._segment.unlink()
            except FileNotFoundError:
                pass
