"""Resuming envs rebuilt after a failure: what each one owes the caller, and its replies turned into results.

A mixin of :class:`~parallelenv.inflight.InFlight`, which calls it where a
worker dies (``_survive``), where a step of a rebuilt env is sent
(``_answer_owed``) and where a reply arrives (``_as_restarted_step``,
``_rebuild_failed``); the state it reads and writes is InFlight's. The
choices and the budget are :mod:`parallelenv.healing`'s; replacing a worker
is the backend's (``restart``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays, Selection
from parallelenv.backends.base import Backend
from parallelenv.batching import take
from parallelenv.calls import Call, Done, Failure, Rebuild, Reset, Step, method_name, split_call
from parallelenv.env_states import IDLE, PENDING
from parallelenv.errors import WorkerDiedError, WorkerTimeoutError
from parallelenv.healing import ENV_ERROR, WORKER_DIED, WORKER_HUNG, Healing, SurvivedFailure

WORKER_RESTARTED = "worker_restarted"  # the info key of an env rebuilt with its worker
ENV_RESTARTED = "env_restarted"  # the info key of an env rebuilt after it raised


class ResumesRebuiltEnvs:
    """InFlight's part for ``on_worker_failure`` / ``on_env_error="restart"``; it also uses InFlight's
    ``_per_env()`` and ``select()``."""

    backend: Backend
    arrays: NumpyArrays
    state: np.ndarray
    failures: list[Failure]
    num_pending: int
    broken: WorkerDiedError | None
    _sent_at: np.ndarray
    _oldest_sent: float

    def _start_resuming(self, healing: Healing | None, sources: list[Any] | None) -> None:
        self.healing = healing if healing is not None and healing.active else None
        self._sources = sources  # the user's envs, from which on_env_error="restart" rebuilds one
        # Rebuilt envs that had no call under way: their next step answers with their new episode's first obs.
        self._owed: dict[int, tuple[SurvivedFailure, str]] = {}
        # Rebuilt envs whose reset (or Rebuild) under way stands in for a step: the failure and the info key.
        self._standins: dict[int, tuple[SurvivedFailure, str]] = {}
        self._sync_call: Call | None = None  # the non-step call that run() has under way

    def _survive(self, died: WorkerDiedError) -> None:
        """Replace the dead worker and resume its envs, or raise ``died`` (or the spent budget) as is."""
        healing = self.healing
        if healing is None or not healing.restarts_workers:
            self.broken = died
            raise died
        kind = WORKER_HUNG if isinstance(died, WorkerTimeoutError) else WORKER_DIED
        env_ids, reason = died.env_indices, died.reason
        while True:
            if not healing.admit(tuple(env_ids), kind, reason):
                self.broken = healing.over_budget(env_ids, reason)
                raise self.broken from died
            try:
                rebuilt = self.backend.restart(env_ids)
                break
            except Exception as exc:  # the replacement failed too: a failure of its own, and never a loop
                kind, reason = WORKER_DIED, f"its replacement failed: {type(exc).__name__}: {exc}"
        healing.name_rebuilt(rebuilt)
        self._resume(rebuilt, healing.failures[-1])

    def _resume(self, rebuilt: list[int], failure: SurvivedFailure) -> None:
        """What each rebuilt env owes the caller: a step under way gets its new episode's first obs now,
        a reset under way is done again, any other call fails; an env with nothing under way owes its
        next step the new episode's first obs."""
        if not rebuilt:
            return
        self._per_env()
        ids = np.array(sorted(rebuilt), dtype=np.int64)
        pending = self.state[ids] == PENDING
        for env_id in ids[~pending].tolist():
            self._owed[env_id] = (failure, WORKER_RESTARTED)
        ids = ids[pending]
        if not ids.size:
            return
        call = self._sync_call
        self._sent_at[ids] = time.monotonic()
        if call is None:  # steps
            self._stand_in(tuple(ids.tolist()), failure, WORKER_RESTARTED)
        elif type(call) is Reset:
            position = {env_id: p for p, env_id in enumerate(call.env_ids)}
            self.backend.dispatch(split_call(call, [position[i] for i in ids.tolist()]))
        else:  # an answer of the old env cannot be had from a new one
            for env_id in ids.tolist():
                self.failures.append(Failure(
                    env_id, method_name(call), "parallelenv.errors.WorkerDiedError",
                    f"the worker hosting it died ({failure.reason}) and was restarted; the call's answer is lost",
                    "",
                ))
            self.state[ids] = IDLE
            self.num_pending -= len(ids)

    def _stand_in(self, env_ids: tuple[int, ...], failure: SurvivedFailure, key: str) -> None:
        """Reset rebuilt envs with fresh seeds; the reply answers their step (see :meth:`_as_restarted_step`)."""
        assert self.healing is not None
        for env_id in env_ids:
            self._standins[env_id] = (failure, key)
        seeds = self.healing.fresh_seeds(env_ids)
        self.backend.dispatch(Reset(env_ids, seeds, (None,) * len(env_ids)))

    def _answer_owed(self, selection: Selection, actions: Any) -> tuple[Selection, Any]:
        """Send the owed envs of a step their stand-in reset; the rest of the step and its actions."""
        owed_mask = np.isin(selection.ids, list(self._owed))
        if not owed_mask.any():
            return selection, actions
        owed = self.select(selection.ids[owed_mask])
        by_failure: dict[int, tuple[SurvivedFailure, str, list[int]]] = {}
        for env_id in owed.env_ids:
            failure, key = self._owed.pop(env_id)
            by_failure.setdefault(id(failure), (failure, key, []))[2].append(env_id)
        self._per_env()
        self.state[owed.rows] = PENDING
        self._sent_at[owed.rows] = time.monotonic()
        if self.num_pending == 0:
            self._oldest_sent = time.monotonic()
        self.num_pending += owed.count
        for failure, key, env_ids in by_failure.values():
            self._stand_in(tuple(env_ids), failure, key)
        return selection.without(owed_mask), take(actions, ~owed_mask)

    def _as_restarted_step(self, reply: Done) -> Done:
        """A stand-in reset's reply as the step it answers: the new episode's first obs, no reward,
        ``truncated``, and the info saying why."""
        env_ids = reply.env_ids
        failed = set(reply.failed_ids())
        answered = [i for i in env_ids if i not in failed]
        buffers = self.backend.buffers
        buffers.reward[answered] = 0.0
        buffers.terminated[answered] = False
        buffers.truncated[answered] = True
        if buffers.ended is not None:  # the row of the episode the failure ended holds no last obs
            buffers.ended[answered] = False
        values = {}
        for env_id in env_ids:
            failure, key = self._standins.pop(env_id)
            if env_id not in failed:
                values[env_id] = {**(reply.values.get(env_id) or {}), key: True, "failure": failure}
        return Done(Step, env_ids, values, reply.failures)

    def _rebuild_failed(self, reply: Done) -> Done:
        """Rebuild the envs of a step reply that raised, within the budget; the reply without them."""
        healing = self.healing
        assert healing is not None and self._sources is not None
        rebuilding, kept = [], []
        for failure in reply.failures:
            reason = f"{failure.exc_type}: {failure.message} (in {failure.method})"
            if healing.admit((failure.env_index,), ENV_ERROR, reason, failure.traceback):
                rebuilding.append(failure.env_index)
                self._standins[failure.env_index] = (healing.failures[-1], ENV_RESTARTED)
            else:
                kept.append(failure)  # past the budget: raised as without healing
        if not rebuilding:
            return reply
        ids = tuple(rebuilding)
        self._per_env()
        self._sent_at[list(ids)] = time.monotonic()
        self.backend.dispatch(Rebuild(ids, tuple(self._sources[i] for i in ids), healing.fresh_seeds(ids)))
        answered = tuple(i for i in reply.env_ids if i not in rebuilding)
        return Done(Step, answered, reply.values, tuple(kept), reply.info)
