"""One caller at a time on a ParallelEnv, whatever the number of threads.

Interleaved, two threads would take each other's replies: one could get the
other's rewards, or both wait for a reply the other consumed. The one
exception is ``close()``, which ends the call another thread has under way
(``self._interrupted``): that call then raises ClosedError in its thread,
which closes the ParallelEnv on its way out, since it owns the lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from parallelenv.errors import ClosedError

F = TypeVar("F", bound=Callable[..., Any])


def one_caller_at_a_time(method: F) -> F:
    """Serialise a public call on ``self._lock``: a second thread waits until the first one's call has returned."""

    @functools.wraps(method)
    def serialised(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                if not self._interrupted or isinstance(exc, ClosedError):
                    raise
                raise ClosedError(
                    f"close() from another thread ended this call ({type(exc).__name__}: {exc})"
                ) from exc
            finally:
                if self._interrupted:
                    self._close()

    return cast(F, serialised)
