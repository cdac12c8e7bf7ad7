"""Lossless healing's record: each env's last snapshot and everything it was sent since.

With ``ParallelEnv(snapshots=...)``, every ``every`` steps a step takes
the state of its envs where they run, before stepping them, and its reply
brings the states back (:attr:`~parallelenv.calls.Step.snapshot`: a snapshot
costs no call of its own, and no wait but its hosts' time to take it).
Every step's actions and every reset are written down as they are sent
(:meth:`Journal.stepped`, :meth:`Journal.reset`). An env whose worker died is
rebuilt, put back into its snapshot and replays its entries, the step under
way last (:meth:`Journal.replay`): the caller sees what a run without the
fault would have shown. The record of an env is dropped at each of its
snapshots, so it holds about ``every`` steps; an env that no snapshot step
reaches for :data:`KEPT_CADENCES` cadences (finished and idle, or stepped
alone by ``send`` elsewhere) loses its snapshot instead of holding the
record longer. An env whose state cannot be taken
(:meth:`Journal.why_not` says why), or that a call changed since
(``set_env_attr``, a method, a replacement), is rebuilt and reset as
without snapshots until its next snapshot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parallelenv.batching import rows_reader
from parallelenv.calls import Replay
from parallelenv.state.capture import trusted_classes

DEFAULT_SNAPSHOT_EVERY = 100
# How many cadences of entries the record keeps for an env that no snapshot step has reached since.
KEPT_CADENCES = 3
CHANGED_BY_A_CALL = ("a call that the record does not replay (set_env_attr, customized_method, replace_envs, "
                     "set_state) went to it since its last snapshot")


class Journal:
    """The last snapshot of each env and the entries sent to it since (see the module's docstring)."""

    def __init__(self, num_envs: int, every: int) -> None:
        self.every = every
        self.states: list[Any] = [None] * num_envs  # None: no snapshot to go back to (why_not says why)
        self._why_none: dict[int, str] = {}  # why an env has none, where a snapshot step has reached it
        self._snapshot_at = [0] * num_envs  # where each env's entries start in _entries
        self._sent_at: dict[int, int] = {}  # where the entries of each env's snapshot under way will start
        self._entries: list[tuple[str, np.ndarray, Any]] = []  # ("step", ids, actions) or ("reset", ids, call)
        self._first = 0  # the index of _entries[0] in the whole record
        self._steps_since = every - 1  # the first step takes the first snapshot

    def stepped(self, ids: np.ndarray, actions: Any) -> frozenset[str] | None:
        """A step of the envs ``ids`` (in the order of ``actions``'s rows) is sent: the ``Step.snapshot``
        it carries (the classes whose pickle this process trusts), or None where no snapshot is due."""
        at = self._first + len(self._entries)
        self._entries.append(("step", ids.copy(), _copied(actions)))
        self._steps_since += 1
        if self._steps_since < self.every:
            return None
        self._steps_since = 0
        for env_id in ids.tolist():
            self._sent_at[env_id] = at  # taken before this step: its entries start with it
        self._give_up_before(at - KEPT_CADENCES * self.every)
        return trusted_classes()

    def took(self, states: dict[int, Any]) -> None:
        """The states a snapshot step's reply brought (an env's is a str where it could not be taken)."""
        for env_id, state in states.items():
            at = self._sent_at.pop(env_id, None)
            if at is None:  # changed since the step was sent
                continue
            if isinstance(state, str):
                self.states[env_id], self._why_none[env_id] = None, f"its state could not be taken: {state}"
            else:
                self.states[env_id] = state
                self._why_none.pop(env_id, None)
            self._snapshot_at[env_id] = at
        self._drop_unread()

    def reset(self, ids: tuple[int, ...], seeds: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        self._entries.append(("reset", np.array(ids, dtype=np.int64), (seeds, options)))

    def changed(self, env_ids: tuple[int, ...], why: str = CHANGED_BY_A_CALL) -> None:
        """These envs were changed by a call the record cannot replay: no snapshot until the next."""
        for env_id in env_ids:
            if self.states[env_id] is not None or env_id in self._sent_at:
                self._why_none[env_id] = why
            self.states[env_id] = None
            self._sent_at.pop(env_id, None)

    def why_not(self, env_id: int) -> str:
        """Why ``env_id`` has no snapshot to go back to (it is rebuilt and reset instead)."""
        return self._why_none.get(env_id, "no snapshot step had reached it yet")

    def replay(self, env_ids: list[int]) -> Replay:
        """The call that puts ``env_ids`` (each with a snapshot) back where they stand now: the last
        entry of each is the step under way or about to be sent."""
        states, entries = [], []
        for env_id in env_ids:
            states.append(self.states[env_id])
            entries.append(tuple(self._entries_of(env_id)))
        return Replay(tuple(env_ids), tuple(states), tuple(entries))

    def can_replay(self, env_id: int) -> bool:
        return self.states[env_id] is not None

    def _entries_of(self, env_id: int) -> list[tuple[Any, ...]]:
        found = []
        for kind, ids, data in self._entries[self._snapshot_at[env_id] - self._first:]:
            where = np.flatnonzero(ids == env_id)
            if not where.size:
                continue
            position = int(where[0])
            if kind == "step":
                found.append(("step", rows_reader(data)([position])[0]))
            else:
                seeds, options = data
                found.append(("reset", seeds[position], options[position]))
        return found

    def _give_up_before(self, oldest: int) -> None:
        """The envs whose entries start before ``oldest``: no snapshot (a reset on a failure), no entries."""
        for env_id, at in enumerate(self._snapshot_at):
            if at < oldest:
                if self.states[env_id] is not None:
                    self._why_none[env_id] = (f"no snapshot step reached it for {KEPT_CADENCES} cadences of "
                                              f"{self.every} steps, and its snapshot was let go")
                self.states[env_id], self._snapshot_at[env_id] = None, oldest
        self._drop_unread()

    def _drop_unread(self) -> None:
        """Forget the entries that precede every env's snapshot."""
        oldest = min(self._snapshot_at)
        if oldest > self._first:
            del self._entries[: oldest - self._first]
            self._first = oldest


def journal_for(snapshots: Any, num_envs: int, restarts_workers: bool) -> Journal | None:
    """The record ``ParallelEnv(snapshots=...)`` asks for; None where it is off."""
    if snapshots is False or snapshots is None:
        return None
    every = DEFAULT_SNAPSHOT_EVERY if snapshots is True else snapshots
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"snapshots={snapshots!r}; use True (every {DEFAULT_SNAPSHOT_EVERY} steps), a number "
                         "of steps >= 1, or False")
    if not restarts_workers:
        raise ValueError("snapshots= serves healing, which restarts no worker here: pass "
                         "on_worker_failure='restart' (or recycle=) too")
    return Journal(num_envs, every)


def _copied(actions: Any) -> Any:
    if isinstance(actions, np.ndarray):
        return actions.copy()
    if isinstance(actions, dict):
        return {key: _copied(value) for key, value in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_copied(value) for value in actions)
    return list(actions)
