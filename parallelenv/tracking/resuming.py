"""Resuming envs rebuilt after a failure: what each one owes the caller, and its replies turned into results.

:class:`Resumer` is the call tracker's collaborator for
``on_worker_failure`` / ``on_env_error="restart"``: the tracker hands it a
worker's death (:meth:`Resumer.survive`), the steps it sends
(:meth:`Resumer.send_due_resets`) and the replies it takes
(:meth:`Resumer.as_restarted_step`, :meth:`Resumer.rebuild_failed`). It sends
calls and changes their states only through the tracker's own calls
(:class:`Tracker`), never the backend's dispatch or the ledger. The choices
and the budget are :mod:`parallelenv.healing`'s; replacing a worker is the
backend's (``restart``).

A rebuilt env owes the caller its new episode's first obs as the answer to a
step: at once, by a reset *standing in* for the step under way, or, where it had
no call under way, at its next step (its new episode is then *due*).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from parallelenv.array_kinds import Selection
from parallelenv.backends.base import Backend
from parallelenv.batching import take
from parallelenv.calls import Call, Failure, GetAttr, Rebuild, Replay, Reply, Reset, Step, method_name, split_call
from parallelenv.errors import WorkerDiedError, WorkerTimeoutError
from parallelenv.healing import ENV_ERROR, WORKER_DIED, WORKER_HUNG, WORKER_RECYCLED, Healing, SurvivedFailure
from parallelenv.infos.keys import ENV_RESTARTED, FAILURE, WORKER_RESTARTED
from parallelenv.state.capture import capture_env
from parallelenv.state.journal import Journal

# Where a rebuilt env was put back into its snapshot, standing in for "worker_restarted": no info key is
# set, the step's own infos are handed over (a due or stand-in entry's marker, never a key the caller sees).
RESTORED = "restored"


class Tracker(Protocol):
    """What the resumer asks of the call tracker (:class:`~parallelenv.tracking.inflight.InFlight`): the
    envs of ``ids`` with a call under way; to send ``call`` to envs with none under way (``send_new``), or
    in place of the calls under way of ``env_ids``, whose envs were rebuilt (``send_instead``); and to give
    up the calls under way of ``env_ids`` (``abandon``)."""

    def select(self, ids: np.ndarray | None) -> Selection: ...
    def pending_among(self, ids: np.ndarray) -> np.ndarray: ...
    def send_new(self, call: Call, selection: Selection) -> None: ...
    def send_instead(self, call: Call, env_ids: tuple[int, ...]) -> None: ...
    def abandon(self, env_ids: np.ndarray) -> None: ...


class Resumer:
    """What rebuilt envs owe the caller, and the calls that stand in for the ones they lost."""

    def __init__(self, healing: Healing, sources: list[Any] | None, backend: Backend, tracker: Tracker,
                 journal: Journal | None = None) -> None:
        self.healing = healing
        self.journal = journal  # snapshots and the steps since, for lossless healing; None: rebuilt envs reset
        self._sources = sources  # the user's envs, from which on_env_error="restart" rebuilds one
        self._backend = backend
        self._tracker = tracker
        # Rebuilt envs that had no call under way: their next step answers with their new episode's first obs.
        self.due: dict[int, tuple[SurvivedFailure, str]] = {}
        # Rebuilt envs whose reset (or Rebuild) under way stands in for a step: the failure and the info key.
        self.standins: dict[int, tuple[SurvivedFailure, str]] = {}

    def survive(self, died: WorkerDiedError, sync_call: Call | None) -> list[Failure]:
        """Replace the dead worker and resume its envs; the failures of the calls whose answers are lost.
        Raises ``died`` as is where workers are not restarted, and the spent budget's error past it."""
        healing = self.healing
        if not healing.restarts_workers:
            raise died
        kind = WORKER_HUNG if isinstance(died, WorkerTimeoutError) else WORKER_DIED
        env_ids, reason = died.env_indices, died.reason
        while True:
            if not healing.admit(tuple(env_ids), kind, reason):
                raise healing.over_budget(env_ids, reason) from died
            try:
                rebuilt = self._backend.restart(env_ids)
                break
            except Exception as exc:  # the replacement failed too: a failure of its own, and never a loop
                kind, reason = WORKER_DIED, f"its replacement failed: {type(exc).__name__}: {exc}"
        healing.name_rebuilt(rebuilt)
        return self._resume(rebuilt, healing.failures[-1], sync_call)

    def _resume(self, rebuilt: list[int], failure: SurvivedFailure, sync_call: Call | None) -> list[Failure]:
        """What each rebuilt env owes the caller: a step under way gets its new episode's first obs now,
        a reset under way is done again, any other call fails; an env with nothing under way owes its
        next step the new episode's first obs."""
        if not rebuilt:
            return []
        ids = np.array(sorted(rebuilt), dtype=np.int64)
        pending = self._tracker.pending_among(ids)
        # A step sent earlier (send(), then another call) is still under way
        # beside the call run() has under way: each is answered as its own kind.
        in_call = np.isin(pending, sync_call.env_ids) if sync_call is not None else np.zeros(len(pending), bool)
        stepping, calling = pending[~in_call], pending[in_call]
        idle = np.setdiff1d(ids, pending)
        journal = self.journal
        if journal is not None:  # a worker lost again while it replayed: the replay may be what kills it
            journal.changed(tuple(i for i in stepping.tolist() if self.standins.get(i, ("", ""))[1] == RESTORED),
                            "its worker was lost again while it replayed its steps since its snapshot")
        restored = [i for i in [*stepping.tolist(), *idle.tolist()] if journal is not None and journal.can_replay(i)]
        if journal is not None:  # the failure log says which envs went on from their snapshot, and why not the rest
            failure = self.healing.name_restored(
                failure, restored, {i: journal.why_not(i) for i in [*stepping.tolist(), *idle.tolist()]
                                    if i not in restored})
        for env_id in idle.tolist():
            self.due[env_id] = (failure, RESTORED if env_id in restored else WORKER_RESTARTED)
        replaying = tuple(i for i in stepping.tolist() if i in restored)
        if replaying:
            assert journal is not None
            self._replay(replaying, failure, journal, new=False)
        resetting = tuple(i for i in stepping.tolist() if i not in restored)
        if resetting:
            self._tracker.send_instead(self._stand_in(resetting, failure, WORKER_RESTARTED), resetting)
        if not calling.size:
            return []
        assert sync_call is not None
        if type(sync_call) is Reset:
            position = {env_id: p for p, env_id in enumerate(sync_call.env_ids)}
            again = split_call(sync_call, [position[i] for i in calling.tolist()])
            self._tracker.send_instead(again, again.env_ids)
            return []
        # An answer of the old env cannot be had from a new one.
        self._tracker.abandon(calling)
        return [
            Failure(
                env_id, method_name(sync_call), "parallelenv.errors.WorkerDiedError",
                f"the worker hosting it died ({failure.reason}) and was restarted; the call's answer is lost",
                "",
            )
            for env_id in calling.tolist()
        ]

    def recycle(self, workers: list[tuple[list[int], str]]) -> None:
        """Replace these workers (each its env ids, none with a call under way, and why) on purpose, in
        one restart (Ray starts their actors together): their envs owe their next step their new
        episode's first obs, as after a death (see parallelenv.recycling). One log entry a worker."""
        every = [env_id for env_ids, _ in workers for env_id in env_ids]
        self._backend.kill(every)
        rebuilt = set(self._backend.restart(every))
        for env_ids, reason in workers:
            renewed = sorted(env_id for env_id in env_ids if env_id in rebuilt)
            self._resume(renewed, self.healing.record(tuple(renewed), WORKER_RECYCLED, reason), None)

    def forget_due(self, env_ids: tuple[int, ...]) -> None:
        """These envs are reset anyway: their new episode starts there, not at their next step (an env to
        be put back into its snapshot still is, at its next step: its record holds this reset)."""
        for env_id in env_ids:
            if self.due.get(env_id, (None, None))[1] != RESTORED:
                self.due.pop(env_id, None)

    def _replay(self, env_ids: tuple[int, ...], failure: SurvivedFailure, journal: Journal, new: bool) -> None:
        """Put ``env_ids`` back into their snapshots and replay their steps, the step under way (or
        about to be sent, when ``new``) last: its reply answers that step."""
        for env_id in env_ids:
            self.standins[env_id] = (failure, RESTORED)
        replay = journal.replay(list(env_ids))
        if new:
            self._tracker.send_new(replay, self._tracker.select(np.array(env_ids, dtype=np.int64)))
        else:
            self._tracker.send_instead(replay, env_ids)

    def before_call(self, call: Call) -> None:
        """What a call other than a step means to the rebuilt envs and the snapshots' record."""
        journal = self.journal
        if type(call) is Reset:
            self.healing.remember_seeds(call.env_ids, call.seeds)
            self.forget_due(call.env_ids)
            if journal is not None:
                journal.reset(call.env_ids, tuple(call.seeds), tuple(call.options))
        elif journal is not None and type(call) is not GetAttr and getattr(call, "name", None) is not capture_env:
            journal.changed(call.env_ids)

    def _stand_in(self, env_ids: tuple[int, ...], failure: SurvivedFailure, key: str) -> Reset:
        """The reset of rebuilt envs, with fresh seeds, whose reply answers their step (see
        :meth:`as_restarted_step`)."""
        for env_id in env_ids:
            self.standins[env_id] = (failure, key)
        if self.journal is not None:  # a new episode: the record no longer leads to where these envs are
            self.journal.changed(env_ids, "it was rebuilt and reset after an earlier failure, before its next "
                                 "snapshot")
        return Reset(env_ids, self.healing.fresh_seeds(env_ids), (None,) * len(env_ids))

    def send_due_resets(self, selection: Selection, actions: Any) -> tuple[Selection, Any]:
        """Send the envs of a step whose new episode is due the reset standing in for it; the rest of
        the step and its actions."""
        due_mask = np.isin(selection.ids, list(self.due))
        if not due_mask.any():
            return selection, actions
        by_failure: dict[tuple[int, str], tuple[SurvivedFailure, str, list[int]]] = {}
        for env_id in selection.ids[due_mask].tolist():
            failure, key = self.due.pop(env_id)
            by_failure.setdefault((id(failure), key), (failure, key, []))[2].append(env_id)
        for failure, key, env_ids in by_failure.values():
            if key == RESTORED:
                assert self.journal is not None
                self._replay(tuple(env_ids), failure, self.journal, new=True)
                continue
            reset = self._stand_in(tuple(env_ids), failure, key)
            self._tracker.send_new(reset, self._tracker.select(np.array(env_ids, dtype=np.int64)))
        return selection.without(due_mask), take(actions, ~due_mask)

    def stands_in(self, reply: Reply) -> bool:
        """Whether ``reply`` answers a stand-in reset rather than the call it seems to."""
        return bool(self.standins) and reply.call_type is not Step and reply.env_ids[0] in self.standins

    def as_restarted_step(self, reply: Reply) -> Reply:
        """A stand-in reset's reply as the step it answers: the new episode's first obs, no reward,
        ``truncated``, and the info saying why."""
        env_ids = reply.env_ids
        if reply.call_type is Replay:  # the step itself, replayed: its results and infos are the step's own
            for env_id in env_ids:
                self.standins.pop(env_id)
            return dataclasses.replace(reply, call_type=Step)
        failed = set(reply.failed_ids())
        answered = [i for i in env_ids if i not in failed]
        buffers = self._backend.buffers
        buffers.reward[answered] = 0.0
        buffers.terminated[answered] = False
        buffers.truncated[answered] = True
        if buffers.ended is not None:  # the row of the episode the failure ended holds no last obs
            buffers.ended[answered] = False
        values = {}
        for env_id in env_ids:
            failure, key = self.standins.pop(env_id)
            if env_id not in failed:
                values[env_id] = {**(reply.values.get(env_id) or {}), key: True, FAILURE: failure}
        return Reply(Step, env_ids, values, reply.failures)

    def rebuild_failed(self, reply: Reply) -> Reply:
        """Rebuild the envs of a step reply that raised, within the budget; the reply without them."""
        healing = self.healing
        if not healing.rebuilds_envs:
            return reply
        assert self._sources is not None
        rebuilding, kept = [], []
        for failure in reply.failures:
            reason = f"{failure.exc_type}: {failure.message} (in {failure.method})"
            if healing.admit((failure.env_index,), ENV_ERROR, reason, failure.traceback):
                rebuilding.append(failure.env_index)
                self.standins[failure.env_index] = (healing.failures[-1], ENV_RESTARTED)
            else:
                kept.append(failure)  # past the budget: raised as without healing
        if not rebuilding:
            return reply
        ids = tuple(rebuilding)
        if self.journal is not None:
            self.journal.changed(ids, "its own step raised, and it was rebuilt and reset (on_env_error)")
        self._tracker.send_instead(Rebuild(ids, tuple(self._sources[i] for i in ids), healing.fresh_seeds(ids)), ids)
        answered = tuple(i for i in reply.env_ids if i not in rebuilding)
        return Reply(Step, answered, reply.values, tuple(kept), reply.info)
