"""Linux futexes on shared memory: one system call wakes every worker waiting on a word.

A step of every env is announced to all workers by bumping one 32-bit word
of a shared (not private) mapping and one ``FUTEX_WAKE_BITSET``: the caller
pays one call whatever the number of workers, where a message per worker
costs a write each. The bitset lets a message meant for a few
workers wake only those: worker ``i`` waits with bit ``i % 31`` and
:data:`EVERY_WORKER`'s top bit, so a wake-up of one worker stirs at most the
few that share its bit, and they find nothing and sleep again.

Where the call is not there (not Linux, an architecture whose number we do
not know, a kernel without it), :data:`AVAILABLE` is False and the backend
writes to each pipe instead.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time

# The futex system call's number per machine (asm/unistd.h); absent: not known here, not used.
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "s390x": 238,
              "riscv64": 98}
FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET = 9, 10  # without FUTEX_PRIVATE_FLAG: the word is shared between processes
EVERY_WORKER = 0xFFFFFFFF
_ALL_WAITERS = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[object, int] | None:
    number = _SYS_FUTEX.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.c_uint]
    probe = ctypes.c_int32(0)
    if syscall(number, ctypes.addressof(probe), FUTEX_WAKE_BITSET, 1, None, None, EVERY_WORKER) != 0:
        return None
    return syscall, number


_LOADED = _load()
AVAILABLE = _LOADED is not None


def bit_of(worker_index: int) -> int:
    """The bit a worker waits with, beside the one every broadcast sets."""
    return 1 << (worker_index % 31)


def wake(address: int, bits: int = EVERY_WORKER) -> None:
    """Wake every process waiting on the word at ``address`` with one of ``bits``."""
    syscall, number = _LOADED  # type: ignore[misc]  # only called where AVAILABLE
    syscall(number, address, FUTEX_WAKE_BITSET, _ALL_WAITERS, None, None, bits)


def wait(address: int, expected: int, bits: int, timeout_s: float) -> None:
    """Sleep while the word at ``address`` still holds ``expected``, until woken with one of ``bits``
    or ``timeout_s`` passes; returns at once if the word has changed already."""
    syscall, number = _LOADED  # type: ignore[misc]
    until = time.clock_gettime(time.CLOCK_MONOTONIC) + timeout_s  # the bitset wait's deadline is absolute
    deadline = _Timespec(int(until), int((until % 1) * 1e9))
    if syscall(number, address, FUTEX_WAIT_BITSET, expected, ctypes.byref(deadline), None, bits) != 0:
        error = ctypes.get_errno()
        if error not in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT):
            raise OSError(error, f"futex wait: {errno.errorcode.get(error, error)}")
