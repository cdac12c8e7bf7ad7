"""A step of every env answered in one reply: the tracker's path past its per-call bookkeeping.

On a backend that answers an awaited step of every env in one Done unless
some env has something to say (:class:`~parallelenv.backends.base.AnswersWholeSteps`,
and every backend that runs its envs in the caller), the ledger's round
(sent, pending, ready, received) has nothing to track while such a step is
under way: :class:`WholeSteps` sends it, waits for the one reply itself for
up to ``call_timeout``, and hands it over through the tracker's own hand-over
(:meth:`InFlight.handed_over`) and policy update (:meth:`InFlight.track_finished`).
Where anything else comes (a failure, a worker's death, replies in parts,
no reply in time, an interrupt), the step is entered in the ledger as sent
when it was, what came is absorbed as any reply is, and the general path
takes over.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from parallelenv.calls import Reply
from parallelenv.errors import WorkerDiedError
from parallelenv.tracking.results import Outcome, Received

if TYPE_CHECKING:
    from parallelenv.tracking.inflight import InFlight


class WholeSteps:
    """The whole-step path of ``tracker`` (see the module's docstring)."""

    def __init__(self, tracker: InFlight) -> None:
        self._tracker = tracker
        self._in_caller = tracker.answers_in_dispatch

    def possible(self) -> bool:
        """Whether a step of every env can take this path now: with nothing else under way and no
        rebuilt env owing its new episode (healing's resumer answers those); under a policy that tracks
        finished envs, only while none is (it would answer with None results), read on the host."""
        tracker = self._tracker
        resumer = tracker.resumer
        return (tracker.ledger.quiet and (resumer is None or not (resumer.owed or resumer.standins))
                and (not tracker.policy.tracks_finished
                     or (tracker.arrays.reads_on_host and not tracker.finished.any())))

    def step(self, actions: Any) -> Outcome | None:
        """Step every env and hand its results over as soon as its one reply comes; None where the
        general path takes over (the caller then waits and hands over as after ``send``)."""
        tracker = self._tracker
        everyone, arrays, backend = tracker.everyone, tracker.arrays, tracker.backend
        arrays.put_actions(backend.buffers, everyone.rows, arrays.actions(actions, everyone.count))
        if self._in_caller:
            backend.dispatch(tracker.step_everyone)
            replies = backend.collect(0.0)
            sent_at = None
        else:
            sent = self._send_and_collect()
            if sent is None:  # a worker died and was replaced: the step is in the ledger, and the rest to come
                return None
            sent_at, replies = sent
        reply = replies[0] if len(replies) == 1 else None
        if reply is not None and not reply.failures and (reply.env_ids is everyone.env_ids
                                                         or reply.env_ids == everyone.env_ids):
            if tracker.policy.tracks_finished:  # none was finished before this step; some may be now
                tracker.track_finished(everyone.rows, reply)
            return tracker.handed_over(everyone, [], Received(tracker.infos.take_whole_step(reply, everyone), None))
        self._enter(time.monotonic() if sent_at is None else sent_at)
        for reply in replies:
            tracker.absorb(reply)
        return None

    def _send_and_collect(self) -> tuple[float, list[Reply]] | None:
        """The step on a backend of other processes: when it was sent, and the replies that came within
        ``call_timeout``. A death or an interrupt is raised with the step in the ledger; a death that
        healing survives returns None, the step in the ledger, as the general path would go on."""
        tracker = self._tracker
        backend = tracker.backend
        tracker.handover.before_whole_call(backend.buffers, True)
        sent_at = time.monotonic()
        try:
            backend.dispatch(tracker.awaited_step_everyone)
        except WorkerDiedError as died:
            tracker.broken = died
            raise
        try:
            return sent_at, backend.collect(tracker.call_timeout)
        except BaseException as exc:
            self._enter(sent_at)
            if isinstance(exc, WorkerDiedError):
                tracker.absorb_before_death(exc)
                tracker.survive(exc)
                return None
            raise

    def _enter(self, sent_at: float) -> None:
        """Enter the step, sent at ``sent_at``, in the ledger."""
        ledger, everyone = self._tracker.ledger, self._tracker.everyone
        ledger.number(everyone)
        ledger.dispatched(everyone, sent_at)
