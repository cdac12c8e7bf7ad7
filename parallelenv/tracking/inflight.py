"""The calls in flight on a backend's envs: dispatch, wait, absorb replies, hand over results.

:class:`InFlight` is what the front object calls: ``step``, ``send``,
``recv``, ``reset`` and ``run`` each return one
:class:`~parallelenv.tracking.results.Outcome` (which envs answered, their results,
the failures of the others), and the front only checks arguments and formats
outcomes. Where each env's call stands is the
:class:`~parallelenv.tracking.ledger.Ledger`'s; surviving failures is the
:class:`~parallelenv.tracking.resuming.Resumer`'s; how results reach the caller is
the buffers' handover's. This is the one place that waits: always with a
deadline, and always ready to declare a worker hung after ``call_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays, Selection, array_kind, host_rows
from parallelenv.backends.base import Backend, RunsInCaller
from parallelenv.batching import take
from parallelenv.calls import Call, Failure, Replay, Reply, Reset, Step
from parallelenv.errors import AlreadyPendingError, ClosedError, WorkerDiedError, WorkerTimeoutError
from parallelenv.healing import Healing
from parallelenv.infos.step_infos import NO_INFO, PendingInfos, StepInfo
from parallelenv.policies import Policy
from parallelenv.recycling import Recycler, Recycling
from parallelenv.state.journal import Journal
from parallelenv.tracking.ledger import Ledger
from parallelenv.tracking.results import Outcome, Received, add_ended
from parallelenv.tracking.resuming import Resumer

__all__ = ["InFlight"]


class InFlight:
    """The calls in flight on a backend's envs, and what their replies said."""

    def __init__(
        self,
        backend: Backend,
        policy: Policy,
        call_timeout: float | None,
        healing: Healing | None = None,
        sources: list[Any] | None = None,
        recycling: Recycling | None = None,
        journal: Journal | None = None,
    ) -> None:
        n = self.num_envs = backend.num_envs
        self.backend = backend
        self._buffers = backend.buffers
        # How results reach the caller: fixed once the backend is built and ParallelEnv has said copy=.
        self.handover = backend.buffers.handover
        # A backend that runs each call in the caller's thread has nothing to wait for.
        self.answers_in_dispatch = isinstance(backend, RunsInCaller)
        self.policy = policy
        self.call_timeout = call_timeout
        self.arrays: NumpyArrays = array_kind(backend.buffers, backend.single_action_space)
        self.ledger = ledger = Ledger(n)
        self._nothing_pending = lambda: ledger.num_pending == 0
        self.everyone = Selection.of(np.arange(n), n)
        self._every_env_id = self.everyone.env_ids
        self._rows_of_everyone = self.arrays.rows(self.everyone)
        self.step_everyone = Step(self.everyone.env_ids)
        self.awaited_step_everyone = Step(self.everyone.env_ids, awaited=True)
        # The policy's finished envs (they get None results), in the buffers' array kind.
        self.finished = self.arrays.bool_zeros(n)
        self._none_result = self.arrays.bool_zeros(n)  # READY with a None result, never stepped
        self._holds_none_results = False  # whether any row of _none_result may be set
        self.infos = PendingInfos(backend.buffers.info_columns, self.arrays)  # of READY envs
        self._call_values: dict[int, Any] = {}  # answers to the non-step call under way
        self._call_info: dict[str, Any] | None = None
        self._failures: list[Failure] = []
        # The infos of the last step handed over, each env's values as it gave them (ParallelEnv.last_step_info).
        self.last_step_info: StepInfo | None = None
        self._sync_call: Call | None = None  # the non-step call that run() has under way
        self.broken: WorkerDiedError | None = None
        # Set from another thread by ParallelEnv.close(): the wait ends, and no death is survived.
        self.interrupted = False
        self._recycler = None if recycling is None else Recycler(recycling, backend, n)
        if recycling is not None:
            healing = healing or Healing("raise", "raise", 0, 1.0)
        active = healing is not None and (healing.active or self._recycler is not None)
        self.resumer = Resumer(healing, sources, backend, self, journal) if active else None
        self.journal = journal if active else None  # lossless healing's record of snapshots and steps

    def select(self, ids: np.ndarray | None) -> Selection:
        """The selection of checked ``ids``; every env when None."""
        return self.everyone if ids is None else Selection.of(ids, self.num_envs)

    @property
    def outstanding(self) -> int:
        """How many envs have a step under way or a result waiting for recv."""
        return self.ledger.num_pending + self.ledger.num_ready

    # ------------------------------------------------------------- the front's calls

    def step(self, selection: Selection, actions: Any) -> Outcome:
        """Step the envs of ``selection`` and hand over their results: a :meth:`send` that the caller
        awaits whole, a wait for every one of them, then one hand-over, whatever the replies were."""
        self.send(selection, actions, awaited=True)
        ledger = self.ledger
        # The first round of the wait, without its clock: an in-caller backend's replies are there, and a
        # step sent just now can hang no sooner than call_timeout from now (the rounds after read the ledger).
        if self.answers_in_dispatch:
            for reply in self.backend.collect(0.0):
                self.absorb(reply)
        elif ledger.num_pending and not self.interrupted:
            self._collect(self.call_timeout, selection.count)
        if ledger.num_pending:
            answered = self._nothing_pending if selection.everyone else lambda: not ledger.any_pending(selection)
            self._wait(answered, None, drain=True, wanted=selection.count)
        return self._recycled_after(self._hand_over(selection))

    def send(self, selection: Selection, actions: Any, awaited: bool = False) -> None:
        """Step the envs of ``selection`` with the user's ``actions``, checked before anything is
        sent; the policy's finished envs answer at once with None results instead. ``awaited``:
        the caller waits for all of them before anything else (see Step.awaited)."""
        ledger = self.ledger
        if ledger.num_pending or ledger.num_ready:
            self._require_idle(selection, "send to")
        actions = self.arrays.actions(actions, selection.count)
        numbered = False  # numbered as it is dispatched, unless some of its envs answer otherwise
        live = None
        rows = self._rows_of_everyone if selection.everyone else self.arrays.rows(selection)
        if self.policy.tracks_finished:
            if not self.arrays.reads_on_host:  # a device mask: the backend leaves out the envs it does not set
                live = self.policy.live(self.finished, rows)
                self._none_result[rows] = ~live
                self._holds_none_results = True
            elif self.finished.any():  # on the host, and cheaper than the mask of every step
                live = self.policy.live(self.finished, rows)
                if not live.all():
                    ledger.number(selection)
                    numbered = True
                    finished = selection.ids[~live]
                    ledger.none_results(finished)
                    self.infos.forget(finished)  # their info rows hold a step handed over before
                    self._none_result[finished] = True
                    self._holds_none_results = True
                    actions = take(actions, live)
                    selection = selection.without(~live)
                    if not len(selection):
                        return
                    rows = self.arrays.rows(selection)
                live = None
        snapshot = None if self.journal is None else self.journal.stepped(selection.ids, actions)
        if self.resumer is not None and self.resumer.due:
            if not numbered:
                ledger.number(selection)
                numbered = True
            selection, actions = self.resumer.send_due_resets(selection, actions)
            if not len(selection):
                return
            rows = self.arrays.rows(selection)
        self.arrays.put_actions(self._buffers, rows, actions)
        if selection.everyone and live is None and snapshot is None:
            call = self.awaited_step_everyone if awaited else self.step_everyone
        else:
            call = Step(selection.env_ids, live, awaited, snapshot)
        self._dispatch(call, selection, numbered)

    def recv(self, wait_num: int, deadline: float | None) -> Outcome:
        """Wait for at least ``wait_num`` envs' step results (or the deadline, or a failure) and hand
        over every one there is, in the order they were sent."""
        ledger = self.ledger
        self._wait(lambda: ledger.num_ready >= wait_num, deadline, drain=False, wanted=wait_num - ledger.num_ready)
        return self._recycled_after(self._hand_over(self.select(ledger.ready_in_send_order())))

    def _recycled_after(self, outcome: Outcome) -> Outcome:
        """Count the steps handed over; replace the workers past a recycling limit that have no call under way."""
        if self._recycler is not None:
            assert self.resumer is not None  # made with the recycler
            self._recycler.after_hand_over(outcome.answered.rows, self.ledger, self.resumer)
        return outcome

    def reset(self, call: Reset, selection: Selection) -> Outcome:
        """Run ``call`` and hand over the first obs of the envs it reset; the policy counts them as live."""
        outcome = self.run(call, selection)
        reset = outcome.answered
        if self.policy.tracks_finished:
            self.finished[self.arrays.rows(reset)] = False
        outcome.results = (self.arrays.take(self._buffers.obs, reset, lend=False),)
        assert outcome.received is not None  # run() sets it
        # A reset's answers are its infos.
        outcome.received = Received(StepInfo(outcome.values, outcome.received.info.batched), None)
        return outcome

    def run(self, call: Call, selection: Selection) -> Outcome:
        """Run a non-step call to completion: each env's answer, the failures of those that raised."""
        self._require_idle(selection, f"call {type(call).__name__} on")
        if self.resumer is not None:
            self.resumer.before_call(call)
        self._call_values, self._call_info = {}, None
        self._sync_call = call
        try:
            self._dispatch(call, selection)
            self._wait(lambda: not self.ledger.any_pending(selection), None, drain=True, wanted=len(selection))
        finally:
            self._sync_call = None
        values, info = self._call_values, self._call_info
        self._call_values, self._call_info = {}, None
        failures, self._failures = self._failures, []
        answered = selection.without(np.isin(selection.ids, [f.env_index for f in failures])) if failures else selection
        return Outcome(answered, failures, Received(StepInfo({}, info), None), values=values)

    # ------------------------------------------------------------- handing over

    def _hand_over(self, ready: Selection) -> Outcome:
        """The READY envs of ``ready``, received: the results of those that answered, out of the buffers,
        and the failures of the others (whose results are dropped). Every step's results, whatever the
        replies were, reach the caller here."""
        failures = self._failures
        if failures:
            self._failures = []
            failed = np.isin(ready.ids, [failure.env_index for failure in failures])
            self._receive(self.select(ready.ids[failed]))
            ready = ready.without(failed)
            if not len(ready):
                return Outcome(ready, failures)
        else:
            failures = []
        if self._holds_none_results or self.infos.holds_any:
            received = self._receive(ready)
        else:  # a training loop's step: nothing said beyond the buffers
            self.ledger.received(ready)
            received = Received(NO_INFO, None)
        add_ended(received, self._buffers.ended, self._buffers.ended_obs, ready)
        self.last_step_info = received.info
        results = self.handover.step_results(self.arrays, self._buffers, ready, self.policy.tracks_finished)
        return Outcome(ready, failures, received, results)

    def _receive(self, selection: Selection) -> Received:
        """What the replies said of the READY envs of ``selection``; they become IDLE."""
        none_result = None
        if self._holds_none_results:
            rows = self.arrays.rows(selection)
            none_result = self._none_result[rows].copy() if self.arrays.reads_on_host \
                else self._none_result[rows].clone()
            self._none_result[rows] = False
            self._holds_none_results = not selection.everyone
        self.ledger.received(selection)
        return Received(self.infos.take(selection), none_result)

    # ------------------------------------------------------------- dispatching and waiting

    def _require_idle(self, selection: Selection, doing: str) -> None:
        busy = self.ledger.busy(selection.ids)  # at once where nothing is outstanding
        if busy.size:
            named = busy[:8].tolist()
            envs = f"envs {named}" if busy.size <= 8 else f"{busy.size} envs ({str(named)[:-1]}, ...])"
            raise AlreadyPendingError(f"{doing} {envs} whose previous call has not been received: recv() first")

    def _dispatch(self, call: Call, selection: Selection, numbered: bool = True) -> None:
        # An in-caller backend's calls are answered before any could hang: no clock to read.
        if self.ledger.dispatched(selection, 0.0 if self.answers_in_dispatch else time.monotonic(), numbered):
            step_of_every_env = call is self.step_everyone or call is self.awaited_step_everyone
            self.handover.before_whole_call(self._buffers, step_of_every_env)
        try:
            self.backend.dispatch(call)
        except WorkerDiedError as died:
            self.broken = died
            raise
        except Exception:
            # A call the backend refused (its data cannot travel) reached no env:
            # the protocol has a backend check everything before it sends anything.
            self.ledger.reverted(selection)
            raise

    def _wait(
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
        ledger = self.ledger
        while not satisfied() and (drain or not self._failures):
            if self.interrupted:
                raise ClosedError("close() from another thread ended this call")
            if ledger.num_pending == 0:
                return
            if self.answers_in_dispatch and self._collect(0.0, None):  # every call ran when dispatched
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            # Wait up to the deadline or until the oldest call would have hung; kill whatever has.
            timeout = self.call_timeout
            hang_at = None if timeout is None else ledger.hang_at(timeout, now)
            until = hang_at if deadline is None else deadline if hang_at is None else min(deadline, hang_at)
            if not self._collect(None if until is None else max(0.0, until - now), wanted) and hang_at is not None:
                now = time.monotonic()
                if now >= hang_at and ledger.hang_at(timeout, now) <= now:  # type: ignore[arg-type]
                    self._kill_hung(now)

    def _collect(self, timeout: float | None, wanted: int | None) -> bool:
        """Absorb what the backend has within ``timeout``: replies, or a death (survived, or raised);
        False where nothing came."""
        try:
            replies = self.backend.collect(timeout, wanted)
        except WorkerDiedError as died:
            self.absorb_before_death(died)
            self.survive(died)
            return True
        for reply in replies:
            self.absorb(reply)
        return bool(replies)

    def absorb_before_death(self, died: WorkerDiedError) -> None:
        """Answers read before the death was seen are answers: taken first, an env answered in
        time is no longer pending when the death is handled."""
        replies, died.replies_before_death = died.replies_before_death, ()
        for reply in replies:
            self.absorb(reply)

    def survive(self, died: WorkerDiedError) -> None:
        """Go on past a worker's death where healing says so; else the ParallelEnv is broken."""
        if self.interrupted:
            raise ClosedError("close() from another thread ended this call") from died
        if self.resumer is None:
            self.broken = died
            raise died
        try:
            self._failures.extend(self.resumer.survive(died, self._sync_call))
        except WorkerDiedError as final:
            self.broken = final
            raise

    def _kill_hung(self, now: float) -> None:
        """Kill the workers of the envs overdue at ``now``: their deaths are survived, or raised, as any."""
        assert self.call_timeout is not None
        overdue = self.ledger.overdue(self.call_timeout, now)
        lost = self.backend.kill(overdue) or overdue
        self.survive(WorkerTimeoutError(
            lost, f"envs {overdue} did not answer within call_timeout={self.call_timeout} s; their worker was killed"
        ))

    def pending_among(self, ids: np.ndarray) -> np.ndarray:
        return self.ledger.pending_among(ids)

    def send_new(self, call: Call, selection: Selection) -> None:
        self.ledger.dispatched(selection, time.monotonic())
        self.backend.dispatch(call)

    def send_instead(self, call: Call, env_ids: tuple[int, ...]) -> None:
        self.ledger.resent(list(env_ids), time.monotonic())  # a rebuilt env's clock starts again
        self.backend.dispatch(call)

    def abandon(self, env_ids: np.ndarray) -> None:
        self.ledger.lost(env_ids)

    def track_finished(self, index: Any, reply: Reply) -> None:
        """The policy's finished envs after the step ``reply`` answered for the envs of ``index``."""
        buffers = self._buffers
        done = buffers.terminated[index] | buffers.truncated[index]
        if reply.failures:  # their rows hold no result of this step
            done[[reply.env_ids.index(i) for i in reply.failed_ids()]] = False
        self.policy.after_step(self.finished, index, done)

    def absorb(self, reply: Reply) -> None:
        if self.journal is not None and reply.states is not None:  # first: a rebuild below outdates them
            self.journal.took(reply.states)
        resumer = self.resumer
        if resumer is not None:
            if resumer.stands_in(reply):
                if reply.call_type is not Replay:  # a replayed step's info rows are its own
                    self.infos.forget(reply.env_ids)  # theirs hold no step of the rebuilt envs
                reply = resumer.as_restarted_step(reply)
            if reply.failures and reply.call_type is Step:
                reply = resumer.rebuild_failed(reply)
                if not reply.env_ids:
                    return
        env_ids = reply.env_ids
        rows = slice(None) if env_ids is self._every_env_id or env_ids == self._every_env_id else host_rows(env_ids)
        step = reply.call_type is Step
        self.ledger.answered(env_ids, rows, step)
        if reply.failures:
            self._failures.extend(reply.failures)
        if step:
            # Envs whose step raised are READY too: their results are dropped
            # when the failure is handed over with the others' results.
            if reply.values or reply.info is not None:
                self.infos.add(reply)
            if self.policy.tracks_finished:
                self.track_finished(self.arrays.reply_rows(rows), reply)
        else:
            self._call_values.update(reply.values)
            if reply.info is not None:
                self._call_info = reply.info
