"""A pool worker lost (dead, or hung past ``call_timeout``) and another in its place.

:class:`ReplacesWorkers` is the part of :class:`~parallelenv.RolloutPool`
that starts the replacement with the current weights and the env updates
its predecessor had, and has it serve again what was waiting on the lost
one. Without snapshots its envs start fresh episodes, and what the lost
one was collecting is logged as :class:`~parallelenv.pool.LostWork`. With
``RolloutPool(snapshots=True)`` each worker sends, with every batch it
collects, its collection as it stands after it (``VecWorker.saved``): the
replacement goes on from the last one, so the batches it collects again
continue every episode in flight, and nothing is lost; where an env's state
cannot be taken, the failure log says why and the worker is replaced as
without snapshots.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from parallelenv.pool.errors import PoolWorkerError
from parallelenv.pool.messages import SERVED_AGAIN, Chunk, Collect, CollectEpisodes, ResumeCollection, describe
from parallelenv.pool.samples import LostWork


class ReplacesWorkers:
    """RolloutPool's replacement of a lost worker (see the module's docstring); it uses RolloutPool's own calls."""

    _healing: Any
    _lost: list[LostWork]
    _fleet: Any
    _snapshots: bool

    def _replace(self, slot: Any, reason: str, kind: str) -> None:
        what = f"worker {slot.index}: {reason}"
        if not slot.started and slot.restarts == 0:  # the pool's own start: its caller learns why
            self.close()  # type: ignore[attr-defined]
            raise PoolWorkerError(slot.index, slot.env_ids, "building its envs and policy", "WorkerDied", reason)
        if not self._healing.admit(slot.env_ids, kind, what if slot.resume_from is not None or not self._snapshots
                                   else f"{what}; its envs restart their episodes: {slot.unsaved}"):
            self.close()  # type: ignore[attr-defined]
            raise self._healing.over_budget(list(slot.env_ids), what)
        if slot.resume_from is not None:  # served again from the last batch's end: no episode is cut
            self._healing.name_restored(self._healing.failures[-1], list(slot.env_ids), {})
        elif slot.started:  # a replacement that died before it started (a node not yet known lost) began nothing
            self._lost.extend(LostWork(slot.index, slot.env_ids, s.policy_version, describe(s.request), reason)
                              for s in slot.sent if isinstance(s.request, (Collect, CollectEpisodes)))
        # In the order they were sent; a resume this pool sent to a replacement is sent again by _start.
        again = [s for s in slot.sent if isinstance(s.request, SERVED_AGAIN)
                 and not (isinstance(s.request, ResumeCollection) and s.call < 0)]
        self._fleet.kill(slot.handle)
        slot.restarts += 1
        slot.sent = deque()
        self._start(slot)  # type: ignore[attr-defined]
        for s in again:
            self._send(slot, s.request, call=s.call)  # type: ignore[attr-defined]

    def _keep_snapshot(self, slot: Any, chunk: Chunk) -> None:
        """The collection a worker sent with its batch: where a replacement goes on from."""
        slot.delivered = True
        if isinstance(chunk.saved, bytes):
            slot.resume_from, slot.unsaved = chunk.saved, ""
        elif isinstance(chunk.saved, str):
            slot.resume_from, slot.unsaved = None, chunk.saved

    def _resume_replacement(self, slot: Any) -> None:
        """A replacement's first request after its start: go on from the last snapshot, if any."""
        if slot.resume_from is not None:
            self._send(slot, ResumeCollection(slot.resume_from))  # type: ignore[attr-defined]
