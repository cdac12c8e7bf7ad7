"""One wake-up of the parent per whole-batch step: the last worker to answer wakes it.

A parent that sleeps on every worker's pipe is woken by the first reply, goes
back to sleep, and is woken again by the next one. With a worker per core,
each of those wake-ups lands on a core an env is using, and on a virtual
machine a wake-up is tens of microseconds of the waker's time: measured here,
the worker sharing a core with the parent took ~120 us longer per CartPole
step of its 32 envs than the other one. For ``step()`` of every env (the
common case; the step says so, see ``Step.awaited``) with a worker per core
(see ``SubprocBackend`` for why not with more workers), the workers count down on a shared counter instead, and only
the one that takes it to zero writes a byte to the pipe the parent sleeps on.

A worker whose envs returned no info has nothing to say beyond what is in
shared memory, so it records a *quiet* answer next to the counter and writes
nothing to its pipe: the parent then reads no pipe at all for most steps. A
worker with something to say records that it answers on its pipe, before it
writes there, so that by the time the parent has read every such reply, no
countdown is still to come.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

# How a worker answered the step being counted down.
NOT_YET, QUIET, ON_PIPE = 0, 1, 2


class Countdown:
    """The parent's end: :meth:`arm` the counter, sleep on :meth:`fileno`, read the answers."""

    def __init__(self, ctx: Any, num_workers: int) -> None:
        # A shared int with its own lock (a POSIX semaphore): workers decrement it under the lock.
        self._remaining = ctx.Value("i", 0)
        # The parent needs no lock: it sets the counter while no worker counts
        # down, and reads it once the last one has, or to learn it has not.
        self._counter = self._remaining.get_obj()
        self._answers = ctx.RawArray("b", num_workers)
        self._answer_of = np.frombuffer(self._answers, dtype=np.int8)
        self._all_quiet = bytes([QUIET]) * num_workers
        self._wake_reader, self._wake_writer = ctx.Pipe(duplex=False)

    def arm(self) -> None:
        """Expect an answer from every worker; only call it while no worker is counting down."""
        self._answer_of[:] = NOT_YET
        self._counter.value = len(self._answer_of)

    def fileno(self) -> int:
        return self._wake_reader.fileno()

    def complete(self) -> bool:
        """Consume the wake-up bytes there are; True when every worker has answered.

        A byte may be left over from a step whose answers were all taken
        without it (its wait timed out just before the last one came), so the
        counter, not the byte, says whether this step is complete.
        """
        os.read(self.fileno(), 4096)
        return self._counter.value == 0

    def all_quiet(self) -> bool:
        """Whether every worker has answered, and quietly (the common step: one comparison of bytes)."""
        return bytes(self._answers) == self._all_quiet

    def answered_quietly(self, worker_index: int) -> bool:
        return bool(self._answer_of[worker_index] == QUIET)

    def for_worker(self, worker_index: int) -> WorkerCountdown:
        """What a worker needs to count down, passed to it when it starts."""
        return WorkerCountdown(self._remaining, self._answers, worker_index, self._wake_writer)

    def close(self) -> None:
        self._wake_reader.close()
        self._wake_writer.close()
        # The counter's lock is a named POSIX semaphore, unlinked once the lock
        # is collected (or by the resource tracker at exit): drop it now. Ray
        # kills an actor after close(), and the actor's resource tracker with
        # it, which left the name in /dev/shm for every ray-subproc ParallelEnv.
        self._remaining = self._counter = None


class WorkerCountdown:
    """A worker's end: :meth:`arrive` once its results are in shared memory, :meth:`wake` if it was the last."""

    def __init__(self, remaining: Any, answers: Any, worker_index: int, wake_writer: Any) -> None:
        self._remaining = remaining
        self._answers = answers
        self._index = worker_index
        self._wake_writer = wake_writer

    def arrive(self, quiet: bool) -> bool:
        """Count this worker's answer (``quiet``: none follows on the pipe); True when it is the last."""
        with self._remaining.get_lock():
            self._answers[self._index] = QUIET if quiet else ON_PIPE
            counter = self._remaining.get_obj()
            counter.value -= 1
            return counter.value == 0

    def wake(self) -> None:
        os.write(self._wake_writer.fileno(), b"w")
