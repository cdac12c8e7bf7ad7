"""Where each env's call stands: one table, changed only through named transitions.

Every env is IDLE (nothing outstanding), PENDING (a call was dispatched, no
answer yet) or READY (a step's result arrived and waits to be received)::

    IDLE --dispatched--> PENDING --answered(step)--> READY --received--> IDLE
    IDLE --none_results----------------------------> READY
    PENDING --answered(other call) | reverted | lost--> IDLE

The ledger also keeps when each pending call was sent (to declare hangs)
and the order of sends (recv hands results over in it). A training loop's
step of every env with nothing else outstanding is kept as one entry for
all envs instead of writing each env's row: the table is written out only
when a call of some envs needs it, inside this class and nowhere else.
"""

from __future__ import annotations

import enum

import numpy as np

from parallelenv.array_kinds import Selection


class EnvState(enum.IntEnum):
    IDLE = 0
    PENDING = 1
    READY = 2


# Plain ints for the hot path: comparing an int8 array with an IntEnum member
# goes through enum's attribute machinery on every call.
IDLE, PENDING, READY = int(EnvState.IDLE), int(EnvState.PENDING), int(EnvState.READY)


class Ledger:
    """The state of every env's call, with the counts, send times and send order that go with it."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.num_pending = 0
        self.num_ready = 0
        self._ids = np.arange(num_envs)
        self._state = np.zeros(num_envs, dtype=np.int8)
        self._sent_at = np.zeros(num_envs)
        self._send_order = np.zeros(num_envs, dtype=np.int64)
        self._next_order = 0
        # No later than the oldest pending call's dispatch: answers only make
        # the true value later, so it is recomputed only once a hang seems due.
        self._oldest_sent = 0.0
        # While not None, every env is in state ``_whole`` (PENDING: sent at
        # ``_whole_sent_at``), and, while ``_whole_order`` is not None, envs
        # were numbered in id order from it; the per-env arrays are stale.
        self._whole: int | None = IDLE
        self._whole_sent_at = 0.0
        self._whole_order: int | None = None

    # ------------------------------------------------------------- reading

    @property
    def quiet(self) -> bool:
        """No env has a call under way or a result waiting."""
        return self.num_pending == 0 and self.num_ready == 0

    def states(self, ids: np.ndarray | slice = slice(None)) -> np.ndarray:
        """The state of the envs ``ids`` (a copy)."""
        self._write_out()
        return self._state[ids].copy()

    def busy(self, ids: np.ndarray) -> np.ndarray:
        """The envs of ``ids`` that are not IDLE."""
        if self.num_pending == 0 and self.num_ready == 0:  # a training loop's every step: no property call
            return ids[:0]
        self._write_out()
        return ids[self._state[ids] != IDLE]

    def any_pending(self, selection: Selection) -> bool:
        if self.num_pending == 0:
            return False
        if selection.everyone:
            return True
        self._write_out()
        return bool((self._state[selection.ids] == PENDING).any())

    def pending_among(self, ids: np.ndarray) -> np.ndarray:
        """The envs of ``ids`` that are PENDING."""
        self._write_out()
        return ids[self._state[ids] == PENDING]

    def ready_in_send_order(self) -> np.ndarray:
        """The READY envs, in the order they were sent to."""
        self._write_out()
        ready = np.flatnonzero(self._state == READY)
        return ready[np.argsort(self._send_order[ready], kind="stable")]

    def hang_at(self, call_timeout: float, now: float) -> float:
        """When the oldest pending call will have hung; exact whenever that time has come."""
        if self._oldest_sent + call_timeout <= now:
            self._write_out()
            self._oldest_sent = float(self._sent_at[self._state == PENDING].min())
        return self._oldest_sent + call_timeout

    def overdue(self, call_timeout: float, now: float) -> list[int]:
        """The PENDING envs sent ``call_timeout`` or more before ``now``."""
        self._write_out()
        return np.flatnonzero((self._state == PENDING) & (self._sent_at + call_timeout <= now)).tolist()

    # ------------------------------------------------------------- transitions

    def number(self, selection: Selection) -> None:
        """Give the envs of ``selection`` the next places in the send order, in its order."""
        if selection.everyone and self.num_pending == 0 and self.num_ready == 0:
            self._whole_order = self._next_order
        else:
            self._write_out()
            self._send_order[selection.ids] = self._next_order + self._ids[: selection.count]
        self._next_order += selection.count

    def dispatched(self, selection: Selection, now: float, numbered: bool = True) -> bool:
        """IDLE -> PENDING, sent at ``now``, and given the next places in the send order unless
        ``numbered`` already; whether this is a call of every env with nothing else outstanding (no
        result of another call is then left in the backend's buffers)."""
        whole = selection.everyone and self.num_pending == 0 and self.num_ready == 0
        if whole:
            if not numbered:  # number()'s own case of a whole call, without its call on every step
                self._whole_order = self._next_order
                self._next_order += self.num_envs
            self._whole, self._whole_sent_at = PENDING, now
        else:
            if not numbered:
                self.number(selection)
            self._write_out()
            self._state[selection.rows] = PENDING
            self._sent_at[selection.rows] = now
        if self.num_pending == 0:
            self._oldest_sent = now
        self.num_pending += selection.count
        return whole

    def reverted(self, selection: Selection) -> None:
        """PENDING -> IDLE for a dispatch the backend refused before it reached any env."""
        if self._whole is not None:
            self._whole = IDLE
        else:
            self._state[selection.rows] = IDLE
        self.num_pending -= selection.count

    def answered(self, env_ids: tuple[int, ...], rows: slice | np.ndarray, step: bool) -> None:
        """PENDING -> READY for a step's answer, PENDING -> IDLE for any other call's.
        ``rows`` indexes the envs ``env_ids`` (distinct, all PENDING)."""
        new = READY if step else IDLE
        if self._whole == PENDING and len(env_ids) == self.num_envs:
            self._whole = new
        else:
            self._write_out()
            self._state[rows] = new
        self.num_pending -= len(env_ids)
        if step:
            self.num_ready += len(env_ids)

    def none_results(self, ids: np.ndarray) -> None:
        """IDLE -> READY without a call: these envs answer with None results."""
        self._write_out()
        self._state[ids] = READY
        self.num_ready += len(ids)

    def received(self, selection: Selection) -> None:
        """READY -> IDLE for the envs of ``selection`` (those not READY are left as they are)."""
        if selection.everyone and self.num_ready == self.num_envs:
            if self._whole is None:
                self._state.fill(IDLE)
            self._whole = IDLE
            self.num_ready = 0
            return
        self._write_out()
        ids = selection.ids
        ready = ids[self._state[ids] == READY]
        self._state[ready] = IDLE
        self.num_ready -= len(ready)

    def resent(self, ids: np.ndarray | list[int], now: float) -> None:
        """PENDING envs whose call was sent again (a stand-in for a rebuilt env): their clock restarts."""
        self._write_out()
        self._sent_at[ids] = now

    def lost(self, ids: np.ndarray) -> None:
        """PENDING -> IDLE: these envs' answers will never come (their worker was replaced)."""
        self._write_out()
        self._state[ids] = IDLE
        self.num_pending -= len(ids)

    def _write_out(self) -> None:
        """Write the per-env arrays that calls of every env left stale (see ``_whole``)."""
        if self._whole_order is not None:
            np.add(self._ids, self._whole_order, out=self._send_order)
            self._whole_order = None
        if self._whole is not None:
            self._state.fill(self._whole)
            if self._whole == PENDING:
                self._sent_at.fill(self._whole_sent_at)
            self._whole = None
