"""A worker process dies with its parent, whatever its env is doing.

A worker learns that its parent is gone when it next reads its pipe, and a
worker inside an env call that never returns never reads it again: it would
live on, orphaned. Two ties prevent that. A thread watches the pipe for the
parent's end closing (the kernel closes it when the parent dies, by any
signal) and ends the process. And on Linux the kernel kills the worker when
the process that started it exits (``PR_SET_PDEATHSIG``; under forkserver
that is the fork server, which exits with the parent), for an env that holds
the interpreter's lock forever. The shared memory needs neither: its name is
unlinked once every worker has attached (see :mod:`parallelenv.backends.subproc.shm`).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
from multiprocessing.connection import Connection

PR_SET_PDEATHSIG = 1
# What a parent's death looks like on a socket: the peer hung up.
_HUNG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
EXIT_CODE_PARENT_GONE = 70


def tie_to_parent(conn: Connection) -> None:
    """End the calling worker process when the parent at the other end of ``conn`` is gone."""
    _killed_with_starter()
    watcher = threading.Thread(target=_watch, args=(conn.fileno(),), name="parallelenv-lifeline", daemon=True)
    watcher.start()


def _watch(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, _HUNG_UP)
    while True:
        for _, events in poller.poll():
            if events & select.POLLNVAL:  # the worker closed its pipe itself: it is exiting
                return
            if events & _HUNG_UP:
                os._exit(EXIT_CODE_PARENT_GONE)


def _killed_with_starter() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watching thread alone
        pass
