"""The arrays a backend exchanges with the front: actions in, results out.

One row per env. The front writes actions and reads results; the env hosts
read actions and write results, each only in the rows of its own envs. For
the subprocess backend these arrays live in shared memory, so observations
cross the process boundary without being pickled; the parts of spaces of no
fixed shape never do (see :mod:`parallelenv.batching`), and travel with the
messages instead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
from gymnasium import spaces

from parallelenv.backends.handover import LEASES_HOLD_VIEWS, Handover, choose
from parallelenv.batching import Allocator, Batched, allocate, is_per_env_objects, private_parts
from parallelenv.infos.columns import CELL_BYTES, INFO_CELLS, InfoColumns


@dataclass
class Buffers:
    obs: Batched
    actions: Batched
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    #: Under ``asynchronous="restart"``, for observations that are one array of
    #: fixed-shape rows of up to ``ENDED_ROW_MAX_BYTES``: per env, whether its
    #: last step ended an episode and reset it, and that episode's last obs. The host writes them with the
    #: step's other results, so the front builds ``info["ended_state"]`` in a
    #: few array operations rather than merging one info per env, and a worker
    #: whose envs restarted still answers without pickling anything. None
    #: otherwise: ended episodes' last obs then travel in the envs' infos.
    ended: np.ndarray | None = None
    ended_obs: Batched | None = None
    #: Results of a call on every env are these arrays themselves, lent to the
    #: caller until the next call rewrites them, rather than copies (``copy=False``,
    #: which the front sets here for every backend).
    lent: bool = False
    #: Whether a step of every env may hand ``obs`` itself to the caller and
    #: put a new array in its place rather than copy it out (the ``renew``
    #: handover). Set by backends whose buffers are the caller's own memory, for
    #: observations large enough that the copy costs more than the allocation.
    renews_obs: bool = False
    #: Buffers in shared memory hand ``obs`` over by turns instead (the ``slot``
    #: handover, see :meth:`use_obs_slot`): slot 0 is ``obs`` as allocated, the others are
    #: spares that a step of every env may be written into and handed over
    #: in, each taken again once the caller has let go of it. Empty: no spares.
    obs_slots: list[np.ndarray] = field(default_factory=list)
    obs_slot: int = 0  # the slot ``obs`` is now
    #: Per slot, a weak reference to the last lease on it handed to the caller (see handover.Slot),
    #: and the memoryview of it that leases are made from (made once: a step pays a lease only).
    obs_leases: list[weakref.ref[np.ndarray] | None] = field(default_factory=list, repr=False)
    obs_memory: list[memoryview] = field(default_factory=list, repr=False)
    #: The parts of ``obs`` and ``actions`` private to this process (spaces of
    #: no fixed shape), in a fixed order: what a backend whose envs run in other
    #: processes sends along with its calls and replies. Empty for fixed shapes.
    private_obs: list[np.ndarray] = field(init=False, repr=False)
    private_actions: list[np.ndarray] = field(init=False, repr=False)
    #: Buffers whose envs run in other processes give a step's numeric infos
    #: columns of their own (see :mod:`~parallelenv.infos.columns`); None elsewhere.
    info_columns: InfoColumns | None = None

    def __post_init__(self) -> None:
        self.private_obs = private_parts(self.obs)
        self.private_actions = private_parts(self.actions)

    @property
    def handover(self) -> Handover:
        """How results reach the caller, read from ``lent``, ``renews_obs`` and ``obs_slots`` alone."""
        return choose(self.lent, self.renews_obs, bool(self.obs_slots))

    def use_obs_slot(self, slot: int) -> None:
        """Make slot ``slot`` ``obs``: where the next calls write their observations."""
        if slot != self.obs_slot:
            self.obs = self.obs_slots[slot]
            self.obs_slot = slot

    @classmethod
    def allocate(
        cls, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, alloc: Allocator,
        restarts: bool = False, spare_obs_slots: int = 0, info_columns: bool = False,
    ) -> Buffers:
        """The buffers of ``num_envs`` envs; ``restarts``: with the rows of ended episodes, where they fit;
        ``spare_obs_slots``: that many spare ``obs`` arrays (see :meth:`use_obs_slot`); ``info_columns``:
        with cells for infos (see :mod:`~parallelenv.infos.columns`)."""
        obs = allocate(obs_space, num_envs, alloc)
        buffers = cls(
            obs=obs,
            actions=allocate(action_space, num_envs, alloc),
            reward=alloc((num_envs,), np.dtype(np.float64)),
            terminated=alloc((num_envs,), np.dtype(np.bool_)),
            truncated=alloc((num_envs,), np.dtype(np.bool_)),
        )
        if restarts and has_fixed_rows(obs) and _row_nbytes(obs_space) <= ENDED_ROW_MAX_BYTES:
            buffers.ended = alloc((num_envs,), np.dtype(np.bool_))
            buffers.ended_obs = allocate(obs_space, num_envs, alloc)
        if spare_obs_slots:
            buffers.obs_slots = [obs, *(allocate(obs_space, num_envs, alloc) for _ in range(spare_obs_slots))]
            buffers.obs_leases = [None] * len(buffers.obs_slots)
            buffers.obs_memory = [memoryview(slot) for slot in buffers.obs_slots]
        if info_columns:
            buffers.info_columns = InfoColumns(alloc((INFO_CELLS * num_envs * CELL_BYTES,), np.dtype(np.uint8)),
                                               alloc((INFO_CELLS, num_envs), np.dtype(np.bool_)), num_envs)
        return buffers


# The ended episodes' rows double the observations' share of the buffers
# (shared memory for subproc, where a container's /dev/shm may hold 64 MiB).
# Observations larger than this (an Atari frame stack is 28 KiB) report ended
# episodes in the infos, as other spaces do: they pay a pickle only in the
# rare steps that end an episode. The rule reads the space alone, so a Ray
# actor's buffers, whatever its number of envs, agree with the caller's.
ENDED_ROW_MAX_BYTES = 64 * 2**10


def _row_nbytes(space: spaces.Space) -> int:
    return int(np.prod(space.shape or (), dtype=np.int64)) * np.dtype(space.dtype).itemsize


# Below this, copying a step's observations out costs about what allocating
# new buffers does; above, the copy costs many times the allocation (the
# performance page has the figures).
RENEW_OBS_MIN_BYTES = 64 * 2**10


def renewable(obs: Batched) -> bool:
    """Whether buffers in the caller's memory should hand over this ``obs`` rather than copy it."""
    return has_fixed_rows(obs) and obs.nbytes >= RENEW_OBS_MIN_BYTES


# Shared buffers hand a step's observations over in spare slots, two of them:
# a training loop holds the obs it acts on while it steps, so one spare would
# be held whenever the next step is written. A bound on what they add to
# /dev/shm, which in a container may hold 64 MiB and whose overflow kills the
# writer with SIGBUS: larger observations are copied out, as before.
SPARE_OBS_SLOTS = 2
OBS_SLOT_MAX_BYTES = 8 * 2**20


def spare_obs_slots(obs_space: spaces.Space, num_envs: int, copies_results: bool) -> int:
    """How many spare slots shared buffers of these observations get (see Buffers.use_obs_slot)."""
    if not (copies_results and LEASES_HOLD_VIEWS) or not isinstance(
            obs_space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        return 0
    nbytes = num_envs * _row_nbytes(obs_space)
    return SPARE_OBS_SLOTS if RENEW_OBS_MIN_BYTES <= nbytes <= OBS_SLOT_MAX_BYTES else 0


def has_fixed_rows(batched: Batched) -> bool:
    """Whether ``batched`` is one array of fixed-shape rows (not a dict, a tuple, or objects)."""
    return isinstance(batched, np.ndarray) and not is_per_env_objects(batched)
