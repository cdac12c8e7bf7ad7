"""One wake-up of the parent per whole-batch step: the last worker to answer wakes it.

A parent that sleeps on every worker's pipe is woken by the first reply, goes
back to sleep, and is woken again by the next one. With a worker per core,
each of those wake-ups lands on a core an env is using, and on a virtual
machine a wake-up is tens of microseconds of the waker's time: measured here,
the worker sharing a core with the parent took ~120 us longer per CartPole
step of its 32 envs than the other one. For ``step()`` of every env (the
common case; the step says so, see ``Step.awaited``) with a worker per core
(see ``SubprocBackend`` for why not with more workers), the workers count down
instead, and only the one that takes the count to zero writes a byte to the
pipe the parent sleeps on.

The count is a pipe of tokens, one per worker: a read of one byte from a pipe
takes it whole, so each worker takes its own, and the worker that takes the
last one (a zero byte) knows it is the last. It wakes the parent, then lays out
the next step's tokens, off the path of this step's answer: no worker needs
them before the parent, once woken, has sent the next step, and one that asks
before they are there waits in its read. (Should the last worker die in
between, the parent sees the death; steps are not counted where workers are
restarted.)
A pipe, unlike a shared counter under a lock, has no name: the lock of
``multiprocessing.Value`` is a named POSIX semaphore, which stayed in
``/dev/shm`` when the whole process group was killed (its resource tracker dies
with the group). A pipe goes with the last process holding it, however it ends.

A worker whose envs returned no info has nothing to say beyond what is in
shared memory, so it records a *quiet* answer beside its token and writes
nothing to its pipe: the parent then reads no pipe at all for most steps. A
worker with something to say records that it answers on its pipe, before it
writes there, so that by the time the parent has read every such reply, no
countdown is still to come. Each worker writes only its own answer's byte, and
before it takes its token: the pipe's order (the last token is read after every
other) makes every answer visible to the parent the last worker wakes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

# How a worker answered the step being counted down.
NOT_YET, QUIET, ON_PIPE = 0, 1, 2
# The token of the worker that is not the last, and of the one that is.
_MORE, _LAST = b"\x01", b"\x00"


class Countdown:
    """The parent's end: :meth:`arm` the answers, sleep on :meth:`fileno`, read them."""

    def __init__(self, ctx: Any, num_workers: int) -> None:
        self._answers = ctx.RawArray("b", num_workers)  # an anonymous mapping: nothing named
        self._answer_of = np.frombuffer(self._answers, dtype=np.int8)
        self._all_quiet = bytes([QUIET]) * num_workers
        self._wake_reader, self._wake_writer = ctx.Pipe(duplex=False)
        self._token_reader, self._token_writer = ctx.Pipe(duplex=False)
        self._tokens = _MORE * (num_workers - 1) + _LAST
        # The first step's tokens; each later step's are laid out by the last worker of the one before.
        os.write(self._token_writer.fileno(), self._tokens)

    def arm(self) -> None:
        """Expect an answer from every worker; only call it while no worker is counting down."""
        self._answer_of[:] = NOT_YET

    def fileno(self) -> int:
        return self._wake_reader.fileno()

    def complete(self) -> bool:
        """Consume the wake-up bytes there are; True when every worker has answered.

        A byte may be left over from a step whose answers were all taken
        without it (its wait timed out just before the last one came), so the
        answers, not the byte, say whether this step is complete.
        """
        os.read(self.fileno(), 4096)
        return NOT_YET not in bytes(self._answers)

    def all_quiet(self) -> bool:
        """Whether every worker has answered, and quietly (the common step: one comparison of bytes)."""
        return bytes(self._answers) == self._all_quiet

    def answered_quietly(self, worker_index: int) -> bool:
        return bool(self._answer_of[worker_index] == QUIET)

    def for_worker(self, worker_index: int) -> WorkerCountdown:
        """What a worker needs to count down, passed to it when it starts."""
        return WorkerCountdown(self._answers, worker_index, self._token_reader, self._token_writer, self._tokens,
                               self._wake_writer)

    def close(self) -> None:
        for end in (self._wake_reader, self._wake_writer, self._token_reader, self._token_writer):
            end.close()


class WorkerCountdown:
    """A worker's end: :meth:`arrive` once its results are in shared memory, :meth:`wake` if it was the last."""

    def __init__(self, answers: Any, worker_index: int, token_reader: Any, token_writer: Any, tokens: bytes,
                 wake_writer: Any) -> None:
        self._answers = answers
        self._index = worker_index
        self._token_reader = token_reader
        self._token_writer = token_writer
        self._tokens = tokens
        self._wake_writer = wake_writer

    def arrive(self, quiet: bool) -> bool:
        """Count this worker's answer (``quiet``: none follows on the pipe); True when it is the last."""
        self._answers[self._index] = QUIET if quiet else ON_PIPE
        return os.read(self._token_reader.fileno(), 1) == _LAST

    def wake(self) -> None:
        """Wake the parent, then lay out the next step's tokens (off the path of this step's answer)."""
        os.write(self._wake_writer.fileno(), b"w")
        os.write(self._token_writer.fileno(), self._tokens)
