"""Buffers placed in one POSIX shared-memory segment per ParallelEnv.

Workers write observations, rewards and flags straight into their rows and
the parent reads them without unpickling anything; the parts of spaces of no
fixed shape stay out of the segment, private to each process, and travel
with the messages (:mod:`parallelenv.backends.wire`). The parent creates the
segment and unlinks its name as soon as every worker has attached to it by
that name, so that nothing is left in ``/dev/shm`` however the processes end.
"""

from __future__ import annotations

import os
import sys
import uuid
from multiprocessing import shared_memory

from gymnasium import spaces

from parallelenv.backends.buffers import Buffers
from parallelenv.batching import BufferLayout

NAME_PREFIX = "penv_"


def _layout(
    obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool, spare_obs_slots: int,
    buffer: object,
) -> tuple[Buffers, int]:
    layout = BufferLayout(buffer)
    buffers = Buffers.allocate(obs_space, action_space, num_envs, layout, restarts, spare_obs_slots)
    return buffers, layout.size


class SharedBuffers:
    """The shared-memory segment and the :class:`Buffers` laid over it."""

    def __init__(self, segment: shared_memory.SharedMemory, buffers: Buffers, owner: bool) -> None:
        self.segment = segment
        self.buffers: Buffers | None = buffers
        self._owner = owner

    @classmethod
    def create(
        cls, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool,
        spare_obs_slots: int = 0,
    ) -> SharedBuffers:
        _, size = _layout(obs_space, action_space, num_envs, restarts, spare_obs_slots, None)
        name = f"{NAME_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        buffers, _ = _layout(obs_space, action_space, num_envs, restarts, spare_obs_slots, segment.buf)
        return cls(segment, buffers, owner=True)

    @classmethod
    def attach(
        cls, name: str, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool,
        spare_obs_slots: int = 0,
    ) -> SharedBuffers:
        if sys.version_info >= (3, 13):
            # The creator owns the segment; a worker's tracker must not unlink it.
            segment = shared_memory.SharedMemory(name=name, track=False)
        else:
            segment = shared_memory.SharedMemory(name=name)
        buffers, _ = _layout(obs_space, action_space, num_envs, restarts, spare_obs_slots, segment.buf)
        return cls(segment, buffers, owner=False)

    @property
    def name(self) -> str:
        return self.segment.name

    def unlink(self) -> None:
        """Remove the segment's name; the memory lives on while a process maps it.

        Called once every worker has attached: from then on no way of dying,
        of the parent or of any worker, can leave the segment behind.
        """
        if self._owner:
            try:
                self.segment.unlink()
            except FileNotFoundError:
                pass
            self._owner = False

    def release(self) -> None:
        """Drop our arrays over the segment, close it, and unlink it if we made it."""
        self.buffers = None
        try:
            self.segment.close()
        except BufferError:
            pass  # someone still holds an array over it; the mapping goes with the process
        self.unlink()
