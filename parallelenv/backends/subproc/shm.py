"""Buffers placed in one POSIX shared-memory segment per ParallelEnv.

Workers write observations, rewards and flags straight into their rows and
the parent reads them without unpickling anything; the parts of spaces of no
fixed shape stay out of the segment, private to each process, and travel
with the messages (:mod:`parallelenv.backends.subproc.wire`). Nothing may be left in
``/dev/shm`` however the processes end, a kill of the whole process group
included (it takes the resource tracker along): on Linux the parent removes
the segment's name as soon as it has made it, and workers, replacements
included, open the file as ``/proc/<parent pid>/fd/<fd>`` (as a memfd's,
below). Elsewhere they attach by name, which the parent removes once every
worker has attached, unless dead workers are to be replaced.

``/dev/shm`` is a tmpfs whose size may be small (Docker gives a container
64 MB unless ``docker run --shm-size`` says otherwise), and tmpfs hands out
pages only when they are first written: a segment larger than the space left
was created all the same, and the worker that first wrote past it died of
SIGBUS. So the segment goes to ``/dev/shm`` only if it fits there, leaving
:data:`SHM_HEADROOM` to the others that use it, and every page is allocated
at creation (``posix_fallocate``), which turns a shortage that appears in
between into an error we catch. Otherwise the buffers live in an anonymous
file (``os.memfd_create``), which no mount's size caps, only the memory the
process may use; workers open it as ``/proc/<parent pid>/fd/<fd>``, which is
its "name" until the parent closes that descriptor, once every worker has
mapped it. It has no name in any directory, so nothing is left behind
however the processes end. Where neither can hold the buffers, creation
raises :class:`SharedMemoryError` with the size needed and the fix. The
fallback is no failure and warns of nothing (its memory is as fast):
:attr:`SharedBuffers.backing` says which was used, and this module's logger
says so at INFO.
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import sys
import uuid
import weakref
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from gymnasium import spaces

from parallelenv.backends.buffers import Buffers
from parallelenv.batching import BufferLayout
from parallelenv.errors import ParallelEnvError

NAME_PREFIX = "penv_"
SHM_DIR = "/dev/shm"
# Left free in /dev/shm for whatever else uses it (named semaphores, other
# programs' segments, a DataLoader's): taking its last pages would move the
# SIGBUS to them.
SHM_HEADROOM = 8 * 2**20
MEMFD = "memfd"

_log = logging.getLogger(__name__)


class SharedMemoryError(ParallelEnvError, OSError):
    """Neither /dev/shm nor the process's memory can hold the shared buffers."""


def _layout(
    obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool, spare_obs_slots: int,
    buffer: object,
) -> tuple[Buffers, int]:
    layout = BufferLayout(buffer)
    buffers = Buffers.allocate(obs_space, action_space, num_envs, layout, restarts, spare_obs_slots,
                               info_columns=True)
    return buffers, layout.size


def _free_shm_bytes() -> int | None:
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:  # no /dev/shm to measure (macOS keeps POSIX shared memory elsewhere)
        return None
    return stats.f_bavail * stats.f_frsize


def _allocate(fd: int, size: int) -> None:
    """Give the file all its pages now, so that a shortage raises here rather than SIGBUS in a worker."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a kind of file that cannot
            raise


def dev_shm_segment(size: int, kind: str = "") -> shared_memory.SharedMemory | MemfdSegment:
    """A segment in /dev/shm; on Linux already without its name, opened as ``/proc/<pid>/fd/<fd>``
    (:func:`open_segment` opens either)."""
    name = f"{NAME_PREFIX}{os.getpid()}_{kind}{uuid.uuid4().hex[:12]}"
    segment = shared_memory.SharedMemory(name=name, create=True, size=size)
    if not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        try:
            _allocate(segment._fd, size)  # the segment's own descriptor: SharedMemory offers no other way to it
        except BaseException:
            segment.close()
            segment.unlink()
            raise
        return segment
    # The file lives on while a descriptor or a mapping holds it; its name would outlive a killed job.
    try:
        fd = os.dup(segment._fd)
    finally:
        segment.close()
        segment.unlink()
    try:
        _allocate(fd, size)
        return MemfdSegment(fd, size, f"/proc/{os.getpid()}/fd/{fd}", owner=True, backing=SHM_DIR)
    except BaseException:
        os.close(fd)
        raise


class MemfdSegment:
    """An anonymous file's memory (a memfd, or a file in /dev/shm whose name is gone), with the interface
    of ``SharedMemory`` that :class:`SharedBuffers` uses; ``backing`` says which.

    Its ``name`` is the path a worker opens it by, valid while the creator
    holds its descriptor: :meth:`unlink` closes that, as removing a named
    segment's name does.
    """

    def __init__(self, fd: int, size: int, name: str, owner: bool, backing: str = MEMFD) -> None:
        self.backing = backing
        self._mmap: mmap.mmap | None = mmap.mmap(fd, size)
        self.buf: memoryview | None = memoryview(self._mmap)
        self.name = name
        self.size = size
        self._fd = fd if owner else -1

    @classmethod
    def create(cls, size: int) -> MemfdSegment:
        fd = os.memfd_create(f"{NAME_PREFIX}{os.getpid()}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            _allocate(fd, size)
            return cls(fd, size, f"/proc/{os.getpid()}/fd/{fd}", owner=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open(cls, name: str) -> MemfdSegment:
        fd = os.open(name, os.O_RDWR)
        try:
            return cls(fd, os.fstat(fd).st_size, name, owner=False)
        finally:
            os.close(fd)  # the mapping holds the file

    def close(self) -> None:
        if self.buf is not None:
            self.buf.release()  # BufferError while arrays over it live, as SharedMemory.close
            self.buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def unlink(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def segment_for(size: int, num_envs: int) -> shared_memory.SharedMemory | MemfdSegment:
    """A segment of ``size`` bytes in /dev/shm if it fits there, else in a memfd."""
    free = _free_shm_bytes()
    if free is None or size + SHM_HEADROOM <= free:
        try:
            return dev_shm_segment(size)
        except OSError as error:
            why_not_shm = f"{SHM_DIR} could not hold it ({error})"
    else:
        why_not_shm = f"{SHM_DIR} has {_mib(free)} MiB free"
    try:
        segment = MemfdSegment.create(size)
    except (OSError, AttributeError) as error:  # AttributeError: no memfd_create (not Linux)
        raise SharedMemoryError(
            errno.ENOSPC,
            f"the shared buffers of {num_envs} envs need {_mib(size)} MiB: {why_not_shm}, and memory outside it "
            f"could not be had either ({error!r}). In a Docker container, give /dev/shm room for them: "
            f"docker run --shm-size={_mib(size + SHM_HEADROOM)}m (or more); elsewhere, free memory or "
            "enlarge /dev/shm (mount -o remount,size=... /dev/shm).",
        ) from error
    _log.info("the shared buffers (%d MiB) are in a memfd: %s", _mib(size), why_not_shm)
    return segment


def open_segment(name: str) -> shared_memory.SharedMemory | MemfdSegment:
    """A segment another process made, by the ``name`` it gave: a path under /proc, or a name in /dev/shm."""
    if name.startswith("/"):  # a memfd's or an unnamed file's path; a named segment's name has no slash
        return MemfdSegment.open(name)
    if sys.version_info >= (3, 13):
        # The creator owns the segment; a worker's tracker must not unlink it.
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)


def _mib(nbytes: int) -> int:
    return math.ceil(nbytes / 2**20)


class SharedBuffers:
    """The shared-memory segment and the :class:`Buffers` laid over it.

    ``backing`` says where its memory is: ``"/dev/shm"`` or ``"memfd"`` (see the module's docstring).
    """

    def __init__(self, segment: shared_memory.SharedMemory | MemfdSegment, buffers: Buffers, owner: bool) -> None:
        self.segment = segment
        self.buffers: Buffers | None = buffers
        self._owner = owner
        self.backing = segment.backing if isinstance(segment, MemfdSegment) else SHM_DIR

    @classmethod
    def create(
        cls, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool,
        spare_obs_slots: int = 0,
    ) -> SharedBuffers:
        _, size = _layout(obs_space, action_space, num_envs, restarts, spare_obs_slots, None)
        segment = segment_for(max(size, 1), num_envs)
        buffers, _ = _layout(obs_space, action_space, num_envs, restarts, spare_obs_slots, segment.buf)
        return cls(segment, buffers, owner=True)

    @classmethod
    def attach(
        cls, name: str, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int, restarts: bool,
        spare_obs_slots: int = 0,
    ) -> SharedBuffers:
        segment = open_segment(name)
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
        """Drop our arrays over the segment, close it, and unlink it if we made it.

        Results handed over without a copy (leases on spare obs slots, see
        :class:`~parallelenv.backends.handover.Slot`; the buffers themselves under
        ``copy=False``) are readable for as long as the caller holds them, closed
        ParallelEnv or not: reading one after an unmapping would crash the caller's
        process. The segment is then closed once the last of those arrays is collected.
        """
        buffers, self.buffers = self.buffers, None
        held = [] if buffers is None else _what_the_caller_may_hold(buffers)
        del buffers
        if held:
            _close_once_collected(self.segment, held)
        else:
            close_segment(self.segment)
        self.unlink()


def _what_the_caller_may_hold(buffers: Buffers) -> list[np.ndarray]:
    """The arrays over the segment that results handed over may still be views of: the live leases on
    spare obs slots, and where results are lent (``copy=False``), the result arrays themselves."""
    held = [lease for lease in (ref() for ref in buffers.obs_leases if ref is not None) if lease is not None]
    if buffers.lent:
        held += [*_arrays_of(buffers.obs), buffers.reward, buffers.terminated, buffers.truncated]
    return held


def _arrays_of(batched: Any) -> list[np.ndarray]:
    """The arrays of a batch of fixed shape, in a dict or tuple space's nesting."""
    if isinstance(batched, dict):
        return [array for part in batched.values() for array in _arrays_of(part)]
    if isinstance(batched, tuple):
        return [array for part in batched for array in _arrays_of(part)]
    return [batched] if isinstance(batched, np.ndarray) else []


def close_segment(segment: shared_memory.SharedMemory | MemfdSegment) -> None:
    try:
        segment.close()
    except BufferError:
        pass  # someone still holds an array over it; the mapping goes with the process


def _close_once_collected(segment: shared_memory.SharedMemory | MemfdSegment, held: list[np.ndarray]) -> None:
    """Close ``segment`` when the last of the arrays ``held`` is collected; until then their finalizers hold it."""
    left = [len(held)]

    def one_collected() -> None:
        left[0] -= 1
        if not left[0]:
            close_segment(segment)

    for array in held:
        weakref.finalize(array, one_collected)
