"""The pipe transport: calls written to each worker's pipe, replies read from it in the order they were sent.

A worker answers its calls in order, so the head of its queue of sent calls
is what its next reply is about. The parent sleeps in one ``poll`` on every
pipe and sentinel: it takes no core from the envs and learns at once when a
worker dies, which it tells the backend (the caller of :meth:`Pipes.collect`).
"""

from __future__ import annotations

import math
import select
from collections import deque
from typing import TYPE_CHECKING

from parallelenv.backends.subproc import wire
from parallelenv.calls import Reply

if TYPE_CHECKING:
    from parallelenv.backends.buffers import Buffers
    from parallelenv.backends.subproc.workers import Worker


class Pipes:
    """The calls under way on the workers' pipes."""

    def __init__(self) -> None:
        self._poll = select.poll()  # one for the backend's life: `connection.wait` makes a selector a call
        self._by_fd: dict[int, tuple[Worker, bool]] = {}
        # Per worker index, the env ids of each call sent and not yet answered, oldest first.
        self._sent: dict[int, deque[tuple[int, ...]]] = {}
        self.in_flight = 0  # calls sent and not yet answered, all workers together

    def watch(self, worker: Worker) -> None:
        for fd, is_sentinel in ((worker.fd, False), (worker.process.sentinel, True)):
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = (worker, is_sentinel)
        self._sent[worker.index] = deque()

    def send(self, worker: Worker, env_ids: tuple[int, ...], message: bytes) -> bool:
        """Write a call about ``env_ids``; False where the pipe broke (the worker is then lost)."""
        self._sent[worker.index].append(env_ids)
        self.in_flight += 1
        try:
            worker.conn.send_bytes(message)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            return False
        return True

    def expect(self, worker: Worker, env_ids: tuple[int, ...]) -> None:
        """A reply about ``env_ids`` comes on ``worker``'s pipe before those of the calls sent it since
        (a worker with something to say of a counted step answers there too)."""
        self._sent[worker.index].appendleft(env_ids)
        self.in_flight += 1

    def collect(self, timeout: float | None, buffers: Buffers, dead: list[Worker]) -> list[Reply]:
        """The replies that come within ``timeout``, each worker's in order; the workers found dead
        (a closed pipe, an ended process) join ``dead``, and their replies read before are kept."""
        replies: list[Reply] = []
        for fd, _ in self._poll.poll(None if timeout is None else math.ceil(timeout * 1000)):
            worker, is_sentinel = self._by_fd[fd]
            if worker.death is not None or worker in dead:
                continue  # its pipe and sentinel may both be in this poll's events
            if not is_sentinel:
                sent = self._sent[worker.index]
                try:
                    reply = wire.decode_reply(worker.conn.recv_bytes(), sent[0], buffers)
                except (EOFError, OSError):
                    pass
                else:
                    sent.popleft()
                    self.in_flight -= 1
                    replies.append(reply)
                    continue
            dead.append(worker)
        return replies

    def lost(self, worker: Worker) -> None:
        """``worker`` died: its pipe and sentinel are no longer watched, and its calls' answers never come."""
        for fd in (worker.fd, worker.process.sentinel):
            self._poll.unregister(fd)
            del self._by_fd[fd]
        self.in_flight -= len(self._sent.pop(worker.index))