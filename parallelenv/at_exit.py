"""ParallelEnvs not closed when the interpreter exits: closed while their backends can still shut
down cleanly (workers joined, shared memory unlinked)."""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401  (its exit hook must be registered before ours, to run after it)
import weakref
from typing import Any

_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(penv: Any) -> None:
    """Have ``penv._close_at_exit()`` called at exit unless it is gone by then."""
    _OPEN.add(penv)


@atexit.register
def _close_open_envs() -> None:
    for penv in list(_OPEN):
        try:
            penv._close_at_exit()
        except Exception:
            pass
