"""One wake-up of the parent per whole-batch step: the last worker to answer wakes it.

A parent that sleeps on every worker's pipe is woken by the first reply, goes
back to sleep, and is woken again by the next one. With a worker per core,
each of those wake-ups lands on a core an env is using, and on a virtual
machine a wake-up is tens of microseconds of the waker's time: measured here,
the worker sharing a core with the parent took ~120 us longer per CartPole
step of its 32 envs than the other one. For a step of every env (``step()``
with no ids, the common case) with a worker per core (see ``SubprocBackend``
for why not with more workers), the workers count down on a shared counter
instead, and only the one that takes it to zero writes a byte to the pipe the
parent sleeps on. Its own reply and the others' are on their pipes by then,
or about to be: a worker counts down before it answers, so that by the time
the parent has read every reply, no countdown is still to come.
"""

from __future__ import annotations

import os
from typing import Any


class Countdown:
    """The parent's end: arm the counter, sleep on :meth:`fileno`, :meth:`drain` the wake-up."""

    def __init__(self, ctx: Any) -> None:
        # A shared int with its own lock (a POSIX semaphore): workers decrement it under the lock.
        self._remaining = ctx.Value("i", 0)
        self._wake_reader, self._wake_writer = ctx.Pipe(duplex=False)

    def arm(self, num_workers: int) -> None:
        """Expect ``num_workers`` answers; only call it while no worker is counting down."""
        self._remaining.value = num_workers

    def fileno(self) -> int:
        return self._wake_reader.fileno()

    def drain(self) -> None:
        """Consume the wake-up bytes there are (at least one: call it when the pipe is readable)."""
        os.read(self.fileno(), 4096)

    def for_worker(self) -> WorkerCountdown:
        """What a worker needs to count down, passed to it when it starts."""
        return WorkerCountdown(self._remaining, self._wake_writer)

    def close(self) -> None:
        self._wake_reader.close()
        self._wake_writer.close()


class WorkerCountdown:
    """A worker's end: :meth:`arrive` before answering, :meth:`wake` after, if it was the last."""

    def __init__(self, remaining: Any, wake_writer: Any) -> None:
        self._remaining = remaining
        self._wake_writer = wake_writer

    def arrive(self) -> bool:
        """Count this worker's answer; True when it is the last one the parent waits for."""
        with self._remaining.get_lock():
            self._remaining.value -= 1
            return self._remaining.value == 0

    def wake(self) -> None:
        os.write(self._wake_writer.fileno(), b"w")
