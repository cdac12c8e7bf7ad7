"""Where each env's call stands: the state machine between the front object and a backend.

Every env is IDLE, PENDING (a call was dispatched, no reply yet) or READY (a
step result arrived and waits to be received). :class:`InFlight` dispatches
calls, absorbs the backend's replies, keeps the policy's ``finished`` mask,
and is the one place that waits: always with a deadline, and always ready
to declare a worker hung after ``call_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays, Selection, array_kind
from parallelenv.arrays import concatenate
from parallelenv.backends.base import Backend, RunsInCaller
from parallelenv.batching import take
from parallelenv.calls import Call, Failure, Reply, Reset, Step
from parallelenv.env_states import IDLE, PENDING, READY, EnvState
from parallelenv.errors import AlreadyPendingError, WorkerDiedError, WorkerTimeoutError
from parallelenv.healing import Healing
from parallelenv.policies import Policy
from parallelenv.resuming import ResumesRebuiltEnvs

__all__ = ["EnvState", "InFlight", "Received"]



@dataclass
class Received:
    """What the tracker holds for the envs it hands over, besides the buffers' rows."""

    infos: dict[int, dict[str, Any]]  # per env, the non-empty infos
    batched_info: dict[str, Any] | None  # a vector info over the envs handed over, from batched hosts
    none_result: Any  # mask over them of None results (None: the policy gives none)
    # Under "restart", with Buffers.ended: mask over them of the envs reset because their episode
    # ended, and a row each with those episodes' last obs (zeros elsewhere); None when none ended.
    ended: np.ndarray | None = None
    ended_state: np.ndarray | None = None
    # A step of every env's observations, handed over by the buffers (Buffers.renewed_obs); None: in the buffers.
    obs: np.ndarray | None = None


class InFlight(ResumesRebuiltEnvs):
    """The calls in flight on a backend's envs, and what their replies said."""

    def __init__(
        self,
        backend: Backend,
        policy: Policy,
        call_timeout: float | None,
        healing: Healing | None = None,
        sources: list[Any] | None = None,
    ) -> None:
        n = self.num_envs = backend.num_envs
        self._start_resuming(healing, sources)
        self.backend = backend
        # A backend that runs each call in the caller's thread has nothing to wait for.
        self._answers_in_dispatch = isinstance(backend, RunsInCaller)
        self.policy = policy
        self.call_timeout = call_timeout
        self.arrays: NumpyArrays = array_kind(backend.buffers, backend.single_action_space)
        self._ended, self._ended_obs = backend.buffers.ended, backend.buffers.ended_obs
        self.everyone = Selection.of(np.arange(n), n)
        self._step_everyone = Step(self.everyone.env_ids)
        self._awaited_step_everyone = Step(self.everyone.env_ids, awaited=True)
        self.state = np.zeros(n, dtype=np.int8)
        # The policy's finished envs (they get None results), in the buffers' array kind.
        self.finished = self.arrays.bool_zeros(n)
        self.none_result = self.arrays.bool_zeros(n)  # READY with a None result, never stepped
        self.infos: dict[int, dict[str, Any]] = {}  # non-empty infos of READY envs
        self._batched_infos: list[tuple[tuple[int, ...], dict[str, Any]]] = []  # of READY envs, per reply
        self._call_values: dict[int, Any] = {}  # answers to the synchronous call under way
        self._call_info: dict[str, Any] | None = None
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
        # A call of every env with nothing else outstanding (a training loop's
        # steps) leaves the per-env arrays above unwritten: every env is then in
        # state ``_whole``, sent at ``_whole_sent_at``, in id order from
        # ``_whole_order``, so that a call costs no O(num_envs) bookkeeping.
        # ``_per_env()`` writes them out before anything reads them.
        self._whole: int | None = IDLE
        self._whole_sent_at = 0.0
        self._whole_order: int | None = None

    def select(self, ids: np.ndarray | None) -> Selection:
        """The selection of checked ``ids``; every env when None."""
        return self.everyone if ids is None else Selection.of(ids, self.num_envs)

    def require_idle(self, selection: Selection, doing: str) -> None:
        if self.num_pending == 0 and self.num_ready == 0:
            return
        self._per_env()
        ids = selection.ids
        busy = ids[self.state[ids] != IDLE]
        if busy.size:
            named = busy[:8].tolist()
            envs = f"envs {named}" if busy.size <= 8 else f"{busy.size} envs ({str(named)[:-1]}, ...])"
            raise AlreadyPendingError(f"{doing} {envs} whose previous call has not been received: recv() first")

    def answered(self, selection: Selection) -> Callable[[], bool]:
        """The condition "no env of ``selection`` is still pending"."""
        if selection.everyone:
            return lambda: self.num_pending == 0
        self._per_env()
        ids = selection.ids
        return lambda: not (self.state[ids] == PENDING).any()

    def send_step(self, selection: Selection, actions: Any, awaited: bool = False) -> None:
        """Step the envs of ``selection`` with the user's ``actions``, checked before anything is
        sent; the policy's finished envs answer at once with None results instead. ``awaited``:
        the caller waits for all of them before anything else (see Step.awaited)."""
        self.require_idle(selection, "send to")
        actions = self.arrays.actions(actions, selection.count)
        self._number_sends(selection)
        live = None
        rows = self.arrays.rows(selection)
        if self.policy.tracks_finished:
            live = self.policy.live(self.finished, rows)
            if self.arrays.reads_on_host:
                if not live.all():
                    self._set_none_results(selection.ids[~live])
                    actions = take(actions, live)
                    selection = selection.without(~live)
                    if not len(selection):
                        return
                    rows = self.arrays.rows(selection)
                live = None
            else:  # a device mask: the backend leaves out the envs it does not set
                self.none_result[rows] = ~live
        if self._owed:
            selection, actions = self._answer_owed(selection, actions)
            if not len(selection):
                return
            rows = self.arrays.rows(selection)
        self.arrays.put_actions(self.backend.buffers, rows, actions)
        everyone = selection.everyone and live is None
        step_everyone = self._awaited_step_everyone if awaited else self._step_everyone
        self._dispatch(step_everyone if everyone else Step(selection.env_ids, live, awaited), selection)

    def steps_at_once(self) -> bool:
        """Whether a step of every env can go through :meth:`step_at_once` now: under a policy that
        tracks finished envs, only while none is (it would answer with None results), read on the host."""
        return (self._answers_in_dispatch and self.num_pending == 0 and self.num_ready == 0
                and self.healing is None
                and (not self.policy.tracks_finished or (self.arrays.reads_on_host and not self.finished.any())))

    def step_at_once(self, actions: Any) -> Received | None:
        """Step every env on a backend that runs the step in the caller, with nothing else under way
        (:meth:`steps_at_once`), and hand its results over at once.

        The general path's state machine (each env sent, pending, ready,
        received) costs ~12 µs a step here and has nothing to track: the
        step is answered before dispatch returns. A reply with a failure is
        absorbed as the general path would have it, and None says so: the
        caller then waits and raises as after :meth:`send_step`.
        """
        everyone = self.everyone
        actions = self.arrays.actions(actions, everyone.count)
        self._number_sends(everyone)
        self.arrays.put_actions(self.backend.buffers, self.arrays.rows(everyone), actions)
        self.backend.dispatch(self._step_everyone)
        replies = self.backend.collect(0.0)
        if len(replies) == 1 and not replies[0].failures and replies[0].env_ids == everyone.env_ids:
            reply = replies[0]
            received = Received(reply.values, reply.info, None)
            self._add_ended(received, everyone)
            buffers = self.backend.buffers
            if self.policy.tracks_finished:  # none was finished before this step; some may be now
                self.policy.after_step(self.finished, everyone.rows, buffers.terminated | buffers.truncated)
            if buffers.renews_obs and not buffers.lent:  # every row was written by this step
                received.obs = buffers.renewed_obs()
            return received
        self._whole, self._whole_sent_at = PENDING, time.monotonic()
        self._oldest_sent = self._whole_sent_at
        self.num_pending = everyone.count
        for reply in replies:
            self._absorb(reply)
        return None

    def _number_sends(self, selection: Selection) -> None:
        """Remember the order of sends: recv returns results in it."""
        if selection.everyone and self.num_pending == 0 and self.num_ready == 0:
            self._whole_order = self._next_order
        else:
            self._per_env()
            self._send_order[selection.ids] = self._next_order + self.everyone.ids[: selection.count]
        self._next_order += selection.count

    def _set_none_results(self, ids: np.ndarray) -> None:
        """These envs answer at once with None results, without being called."""
        self._per_env()
        self.state[ids] = READY
        self.none_result[ids] = True
        self.num_ready += len(ids)

    def _dispatch(self, call: Call, selection: Selection) -> None:
        rows = selection.rows
        now = time.monotonic()
        whole = selection.everyone and self.num_pending == 0 and self.num_ready == 0
        if whole:
            self.backend.buffers.choose_obs_slot(call is self._step_everyone or call is self._awaited_step_everyone)
            self._whole, self._whole_sent_at = PENDING, now
        else:
            self._per_env()
            self.state[rows] = PENDING
            self._sent_at[rows] = now
        if self.num_pending == 0:
            self._oldest_sent = now
        self.num_pending += selection.count
        try:
            self.backend.dispatch(call)
        except WorkerDiedError as died:
            self.broken = died
            raise
        except Exception:
            # A call the backend refused (its data cannot travel) reached no env:
            # the protocol has a backend check everything before it sends anything.
            if whole:
                self._whole = IDLE
            else:
                self.state[rows] = IDLE
            self.num_pending -= selection.count
            raise

    def _per_env(self) -> None:
        """Write out the per-env state that calls of every env left unwritten (see ``_whole``)."""
        if self._whole_order is not None:
            np.add(self.everyone.ids, self._whole_order, out=self._send_order)
            self._whole_order = None
        if self._whole is not None:
            self.state.fill(self._whole)
            if self._whole == PENDING:
                self._sent_at.fill(self._whole_sent_at)
            self._whole = None

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
            if self._answers_in_dispatch:  # every call ran when dispatched: its replies are there
                replies = self.backend.collect(0.0)
                if replies:
                    for reply in replies:
                        self._absorb(reply)
                    continue
            try:
                replies = self._block_for_replies(deadline, wanted)
            except WorkerDiedError as died:
                self._survive(died)
                continue
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
        until = hang_at if deadline is None else deadline if hang_at is None else min(deadline, hang_at)
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
            self._per_env()
            self._oldest_sent = float(self._sent_at[self.state == PENDING].min())
        return self._oldest_sent + self.call_timeout

    def run(self, call: Call, selection: Selection) -> tuple[dict[int, Any], list[Failure], dict[str, Any] | None]:
        """Run a non-step call to completion: each env's answer, the failures of
        those that raised, and the vector info of hosts that answer as one batch."""
        self.require_idle(selection, f"call {type(call).__name__} on")
        if self.healing is not None and type(call) is Reset:
            self.healing.remember_seeds(call.env_ids, call.seeds)
            for env_id in call.env_ids:
                self._owed.pop(env_id, None)  # reset anyway: its new episode starts here
        self._call_values, self._call_info = {}, None
        self._sync_call = call
        try:
            self._dispatch(call, selection)
            self.wait(self.answered(selection), None, drain=True, wanted=len(selection))
        finally:
            self._sync_call = None
        values, info = self._call_values, self._call_info
        self._call_values, self._call_info = {}, None
        return values, self.take_failures(), info

    def mark_reset(self, selection: Selection) -> None:
        """These envs were reset: the policy counts them as live again."""
        if self.policy.tracks_finished:
            self.finished[self.arrays.rows(selection)] = False

    def take_failures(self) -> list[Failure]:
        """The failures absorbed since the last call, oldest first; they are forgotten here."""
        failures, self.failures = self.failures, []
        return failures

    def ready_in_send_order(self) -> Selection:
        self._per_env()
        ready = np.flatnonzero(self.state == READY)
        return self.select(ready[np.argsort(self._send_order[ready], kind="stable")])

    def receive(self, selection: Selection) -> Received:
        """Hand over the READY envs of ``selection``; they become IDLE."""
        rows = selection.rows
        none_result = None
        if self.policy.tracks_finished:
            device_rows = self.arrays.rows(selection)
            none_result = self.none_result[device_rows].clone() if not self.arrays.reads_on_host \
                else self.none_result[rows].copy()
            self.none_result[device_rows] = False
        if selection.everyone:
            infos, self.infos = self.infos, {}
            self.num_ready = 0
            if self._whole is None:
                self.state.fill(IDLE)
            self._whole = IDLE
        else:
            self._per_env()
            ids = selection.ids
            infos = {i: self.infos.pop(i) for i in ids.tolist() if i in self.infos} if self.infos else {}
            self.num_ready -= int((self.state[rows] == READY).sum())
            self.state[rows] = IDLE
        received = Received(infos, self._take_batched_infos(selection), none_result)
        self._add_ended(received, selection)
        if selection.everyone and self.backend.buffers.obs_slot:  # a spare slot, written into by these envs' steps
            received.obs = self.backend.buffers.renewed_obs()
        return received

    def _add_ended(self, received: Received, selection: Selection) -> None:
        """The episodes that ended in the step of ``selection`` handed over (see Buffers.ended), if any."""
        ended = self._ended
        if ended is not None:
            mask = ended[selection.rows]
            if np.count_nonzero(mask):  # a third of the cost of mask.any() on a few envs
                received.ended, received.ended_state = mask.copy(), self._ended_states(mask, selection)

    def _ended_states(self, mask: np.ndarray, selection: Selection) -> np.ndarray:
        """The ended episodes' last obs of the envs ``mask`` picks out of ``selection``, zeros elsewhere.

        Row by row: few episodes end in a step, and NumPy's boolean and fancy
        indexing cost several times a row's copy on small observations.
        """
        source = self._ended_obs
        states = np.zeros((len(mask), *source.shape[1:]), dtype=source.dtype)
        rows = None if selection.everyone else selection.ids
        for position in mask.nonzero()[0].tolist():
            states[position] = source[position if rows is None else rows[position]]
        return states

    def _take_batched_infos(self, selection: Selection) -> dict[str, Any] | None:
        """The vector info of the envs of ``selection`` out of the batched replies that hold them."""
        stored = self._batched_infos
        if not stored:
            return None
        if len(stored) == 1 and stored[0][0] is selection.env_ids:  # a step of every env: the hot path
            return stored.pop()[1]
        wanted = set(selection.env_ids)
        holding = [(env_ids, info) for env_ids, info in stored if wanted.intersection(env_ids)]
        self._batched_infos = [(env_ids, info) for env_ids, info in stored if not wanted.issuperset(env_ids)]
        keys = set.intersection(*(set(info) for _, info in holding))
        joined = concatenate([{key: info[key] for key in keys} for _, info in holding])
        position = {env_id: p for p, env_id in enumerate(i for env_ids, _ in holding for i in env_ids)}
        order = np.array([position[i] for i in selection.env_ids], dtype=np.int64)
        if (order == np.arange(len(order))).all() and len(order) == len(position):
            return joined
        rows = self.arrays.reply_rows(order)
        return {key: value[rows] for key, value in joined.items()}

    def _index(self, env_ids: tuple[int, ...]) -> slice | np.ndarray:
        """Index per-env arrays by a reply's (distinct) env ids: a slice when they form a range,
        as the whole group of a worker does, since slicing costs far less than fancy indexing."""
        if env_ids is self.everyone.env_ids or env_ids == self.everyone.env_ids:
            return slice(None)
        first, size = min(env_ids), len(env_ids)
        if max(env_ids) - first == size - 1:
            return slice(first, first + size)
        return np.array(env_ids, dtype=np.int64)

    def _kill_hung(self, now: float) -> None:
        assert self.call_timeout is not None
        self._per_env()
        overdue = np.flatnonzero((self.state == PENDING) & (self._sent_at + self.call_timeout <= now)).tolist()
        lost = self.backend.kill(overdue) or overdue
        raise WorkerTimeoutError(
            lost, f"envs {overdue} did not answer within call_timeout={self.call_timeout} s; their worker was killed"
        )

    def _absorb(self, reply: Reply) -> None:
        if self._standins and reply.call_type is not Step and reply.env_ids[0] in self._standins:
            reply = self._as_restarted_step(reply)
        if reply.failures and reply.call_type is Step and self.healing is not None and self.healing.rebuilds_envs:
            reply = self._rebuild_failed(reply)
            if not reply.env_ids:
                return
        env_ids = reply.env_ids
        rows = slice(None) if env_ids is self.everyone.env_ids else self._index(env_ids)
        # Every env at once (their ids are distinct): the whole batch changes state together.
        whole = self._whole == PENDING and len(env_ids) == self.num_envs
        if not whole:
            self._per_env()
        self.num_pending -= len(env_ids)
        if reply.failures:
            self.failures.extend(reply.failures)
        if reply.call_type is Step:
            # Envs whose step raised are READY too: the front hands out the
            # others' results and drops theirs when it raises the failure.
            if whole:
                self._whole = READY
            else:
                self.state[rows] = READY
            self.num_ready += len(env_ids)
            if reply.values:
                self.infos.update(reply.values)
            if reply.info is not None:
                self._batched_infos.append((env_ids, reply.info))
            if self.policy.tracks_finished:
                buffers = self.backend.buffers
                index = self.arrays.reply_rows(rows)
                done = buffers.terminated[index] | buffers.truncated[index]
                if reply.failures:  # their rows hold no result of this step
                    done[[env_ids.index(i) for i in reply.failed_ids()]] = False
                self.policy.after_step(self.finished, index, done)
        else:
            if whole:
                self._whole = IDLE
            else:
                self.state[rows] = IDLE
            self._call_values.update(reply.values)
            if reply.info is not None:
                self._call_info = reply.info
