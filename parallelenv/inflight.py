"""Where each env's call stands: the state machine between the front object and a backend.

Every env is IDLE, PENDING (a call was dispatched, no reply yet) or READY (a
step result arrived and waits to be received). :class:`InFlight` dispatches
calls, absorbs the backend's replies, keeps the policy's ``finished`` mask,
and is the one place that waits: always with a deadline, and always ready
to declare a worker hung after ``call_timeout``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parallelenv.backends.base import Backend
from parallelenv.calls import Call, Failure, Reply, Step
from parallelenv.errors import AlreadyPendingError, WorkerDiedError, WorkerTimeoutError
from parallelenv.policies import Policy


class EnvState(enum.IntEnum):
    IDLE = 0  # nothing outstanding
    PENDING = 1  # a call was sent, no answer yet
    READY = 2  # a step's result arrived and waits for recv


# Plain ints for the hot path: comparing an int8 array with an IntEnum member
# goes through enum's attribute machinery on every call.
IDLE, PENDING, READY = int(EnvState.IDLE), int(EnvState.PENDING), int(EnvState.READY)


class InFlight:
    """The calls in flight on a backend's envs, and what their replies said."""

    def __init__(self, backend: Backend, policy: Policy, call_timeout: float | None) -> None:
        n = backend.num_envs
        self.backend = backend
        self.policy = policy
        self.call_timeout = call_timeout
        self.all_ids = np.arange(n)
        self._all_ids_tuple = tuple(range(n))
        self.state = np.zeros(n, dtype=np.int8)
        self.finished = np.zeros(n, dtype=bool)  # the policy's: these envs get None results
        self.none_result = np.zeros(n, dtype=bool)  # READY with a None result, never stepped
        self.infos: dict[int, dict[str, Any]] = {}  # non-empty infos of READY envs
        self.call_values: dict[int, Any] = {}  # answers to the synchronous call under way
        self.failures: list[Failure] = []
        self.num_pending = 0  # kept so the hot path need not count the state array
        self.num_ready = 0
        self.broken: WorkerDiedError | None = None
        self._sent_at = np.zeros(n)
        # No later than the oldest pending call's dispatch: replies only make the
        # true value later, so it is recomputed only once a hang seems due.
        self._oldest_sent = 0.0
        self._send_order = np.zeros(n, dtype=np.int64)
        self._next_order = 0

    def rows(self, ids: np.ndarray) -> slice | np.ndarray:
        """Index per-env arrays with a slice when ``ids`` is every env in order: cheaper."""
        return slice(None) if ids is self.all_ids else ids

    def require_idle(self, ids: np.ndarray, doing: str) -> None:
        if self.num_pending == 0 and self.num_ready == 0:
            return
        busy = ids[self.state[ids] != IDLE]
        if busy.size:
            raise AlreadyPendingError(
                f"{doing} envs {busy.tolist()} whose previous call has not been received: recv() first"
            )

    def answered(self, ids: np.ndarray) -> Callable[[], bool]:
        """The condition "no env of ``ids`` is still pending"."""
        if ids is self.all_ids:
            return lambda: self.num_pending == 0
        return lambda: not (self.state[ids] == PENDING).any()

    def number_sends(self, ids: np.ndarray) -> None:
        """Remember the order of sends: recv returns results in it."""
        self._send_order[self.rows(ids)] = self._next_order + self.all_ids[: len(ids)]
        self._next_order += len(ids)

    def set_none_results(self, ids: np.ndarray) -> None:
        """These envs answer at once with None results, without being called."""
        self.state[ids] = READY
        self.none_result[ids] = True
        self.num_ready += len(ids)

    def dispatch(self, call: Call, ids: np.ndarray) -> None:
        rows = self.rows(ids)
        now = time.monotonic()
        self.state[rows] = PENDING
        self._sent_at[rows] = now
        if self.num_pending == 0:
            self._oldest_sent = now
        self.num_pending += len(ids)
        try:
            self.backend.dispatch(call)
        except WorkerDiedError as died:
            self.broken = died
            raise
        except Exception:
            # A call the backend refused (its data cannot travel) reached no env:
            # the protocol has a backend check everything before it sends anything.
            self.state[rows] = IDLE
            self.num_pending -= len(ids)
            raise

    def wait(
        self, satisfied: Callable[[], bool], deadline: float | None, drain: bool, wanted: int | None = None
    ) -> None:
        """Absorb replies until ``satisfied()``, the deadline, or no call left pending.

        Without ``drain`` a failure also ends the wait (recv raises it at once;
        the replies still in flight stay pending for the next recv). With it,
        the wait goes on until ``satisfied()``, so that a call that raises
        leaves none of its own replies in flight to be mistaken later for
        the answer to another call. ``wanted`` is how many envs' answers
        ``satisfied`` needs (None: every pending one), so that the backend may
        wait for them together.
        """
        while not satisfied() and (drain or not self.failures):
            if self.num_pending == 0:
                return
            try:
                replies = self._block_for_replies(deadline, wanted)
            except WorkerDiedError as died:
                self.broken = died
                raise
            if replies is None:  # the caller's deadline passed
                return
            for reply in replies:
                self._absorb(reply)

    def _block_for_replies(self, deadline: float | None, wanted: int | None) -> list[Reply] | None:
        """Wait for replies up to ``deadline``; kill whatever has hung past ``call_timeout``."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None
        hang_at = self._hang_at(now)
        until = min((t for t in (deadline, hang_at) if t is not None), default=None)
        replies = self.backend.collect(None if until is None else max(0.0, until - now), wanted)
        if not replies and hang_at is not None:
            now = time.monotonic()
            if now >= hang_at and self._hang_at(now) <= now:  # type: ignore[operator]
                self._kill_hung(now)
        return replies

    def _hang_at(self, now: float) -> float | None:
        """When the oldest pending call will have hung; exact whenever that time has come."""
        if self.call_timeout is None:
            return None
        if self._oldest_sent + self.call_timeout <= now:
            self._oldest_sent = float(self._sent_at[self.state == PENDING].min())
        return self._oldest_sent + self.call_timeout

    def run(self, call: Call, ids: np.ndarray) -> tuple[dict[int, Any], list[Failure]]:
        """Run a non-step call on ``ids`` to completion: each env's answer, and the failures of those that raised."""
        self.require_idle(ids, f"call {type(call).__name__} on")
        self.call_values = {}
        self.dispatch(call, ids)
        self.wait(self.answered(ids), None, drain=True, wanted=len(ids))
        values, self.call_values = self.call_values, {}
        return values, self.take_failures()

    def mark_reset(self, ids: np.ndarray) -> None:
        """These envs were reset: the policy counts them as live again."""
        self.finished[ids] = False

    def take_failures(self) -> list[Failure]:
        """The failures absorbed since the last call, oldest first; they are forgotten here."""
        failures, self.failures = self.failures, []
        return failures

    def ready_in_send_order(self) -> np.ndarray:
        ready = np.flatnonzero(self.state == READY)
        return ready[np.argsort(self._send_order[ready], kind="stable")]

    def receive(self, ids: np.ndarray) -> tuple[dict[int, dict[str, Any]], np.ndarray]:
        """Hand over the READY ``ids``: their non-empty infos and None-result mask; they become IDLE."""
        rows = self.rows(ids)
        none_result = self.none_result[rows].copy()
        if ids is self.all_ids:
            infos, self.infos = self.infos, {}
            self.num_ready = 0
        else:
            infos = {i: self.infos.pop(i) for i in ids.tolist() if i in self.infos} if self.infos else {}
            self.num_ready -= int((self.state[rows] == READY).sum())
        self.state[rows] = IDLE
        self.none_result[rows] = False
        return infos, none_result

    def _index(self, env_ids: tuple[int, ...]) -> slice | np.ndarray:
        """Index per-env arrays by a reply's (distinct) env ids: a slice when they form a range,
        as the whole group of a worker does, since slicing costs far less than fancy indexing."""
        if env_ids == self._all_ids_tuple:
            return slice(None)
        first, size = min(env_ids), len(env_ids)
        if max(env_ids) - first == size - 1:
            return slice(first, first + size)
        return np.array(env_ids, dtype=np.int64)

    def _kill_hung(self, now: float) -> None:
        assert self.call_timeout is not None
        overdue = np.flatnonzero((self.state == PENDING) & (self._sent_at + self.call_timeout <= now)).tolist()
        lost = self.backend.kill(overdue) or overdue
        raise WorkerTimeoutError(
            lost, f"envs {overdue} did not answer within call_timeout={self.call_timeout} s; their worker was killed"
        )

    def _absorb(self, reply: Reply) -> None:
        env_ids = reply.env_ids
        rows = ids = self._index(env_ids)
        self.num_pending -= len(env_ids)
        if reply.failures:
            self.failures.extend(reply.failures)
        if reply.call_type is Step:
            # Envs whose step raised are READY too: the front hands out the
            # others' results and drops theirs when it raises the failure.
            self.state[rows] = READY
            self.num_ready += len(env_ids)
            self.infos.update(reply.values)
            if self.policy.tracks_finished:
                buffers = self.backend.buffers
                done = buffers.terminated[rows] | buffers.truncated[rows]
                if reply.failures:  # their rows hold no result of this step
                    done[[env_ids.index(i) for i in reply.failed_ids()]] = False
                self.policy.after_step(self.finished, ids, done)
        else:
            self.state[rows] = IDLE
            self.call_values.update(reply.values)
