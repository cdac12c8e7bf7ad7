"""The ledger of per-env call states, on its own: its transitions against a plain model.

The model keeps one state, one send time and one send position per env in
dicts; the ledger keeps arrays and a shortcut for calls of every env. Any
sequence of legal transitions must leave both telling the same story.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parallelenv.array_kinds import Selection
from parallelenv.tracking.ledger import IDLE, PENDING, READY, Ledger

NUM_ENVS = 5
CALL_TIMEOUT = 10.0


def _selection(ids: list[int], num_envs: int = NUM_ENVS) -> Selection:
    return Selection.of(np.array(ids, dtype=np.int64), num_envs)


class LedgerAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(NUM_ENVS)
        self.state = dict.fromkeys(range(NUM_ENVS), IDLE)
        self.sent_at: dict[int, float] = {}
        self.order: dict[int, int] = {}
        self.next_order = 0
        self.now = 0.0

    def _in(self, state: int) -> list[int]:
        return [i for i in range(NUM_ENVS) if self.state[i] == state]

    def _some(self, data: st.DataObject, ids: list[int], everyone_likely: bool = True) -> list[int]:
        """A non-empty list of distinct ``ids`` in a drawn order; often all of them, in id order."""
        if everyone_likely and data.draw(st.booleans()):
            return sorted(ids)
        return data.draw(st.permutations(ids).flatmap(lambda p: st.integers(1, len(p)).map(lambda k: p[:k])))

    @rule(seconds=st.floats(0.0, 12.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: any(s == IDLE for s in self.state.values()))
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        ids = self._some(data, self._in(IDLE))
        selection = _selection(ids)
        quiet = all(s == IDLE for s in self.state.values())
        self.ledger.number(selection)
        for i in ids:
            self.order[i] = self.next_order
            self.next_order += 1
        whole = self.ledger.dispatched(selection, self.now)
        assert whole == (quiet and len(ids) == NUM_ENVS and ids == sorted(ids))
        for i in ids:
            self.state[i], self.sent_at[i] = PENDING, self.now
        if data.draw(st.integers(0, 9)) == 0:  # the backend refused the call
            self.ledger.reverted(selection)
            for i in ids:
                self.state[i] = IDLE

    @precondition(lambda self: any(s == IDLE for s in self.state.values()))
    @rule(data=st.data())
    def none_results(self, data: st.DataObject) -> None:
        ids = self._some(data, self._in(IDLE), everyone_likely=False)
        self.ledger.number(_selection(ids))
        for i in ids:
            self.order[i] = self.next_order
            self.next_order += 1
        self.ledger.none_results(np.array(ids, dtype=np.int64))
        for i in ids:
            self.state[i] = READY

    @precondition(lambda self: any(s == PENDING for s in self.state.values()))
    @rule(data=st.data(), step=st.booleans())
    def answer(self, data: st.DataObject, step: bool) -> None:
        ids = sorted(self._some(data, self._in(PENDING)))
        first = ids[0]
        rows = slice(first, first + len(ids)) if ids[-1] - first == len(ids) - 1 else np.array(ids)
        self.ledger.answered(tuple(ids), rows, step)
        for i in ids:
            self.state[i] = READY if step else IDLE

    @rule(data=st.data())
    def receive(self, data: st.DataObject) -> None:
        ids = self._some(data, list(range(NUM_ENVS)))
        self.ledger.received(_selection(ids))
        for i in ids:
            if self.state[i] == READY:
                self.state[i] = IDLE

    @precondition(lambda self: any(s == PENDING for s in self.state.values()))
    @rule(data=st.data())
    def resend(self, data: st.DataObject) -> None:
        ids = self._some(data, self._in(PENDING), everyone_likely=False)
        self.ledger.resent(ids, self.now)
        for i in ids:
            self.sent_at[i] = self.now

    @precondition(lambda self: any(s == PENDING for s in self.state.values()))
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        ids = self._some(data, self._in(PENDING), everyone_likely=False)
        self.ledger.lost(np.array(ids, dtype=np.int64))
        for i in ids:
            self.state[i] = IDLE

    @invariant()
    def counts_agree(self) -> None:
        assert self.ledger.num_pending == len(self._in(PENDING))
        assert self.ledger.num_ready == len(self._in(READY))
        assert self.ledger.quiet == (not self._in(PENDING) and not self._in(READY))

    @invariant()
    def states_agree(self) -> None:
        assert self.ledger.states().tolist() == [self.state[i] for i in range(NUM_ENVS)]
        every = np.arange(NUM_ENVS)
        assert self.ledger.busy(every).tolist() == [i for i in range(NUM_ENVS) if self.state[i] != IDLE]
        assert self.ledger.pending_among(every).tolist() == self._in(PENDING)
        for i in range(NUM_ENVS):
            assert self.ledger.any_pending(_selection([i])) == (self.state[i] == PENDING)
        assert self.ledger.any_pending(_selection(list(range(NUM_ENVS)))) == bool(self._in(PENDING))

    @invariant()
    def ready_in_send_order(self) -> None:
        expected = sorted(self._in(READY), key=lambda i: self.order[i])
        assert self.ledger.ready_in_send_order().tolist() == expected

    @invariant()
    def hangs_agree(self) -> None:
        pending = self._in(PENDING)
        expected = [i for i in pending if self.sent_at[i] + CALL_TIMEOUT <= self.now]
        assert self.ledger.overdue(CALL_TIMEOUT, self.now) == expected
        if pending:
            hang_at = self.ledger.hang_at(CALL_TIMEOUT, self.now)
            oldest = min(self.sent_at[i] for i in pending) + CALL_TIMEOUT
            # Never later than the true time (a hang is never missed), and exact once it has come.
            assert hang_at <= oldest
            if oldest <= self.now:
                assert hang_at == oldest


LedgerAgainstModel.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
test_ledger_against_model = LedgerAgainstModel.TestCase


def test_a_step_of_every_env_writes_no_row_until_one_is_read() -> None:
    """The shortcut: a quiet call of every env is one entry, and reading any env's state writes it out."""
    ledger = Ledger(3)
    everyone = _selection([0, 1, 2], 3)
    ledger.number(everyone)
    assert ledger.dispatched(everyone, 1.0)
    assert ledger._state.tolist() == [IDLE] * 3  # stale: the entry stands for every env
    assert ledger.states().tolist() == [PENDING] * 3
    ledger.answered((0, 1, 2), slice(None), step=True)
    ledger.received(everyone)
    assert ledger.quiet and ledger.states().tolist() == [IDLE] * 3


@pytest.mark.parametrize("ids", [[1], [2, 0]])
def test_a_call_of_some_envs_is_not_the_shortcut(ids: list[int]) -> None:
    ledger = Ledger(3)
    assert not ledger.dispatched(_selection(ids, 3), 0.0)
    assert ledger.states(np.array(ids)).tolist() == [PENDING] * len(ids)
