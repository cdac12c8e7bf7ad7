"""The parent's side of counted steps: one announcement to every worker, one wake-up back.

A counted step (see :mod:`~parallelenv.backends.subproc.countdown`) costs
the parent a constant whatever the number of workers: the actions are in
shared memory, one futex call wakes every worker, and the parent sleeps on
the countdown beside the workers' sentinels, then reads the answers from
shared memory. Nothing per worker is touched unless a worker has something
to say (an info, a failure: it answers on its pipe too) or dies.

A worker that dies in a counted step leaves the count short. Its sentinel
ends the parent's wait; the death is reported with the answers taken so far
(``WorkerDiedError.replies_before_death``), and the step stays under way for
the live workers: the parent then waits for their *finished* marks instead of
the wake-up, takes their answers as they come, and lays out fresh tokens
before the next step. A worker restarted meanwhile takes no part in it.

This transport owns the step under way and what a lost worker does to it; it
never calls the backend: what the backend must act on (a pipe that broke, a
worker found dead, a worker that answers on its pipe) is what its calls return.
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import TYPE_CHECKING, Any

from parallelenv.backends.subproc import futex, wire
from parallelenv.backends.subproc.countdown import ON_PIPE, QUIET, Countdown
from parallelenv.calls import Reply, Step

if TYPE_CHECKING:
    from parallelenv.backends.subproc.workers import Worker

# How often the parent looks at the finished marks while a death leaves it without the last worker's wake-up.
_DYING_POLL_MS = 1


class CountedSteps:
    """The counted step under way on ``workers``, if any: sent by :meth:`dispatch`, read by :meth:`wait` and
    :meth:`answers`."""

    def __init__(self, workers: list[Worker], countdown: Countdown, all_ids: tuple[int, ...]) -> None:
        self._all_ids = all_ids
        self._workers = workers  # the backend's list: a restarted worker takes its predecessor's place
        self.countdown = countdown
        self.in_flight = False
        self._num_dead = 0  # workers dead and not replaced
        self._slot_of_all: int | None = None  # the obs slot of every worker since the last counted step
        self._by_sentinel: dict[int, Worker] = {}
        # Once a step is taken in parts (some worker talks, or died): the workers whose answer is not yet taken.
        self._untaken: set[int] | None = None
        self._dying: set[int] | None = None  # the workers that died in the step under way
        # What a counted step sleeps on: the countdown's wake-up, or a worker dying. An epoll set costs
        # a wait the same whatever the number of sentinels in it (a poll costs more for each).
        self._poll = select.epoll()
        self._poll.register(countdown.fileno(), select.EPOLLIN)
        self._framed = wire.framed_counted_group_steps()
        # The workers whose last call came on their pipe and was not a counted step: they wait on their
        # pipes, not on the countdown's words (see worker._serve), so a step announced to all is written
        # to their pipes too.
        self._waiting_on_pipes: set[int] = set()

    def watch(self, worker: Worker) -> None:
        self._poll.register(worker.process.sentinel, select.EPOLLIN)
        self._by_sentinel[worker.process.sentinel] = worker

    def lost(self, worker: Worker) -> None:
        """``worker`` died: stop watching it; if it had a part in the step under way, that part is lost."""
        self._poll.unregister(worker.process.sentinel)
        self._waiting_on_pipes.discard(worker.index)  # a worker started in its place waits on the words
        self._num_dead += 1
        # It may leave its token of a step under way unread.
        self.countdown.tokens_unsure = True
        if self.in_flight:
            if self._dying is None:
                self._dying = set()
            self._dying.add(worker.index)
            # A leader of the wake-up tree may have died before waking the workers after it.
            self.countdown.ring()

    def replaced(self, worker: Worker) -> None:
        """``worker`` takes a dead one's place (in the workers' list): it waits on the countdown's words."""
        self._num_dead -= 1
        self.watch(worker)

    def begin(self) -> None:
        """A counted step is under way, its messages sent by the caller (they carry more than the step)."""
        self.countdown.arm()
        self.in_flight, self._untaken, self._dying = True, None, None

    def dispatch(self, obs_slot: int) -> list[Worker]:
        """Step every worker's group into ``obs_slot``, the actions being in shared memory; the workers
        whose pipe broke as the step was written there (each is lost, the others step)."""
        if self._num_dead:
            for worker in self._workers:
                if worker.death is not None:
                    raise worker.death
        self._slot_of_all = obs_slot
        self.in_flight, self._untaken, self._dying = True, None, None
        if self.countdown.broadcasts:
            self.countdown.start_step(obs_slot)
            on_pipes = [self._workers[index] for index in self._waiting_on_pipes]
        else:
            self.countdown.arm()
            on_pipes = self._workers
        self._waiting_on_pipes.clear()
        # Where no futex reaches a worker, the same few bytes to its pipe, framed as Connection.recv_bytes reads them.
        framed = self._framed[obs_slot]
        broken = []
        for worker in on_pipes:
            try:
                if os.write(worker.fd, framed) != len(framed):  # a few bytes: a short write means a broken pipe
                    raise BrokenPipeError(f"a short write to worker {worker.pid}'s pipe")
            except OSError:
                broken.append(worker)
        return broken

    def sending_on_pipes(self, workers: list[Worker], counted: bool) -> list[Worker]:
        """``workers`` are about to be sent a call on their pipes: those of them asleep on the countdown's
        words, which need its ring to read their pipes. After it, a call that is not a counted step leaves
        a worker waiting on its pipe."""
        waiting = self._waiting_on_pipes
        on_words = [worker for worker in workers if worker.index not in waiting]
        indices = [worker.index for worker in workers]
        if counted:
            waiting.difference_update(indices)
        else:
            waiting.update(indices)
        return on_words

    def waits_on_pipe(self, worker: Worker) -> bool:
        return worker.index in self._waiting_on_pipes

    def wait(self, timeout: float | None, dead: list[Worker]) -> bool:
        """Sleep until the last worker of the step wakes us (True), ``timeout`` passes, or workers die
        (False; they join ``dead``). After a death, True once every live worker has finished."""
        countdown = self.countdown
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._dying is not None and countdown.finished(self._live()):
                return True
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait_ms = None if remaining is None else math.ceil(remaining * 1000)
            if self._dying is not None:
                wait_ms = _DYING_POLL_MS if wait_ms is None else min(wait_ms, _DYING_POLL_MS)
            events = self._poll.poll(-1 if wait_ms is None else wait_ms / 1000)
            for fd, _ in events:
                if fd != countdown.fileno():
                    dead.append(self._by_sentinel[fd])
            if dead:
                return False
            if events and countdown.complete() and self._dying is None:
                return True
            if self._dying is None and not events:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _live(self) -> list[int]:
        dying = self._dying or ()
        return [index for index in range(self.countdown.num_workers) if index not in dying]

    def answers(self, complete: bool, talking: list[Worker]) -> list[Reply]:
        """The step's answers there are (``complete``: every live worker has answered); a worker that
        talks answers on its pipe instead, and joins ``talking``: its reply comes there before any other."""
        if self._untaken is None and self._dying is None and complete and self.countdown.all_quiet():
            # Every worker's part, quiet: one answer for the whole step, which the
            # tracker takes in one go.
            self.in_flight = False
            return [Reply(Step, self._all_ids, {})]
        if self._untaken is None:
            self._untaken = set(range(self.countdown.num_workers))
        answers: list[Reply] = []
        for index in sorted(self._untaken):
            worker = self._workers[index]
            if self._dying is not None and index in self._dying:
                self._untaken.discard(index)  # its envs are the death's: the tracker resumes them
                continue
            answer = self.countdown.answer_of(index)
            if answer == QUIET:
                answers.append(Reply(Step, worker.group_ids, {}))
            elif answer == ON_PIPE:
                talking.append(worker)
            else:
                continue
            self._untaken.discard(index)
        if complete:
            self.in_flight = False
            if self._dying is not None:
                self.countdown.tokens_unsure = True
        return answers

    def close(self) -> None:
        self._poll.close()

    def settle_slots(self) -> None:
        """Each worker's obs slot, where counted steps left them all in one."""
        if self._slot_of_all is not None:
            for worker in self._workers:
                worker.obs_slot = self._slot_of_all
            self._slot_of_all = None


def worker_bits(workers: Any, every: bool) -> int:
    """The futex bits that wake ``workers`` (see :func:`~parallelenv.backends.subproc.futex.bit_of`)."""
    if every:
        return futex.EVERY_WORKER
    bits = 0
    for worker in workers:
        bits |= futex.bit_of(worker.index)
    return bits
