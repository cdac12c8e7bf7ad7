"""Where each env's call stands, as :class:`~parallelenv.inflight.InFlight` tracks it."""

from __future__ import annotations

import enum


class EnvState(enum.IntEnum):
    IDLE = 0  # nothing outstanding
    PENDING = 1  # a call was sent, no answer yet
    READY = 2  # a step's result arrived and waits for recv


# Plain ints for the hot path: comparing an int8 array with an IntEnum member
# goes through enum's attribute machinery on every call.
IDLE, PENDING, READY = int(EnvState.IDLE), int(EnvState.PENDING), int(EnvState.READY)
