"""One caller at a time on a ParallelEnv, whatever the number of threads.

Interleaved, two threads would take each other's replies: one could get the
other's rewards, or both wait for a reply the other consumed. The one
exception is ``close()``, which ends the call another thread has under way
(``self._calls.interrupted``, the one record of it): that call then raises ClosedError in its thread,
which closes the ParallelEnv on its way out, since it owns the lock. And
one that is still open when the interpreter exits is closed then
(:func:`close_at_exit`), while its backend can still shut down cleanly.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing.util  # noqa: F401  (its exit hook must be registered before ours, to run after it)
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar, cast

from parallelenv.backends.base import Interruptible
from parallelenv.errors import ClosedError

# At exit, how long close() waits for a call another thread still has under way.
EXIT_LOCK_WAIT_S = 1.0
# How long close() from another thread waits for the call it ended to return.
CLOSE_INTERRUPT_WAIT_S = 10.0

F = TypeVar("F", bound=Callable[..., Any])


def one_caller_at_a_time(method: F) -> F:
    """Serialise a public call on ``self._lock``: a second thread waits until the first one's call has returned.

    With ``ParallelEnv(stats=True)`` the call's whole time goes to its caller clock
    (:mod:`parallelenv.timing.caller_clock`); without, nothing is timed.
    """
    name = method.__name__
    timed = name in ("step", "send", "recv")  # the calls a caller clock counts (timing.caller_clock)

    @functools.wraps(method)
    def serialised(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            clock = getattr(self, "_caller_clock", None) if timed else None
            began = perf_counter() if clock is not None else 0.0
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                if not self._calls.interrupted or isinstance(exc, ClosedError):
                    raise
                raise ClosedError(
                    f"close() from another thread ended this call ({type(exc).__name__}: {exc})"
                ) from exc
            finally:
                if clock is not None:
                    clock.front_call(name, perf_counter() - began)
                if self._calls.interrupted:
                    self._close()

    return cast(F, serialised)


def close_ending_the_call_under_way(penv: Any, wait_s: float = CLOSE_INTERRUPT_WAIT_S) -> None:
    """``penv.close()``: at once where no other thread has a call under way; else end that call first.

    The backend's optional ``interrupt()`` stops the workers or actors the
    call waits on, touching nothing else; the waiting thread sees their
    deaths, survives none (``penv._calls.interrupted``), raises ClosedError and
    closes ``penv`` on its way out. This returns once it has, or after
    ``wait_s`` (a call running an env in the caller's thread cannot be stopped).
    """
    lock = penv._lock
    if not lock.acquire(blocking=False):
        penv._calls.interrupted = True  # another thread holds the lock: the ParallelEnv is built
        if isinstance(penv.backend, Interruptible):  # a backend of the caller's thread is not
            penv.backend.interrupt()
        if not lock.acquire(timeout=wait_s):
            return
    try:
        penv._close()
    finally:
        lock.release()


def close_unless_held(penv: Any, wait_s: float = EXIT_LOCK_WAIT_S) -> None:
    """``penv._close()`` with the lock if it can be had within ``wait_s``, without it else (at exit:
    a thread still in a call must not keep the workers alive)."""
    acquired = penv._lock.acquire(timeout=wait_s)
    try:
        penv._close()
    finally:
        if acquired:
            penv._lock.release()


# ParallelEnvs (and pools) not closed when the interpreter exits: closed while their backends can still
# shut down cleanly (workers joined, shared memory unlinked).
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
