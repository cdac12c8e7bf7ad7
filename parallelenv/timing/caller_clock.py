"""The caller's side of ``ParallelEnv(stats=True)``: its time in ``step``, ``send`` and ``recv``, in parts.

Where stats are on, the clock puts timed versions of the backend's
``dispatch`` and ``collect`` and of the call tracker's ``step``, ``send``
and ``recv`` on those objects themselves, and the front's serialised
calls report their whole time (:func:`parallelenv.serialised.one_caller_at_a_time`).
Where they are off none of this exists: nothing is measured. The parts of
a batch step (one ``step``, or one ``recv`` with the ``send`` before it):

- ``wait``: in the backend's collect, waiting for the slowest env and
  reading the replies (for a backend that runs the envs in the caller,
  such as ``dummy``: running them);
- ``send``: in the backend's dispatch (writing actions and messages);
- ``merge``: the call tracker's own work: absorbing replies, infos,
  policies, handing results over;
- ``own``: the front's: checking actions, shaping results, conversions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from parallelenv.backends.base import RunsInCaller

TIMED_CALLS = ("step", "send", "recv")  # step and recv each hand over one batch of results


@dataclass
class CallerReading:
    """The clock's totals, in seconds, since it started: a window is the difference of two."""

    batches: int = 0
    wall: float = 0.0
    tracked: float = 0.0  # in the call tracker's step, send and recv
    send: float = 0.0
    wait: float = 0.0

    def since(self, earlier: CallerReading | None) -> CallerReading:
        if earlier is None:
            return CallerReading(**vars(self))
        return CallerReading(*(now - then for now, then in zip(vars(self).values(), vars(earlier).values(),
                                                               strict=True)))


class CallerClock:
    """Totals of the caller's parts (see the module's docstring)."""

    def __init__(self, backend: Any, calls: Any) -> None:
        self.totals = CallerReading()
        self.after_step: Callable[[], None] | None = None  # the live line's
        self._inside = False
        totals, in_caller, clock = self.totals, isinstance(backend, RunsInCaller), self
        dispatch, collect = backend.dispatch, backend.collect

        # Only within a step, send or recv: a reset's or an attribute's calls are no batch step's.
        def timed_dispatch(call: Any) -> None:
            if not clock._inside:
                return dispatch(call)
            began = perf_counter()
            try:
                dispatch(call)
            finally:
                if in_caller:  # the envs ran in it
                    totals.wait += perf_counter() - began
                else:
                    totals.send += perf_counter() - began

        def timed_collect(timeout: float | None, wanted: int | None = None) -> list[Any]:
            if not clock._inside:
                return collect(timeout, wanted)
            began = perf_counter()
            try:
                return collect(timeout, wanted)
            finally:
                totals.wait += perf_counter() - began

        backend.dispatch, backend.collect = timed_dispatch, timed_collect
        for name in TIMED_CALLS:
            setattr(calls, name, self._tracked(getattr(calls, name)))

    def _tracked(self, method: Callable[..., Any]) -> Callable[..., Any]:
        totals, clock = self.totals, self

        def tracked(*args: Any, **kwargs: Any) -> Any:
            if clock._inside:  # the tracker's step sends through its own send: counted once, outermost
                return method(*args, **kwargs)
            clock._inside = True
            began = perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                totals.tracked += perf_counter() - began
                clock._inside = False

        return tracked

    def front_call(self, name: str, seconds: float) -> None:
        """A serialised call of the front, one of TIMED_CALLS, returned after ``seconds``."""
        totals = self.totals
        totals.wall += seconds
        if name != "send":  # step and recv each hand over a batch
            totals.batches += 1
            if self.after_step is not None and name == "step":
                self.after_step()

    def read(self) -> CallerReading:
        return CallerReading(**vars(self.totals))
