"""How a call's results reach the caller: one of four kinds, chosen once per ParallelEnv.

``copy``
    The caller gets fresh arrays of the rows it asked for. The default.
``lend``
    ``copy=False`` (the tensor backend's default): a call on every env gives
    the buffers themselves, which the next call rewrites.
``renew``
    Buffers in the caller's memory, observations large enough that a copy
    costs more than an allocation: a step of every env hands ``obs`` itself
    over and puts a new array in its place.
``slot``
    Shared buffers with spare obs slots (:func:`parallelenv.backends.buffers.spare_obs_slots`):
    a step of every env is written into a spare that the caller does not hold,
    and handed over out of it as a lease (see :class:`Slot`).

Under every kind but ``lend``, what the caller holds never changes under it:
``copy`` and ``renew`` give it memory that nothing else writes, ``slot`` gives
it memory that nothing writes while it holds any of it. A backend says what
its buffers can do (``Buffers.renews_obs``, ``Buffers.obs_slots``), the
caller's ``copy`` whether it may be lent the buffers; :func:`choose` turns
both into the kind, and the buffers keep it in ``Buffers.handover``.

Each kind is stateless (a slot's leases live in the buffers), so it is one
shared instance, and choosing again is free and loses nothing.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from parallelenv.array_kinds import NumpyArrays, Selection


class ObsBuffers(Protocol):
    """What the kinds read and write of a backend's :class:`~parallelenv.backends.buffers.Buffers`
    (the rest they hand on to ``NumpyArrays.step_results``). A protocol because that module imports
    this one to choose its kind: importing it back would close a cycle."""

    obs: Any
    obs_slot: int
    obs_leases: list[weakref.ref[np.ndarray] | None]
    obs_memory: list[memoryview]

    def use_obs_slot(self, slot: int) -> None: ...


class Handover:
    """``copy``: the rows asked for, copied out of the buffers."""

    kind = "copy"
    #: Whether a call's results on every env are the buffers themselves.
    lends = False

    def before_whole_call(self, buffers: ObsBuffers, step_of_every_env: bool) -> None:
        """A call of every env is about to be sent, with no other in flight: pick where it writes."""

    def whole_step_obs(self, buffers: ObsBuffers) -> Any:
        """The observations in the buffers, every row of them written by the steps being handed over,
        as the caller's own without a copy; None where they are to be copied out."""
        return None

    def step_results(self, arrays: NumpyArrays, buffers: ObsBuffers, selection: Selection,
                     fills_none_results: bool) -> tuple[Any, Any, Any, Any]:
        """Obs, reward, terminated and truncated of the READY envs of ``selection``, just received.

        ``fills_none_results``: the policy writes None results into them, so they must be the caller's own.
        """
        if not selection.everyone:
            return arrays.step_results(buffers, selection, False)
        lend = self.lends and not fills_none_results
        return arrays.step_results(buffers, selection, lend, None if lend else self.whole_step_obs(buffers))


class Lend(Handover):
    """``lend``: a call on every env gives the buffers themselves."""

    kind = "lend"
    lends = True


class Renew(Handover):
    """``renew``: ``obs`` itself, its place taken by a new array that the next calls write."""

    kind = "renew"

    def whole_step_obs(self, buffers: ObsBuffers) -> Any:
        obs = buffers.obs
        buffers.obs = np.empty_like(obs)
        return obs


class Slot(Handover):
    """``slot``: a step of every env is written into a spare slot and handed over as a lease on it.

    The rule: a spare is free exactly when the weak reference to the last
    lease handed over in it is dead. A lease is a fresh array over the
    slot's memory made by ``np.asarray`` of a memoryview (:func:`lease_on`): its base is
    that memoryview, not an array, and NumPy sets the base of every view of
    an array to the first array of the chain whose own base is no array, so
    every view, row, slice, reshape or ``np.asarray`` of what the caller was
    handed, and of those in turn, holds the lease; ``torch.from_numpy``
    holds the array it was made from. A copy holds nothing. A reference
    cycle holds the lease until the garbage collector breaks it: the slot
    is then only taken as held, and the step copied out. Nothing reads a
    reference count, whose meaning differs between interpreters.

    The premise, views holding the array whose base is no array, is
    NumPy's; :data:`LEASES_HOLD_VIEWS` checks it once on the running NumPy,
    and shared buffers get no spare slots where it does not hold.
    """

    kind = "slot"

    def before_whole_call(self, buffers: ObsBuffers, step_of_every_env: bool) -> None:
        buffers.use_obs_slot(self.free_slot(buffers) if step_of_every_env else 0)

    @staticmethod
    def free_slot(buffers: ObsBuffers) -> int:
        """A spare slot no lease of which is alive, or 0 (``obs`` as allocated) when the caller holds every spare."""
        leases = buffers.obs_leases
        for slot in range(1, len(leases)):
            lease = leases[slot]
            if lease is None or lease() is None:
                return slot
        return 0

    def whole_step_obs(self, buffers: ObsBuffers) -> Any:
        slot = buffers.obs_slot
        if not slot:  # slot 0: a step of some envs, or every spare held: the rows are copied out
            return None
        lease = lease_on(buffers.obs_memory[slot])
        buffers.obs_leases[slot] = weakref.ref(lease)
        buffers.use_obs_slot(0)
        return lease


def lease_on(memory: memoryview) -> np.ndarray:
    """A fresh array over ``memory``, a memoryview of an array (dtype and shape as it): its base is
    that memoryview, so every view of the lease holds the lease.

    Never made from the array itself: NumPy takes an array it is given for the base, and views of the
    lease would then pass the lease by. The memoryview holds the array, not an export of the memory
    under it: ParallelEnv.close() unmaps shared memory whatever the caller still holds, as before
    leases, since an export would keep SharedMemory from closing, and it reports that when collected.
    """
    return np.asarray(memory)


COPY, LEND, RENEW, SLOT = Handover(), Lend(), Renew(), Slot()


def choose(lent: bool, renews_obs: bool, has_obs_slots: bool) -> Handover:
    """The kind for buffers lent to the caller (``copy=False``), that may renew their ``obs``
    (in the caller's memory), or that have spare obs slots (in shared memory)."""
    if lent:
        return LEND
    if has_obs_slots:
        return SLOT
    if renews_obs:
        return RENEW
    return COPY


def _leases_hold_their_views() -> bool:
    """Whether, on this NumPy, every view of a lease (see :class:`Slot`) holds the lease."""
    memory = np.zeros((2, 3), np.float32)
    lease = lease_on(memoryview(memory))
    views = [lease[1], lease[1][1:], lease[:, 1:].T, lease.reshape(-1), np.asarray(lease[0]), lease.view(np.uint8)]
    return (not isinstance(lease.base, np.ndarray) and lease is not lease_on(memoryview(memory))
            and (lease.dtype, lease.shape) == (memory.dtype, memory.shape) and np.shares_memory(lease, memory)
            and all(view.base is lease for view in views))


LEASES_HOLD_VIEWS = _leases_hold_their_views()
