"""One wake-up of every worker per whole-batch step, and one of the parent: the last worker to answer wakes it.

A parent that sleeps on every worker's pipe is woken by the first reply, goes
back to sleep, and is woken again by the next one. With a worker per core,
each of those wake-ups lands on a core an env is using, and on a virtual
machine a wake-up costs the waker dearly: the worker sharing a core with the
parent fell behind the other (the performance page has the figures). For ``step()`` of every env (the
common case; the step says so, see ``Step.awaited``) the workers count down
instead, and only the one that takes the count to zero writes a byte to the
pipe the parent sleeps on.

The step itself reaches the workers the same way, once: the parent bumps a
shared *step* word (the actions are in shared memory already) and a *call*
word every worker sleeps on, and wakes them all in one futex call (see
:mod:`~parallelenv.backends.subproc.futex`). A message on a worker's pipe
is followed by a bump of the call word and a wake-up of that worker's bit, so
a worker sleeps in one place whatever comes. Without futexes the parent
writes the counted step to each pipe instead.

The count is a pipe of tokens, one per worker, laid out by the parent as it
arms each step: a read of one byte from a pipe takes it whole, so each worker
takes its own, and the worker that takes the last one (a zero byte) knows it
is the last, and wakes the parent. The parent lays them, not that last worker
after its wake-up: a worker killed between the two (recycled, say) would
leave the next step without tokens. Each worker then marks the step
*finished* in a byte of its own: after a worker's death, which may leave a
token unread, the parent waits for the live workers' marks instead of the
wake-up, and empties the pipe before the next step's tokens
(see :mod:`~parallelenv.backends.subproc.counted`).
A pipe, unlike a shared counter under a lock, has no name: the lock of
``multiprocessing.Value`` is a named POSIX semaphore, which stayed in
``/dev/shm`` when the whole process group was killed (its resource tracker dies
with the group). A pipe goes with the last process holding it, however it ends;
so does the anonymous mapping the words live in.

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

import ctypes
import fcntl
import math
import os
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parallelenv.backends.subproc import futex

# How a worker answered the step being counted down.
NOT_YET, QUIET, ON_PIPE = 0, 1, 2
# The token of the worker that is not the last, and of the one that is.
_MORE, _LAST = b"\x01", b"\x00"
# The shared words: what workers sleep on, the broadcast step's number, its obs slot, the counted step's
# number (a step sent on the pipes is counted too); then two bytes a worker.
_CALL, _STEP, _SLOT, _COUNT = 0, 1, 2, 3
_HEADER = 16
_WRAP = 0x7FFFFFFF
# Up to this many workers the parent wakes each itself; beyond, in a tree: it wakes about the square root
# of them (the leaders, which wait with the top bit too), and each leader wakes the ones after it. A
# futex call costs its caller in proportion to the processes it wakes.
_DIRECT = 8
_LEADERS = 1 << 31
# How long a sleeping worker waits before it looks at its pipe anyway (the lifeline notices a dead parent first).
_NAP_S = 1.0


def _views(raw: Any, num_workers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared words, answers and finished marks of the mapping ``raw``."""
    return (np.frombuffer(raw, np.int32, 4), np.frombuffer(raw, np.int8, num_workers, _HEADER),
            np.frombuffer(raw, np.uint8, num_workers, _HEADER + num_workers))


class Countdown:
    """The parent's end: :meth:`start_step` (or :meth:`arm`), sleep on :meth:`fileno`, read the answers."""

    def __init__(self, ctx: Any, num_workers: int) -> None:
        self.num_workers = num_workers
        self._raw = ctx.RawArray("b", _HEADER + 2 * num_workers)  # an anonymous shared mapping: nothing named
        self._words, self._answer_of, self._finished = _views(self._raw, num_workers)
        self._answers = memoryview(self._answer_of)  # bytes() of it: one C copy to compare
        self._address = ctypes.addressof(self._raw)
        self.broadcasts = futex.AVAILABLE
        self._all_quiet = bytes([QUIET]) * num_workers
        self._wake_reader, self._wake_writer = ctx.Pipe(duplex=False)
        self._token_reader, self._token_writer = ctx.Pipe(duplex=False)
        self._tokens = _MORE * (num_workers - 1) + _LAST
        self.tokens_unsure = False  # a worker died: the pipe is emptied before the next step's tokens
        # Every step reads them: a Connection's fileno() is a Python call each time.
        self._wake_fd, self._token_out = self._wake_reader.fileno(), self._token_writer.fileno()

    def arm(self) -> None:
        """Expect an answer from every worker; only call it while no worker is counting down."""
        self._expect_answers()
        os.write(self._token_out, self._tokens)

    def _expect_answers(self) -> None:
        if self.tokens_unsure:
            self._empty_tokens()
        self._answer_of[:] = NOT_YET
        words = self._words
        words[_COUNT] = (int(words[_COUNT]) + 1) & _WRAP

    def start_step(self, obs_slot: int) -> None:
        """Arm, and tell every worker, in one wake-up, to step its group into ``obs_slot``."""
        self._expect_answers()
        words = self._words
        words[_SLOT] = obs_slot
        words[_STEP] = (int(words[_STEP]) + 1) & _WRAP
        words[_CALL] = (int(words[_CALL]) + 1) & _WRAP
        futex.wake(self._address, _LEADERS)
        # The tokens after the wake-up, which the workers wait for the sooner: a worker that is through its
        # step before they are laid waits on its read of the pipe for a moment.
        os.write(self._token_out, self._tokens)

    def ring(self, bits: int = futex.EVERY_WORKER) -> None:
        """Wake the workers of ``bits`` (see :func:`futex.bit_of`) to read their pipes."""
        if self.broadcasts:
            words = self._words
            words[_CALL] = (int(words[_CALL]) + 1) & _WRAP
            futex.wake(self._address, bits)

    def _empty_tokens(self) -> None:
        """Drop the token a dead worker left unread; every live worker has finished the step, so none
        reads the pipe meanwhile."""
        fd = self._token_reader.fileno()
        left = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        if left:
            os.read(fd, left)
        self.tokens_unsure = False

    def fileno(self) -> int:
        return self._wake_fd

    def complete(self) -> bool:
        """Consume the wake-up bytes there are; True when every worker has answered.

        A byte may be left over from a step whose answers were all taken
        without it (its wait timed out just before the last one came), so the
        answers, not the byte, say whether this step is complete.
        """
        os.read(self._wake_fd, 4096)
        return NOT_YET not in bytes(self._answers)

    def finished(self, worker_indices: list[int]) -> bool:
        """Whether these workers have done all they do for the step under way (tokens included)."""
        mark = int(self._words[_COUNT]) & 0xFF
        return all(self._finished[i] == mark for i in worker_indices)

    def all_quiet(self) -> bool:
        """Whether every worker has answered, and quietly (the common step: one comparison of bytes)."""
        return bytes(self._answers) == self._all_quiet

    def answer_of(self, worker_index: int) -> int:
        return int(self._answer_of[worker_index])

    def answered_quietly(self, worker_index: int) -> bool:
        return bool(self._answer_of[worker_index] == QUIET)

    def for_worker(self, worker_index: int) -> WorkerCountdown:
        """What a worker needs to count down, passed to it when it starts."""
        return WorkerCountdown(self._raw, self.num_workers, worker_index, self._token_reader, self._wake_writer,
                               self.broadcasts)

    def close(self) -> None:
        for end in (self._wake_reader, self._wake_writer, self._token_reader, self._token_writer):
            end.close()


class WorkerCountdown:
    """A worker's end: :meth:`attach` once, :meth:`wait` for the next call, :meth:`answer` a counted step."""

    def __init__(self, raw: Any, num_workers: int, worker_index: int, token_reader: Any, wake_writer: Any,
                 broadcasts: bool) -> None:
        self._raw = raw
        self._num_workers = num_workers
        self._index = worker_index
        self._token_reader = token_reader
        self._wake_writer = wake_writer
        self.broadcasts = broadcasts
        self._last_step = 0

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key in _SENT}

    def attach(self) -> None:
        """Start counting from the step now announced (a worker started in place of a dead one skips the one
        under way); called before the worker says it is ready, so that no later step passes unseen. Once."""
        if hasattr(self, "_words"):
            return
        self._words, self._answer_of, self._finished = _views(self._raw, self._num_workers)
        self._address = ctypes.addressof(self._raw)
        self._token_in, self._wake_out = self._token_reader.fileno(), self._wake_writer.fileno()
        group = 1 if self._num_workers <= _DIRECT else math.isqrt(self._num_workers - 1) + 1
        leads = self._index % group == 0
        self._bits = futex.bit_of(self._index) | (_LEADERS if leads else 0)
        self._followers = 0  # the bits of the workers this one wakes when a step is announced
        if leads and group > 1:
            for follower in range(self._index + 1, min(self._index + group, self._num_workers)):
                self._followers |= futex.bit_of(follower)
        self._last_step = int(self._words[_STEP])
        self.obs_slot = 0

    def wait(self, has_mail: Callable[[], bool], linger_s: float) -> bool:
        """Sleep until a call comes: True for a counted step of the worker's group (into :attr:`obs_slot`),
        False for a message on the pipe. ``linger_s``: how long to look before sleeping (see the worker)."""
        words = self._words
        while True:
            seen = int(words[_CALL])
            if has_mail():
                return False
            step = int(words[_STEP])
            if step != self._last_step:
                self._last_step = step
                self.obs_slot = int(words[_SLOT])
                if self._followers:
                    futex.wake(self._address, self._followers)
                return True
            if linger_s and _lingered(words, seen, linger_s):
                continue
            futex.wait(self._address, seen, self._bits, _NAP_S)

    def came_on_pipe(self) -> None:
        """A counted step came on the pipe, where this worker waited (see worker._serve): if it was
        announced to all, it is not to be taken again from the step word, and the workers this one wakes
        (waiting on the words) are woken now."""
        if self.broadcasts:
            self._last_step = int(self._words[_STEP])
            if self._followers:
                futex.wake(self._address, self._followers)

    def answer(self, quiet: bool) -> None:
        """Count this worker's answer (``quiet``: none follows on the pipe), wake the parent if it is the
        last, and mark the step finished."""
        if self.arrive(quiet):
            self.wake()
        self._finished[self._index] = self._words[_COUNT] & 0xFF

    def arrive(self, quiet: bool) -> bool:
        """Count this worker's answer (``quiet``: none follows on the pipe); True when it is the last."""
        self._answer_of[self._index] = QUIET if quiet else ON_PIPE
        return os.read(self._token_in, 1) == _LAST

    def wake(self) -> None:
        """Wake the parent."""
        os.write(self._wake_out, b"w")


_SENT = ("_raw", "_num_workers", "_index", "_token_reader", "_wake_writer", "broadcasts", "_last_step")


def _lingered(words: np.ndarray, seen: int, seconds: float) -> bool:
    """Look at the call word for up to ``seconds``, yielding the CPU between looks: True if it moved."""
    give_up = time.perf_counter() + seconds
    while time.perf_counter() < give_up:
        if words[_CALL] != seen:
            return True
        os.sched_yield()
    return False
