"""One caller at a time on a ParallelEnv, whatever the number of threads.

Interleaved, two threads would take each other's replies: one could get the
other's rewards, or both wait for a reply the other consumed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def one_caller_at_a_time(method: F) -> F:
    """Serialise a public call on ``self._lock``: a second thread waits until the first one's call has returned."""

    @functools.wraps(method)
    def serialised(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(F, serialised)
