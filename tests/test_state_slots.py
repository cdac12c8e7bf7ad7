"""Snapshot states in shared memory (parallelenv.backends.subproc.state_slots): a worker that dies while
it writes leaves the last snapshot whole, a state too large for its slot comes on the pipe and makes
room for the next, and a subproc run keeps its snapshots there, lossless healing exact all the same."""

from __future__ import annotations

import functools
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_lossless_healing import NUM_ENVS, FragileWalker, trajectory

from parallelenv import ParallelEnv, Recycling
from parallelenv.backends.subproc.state_slots import MIN_SLOT_BYTES, SlotState, StateSlots, WorkerSlots
from parallelenv.calls import Reply, Step
from parallelenv.healing import WORKER_RECYCLED
from parallelenv.state.capture import EnvState

pytestmark = pytest.mark.timeout(180)

IDS = (0, 1)


def state(fill: bytes, size: int = 100) -> EnvState:
    return EnvState("protocol", "tests.Env", fill * size)


def snapshot_reply(states: dict[int, Any]) -> Reply:
    return Reply(Step, IDS, {}, states=states)


@pytest.fixture
def ends():
    """A parent's and a worker's end, the slots made from a first snapshot step's states (on the pipe)."""
    parent, worker = StateSlots(len(IDS)), WorkerSlots()
    parent.aim(IDS)
    [first] = parent.fill([snapshot_reply({0: state(b"a"), 1: state(b"a")})])
    assert first.states == {0: state(b"a"), 1: state(b"a")}  # taken as they came
    yield parent, worker
    worker.close()
    parent.close()


class Told:
    """What the parent knows a worker was told (as Worker.told_slots)."""

    told_slots: Any = None


def piped_snapshot(parent: StateSlots, worker: WorkerSlots, states: dict[int, Any], told: Told | None = None) -> Reply:
    """A snapshot step sent on the worker's pipe: what the worker sends back (the states left over)."""
    message = parent.tell(told or Told(), frozenset())
    parent.aim(IDS)
    worker.learn(message, frozenset())
    return worker.keep(snapshot_reply(states))


def test_states_and_refusals_go_to_the_slots(ends):
    parent, worker = ends
    [reply] = parent.fill([piped_snapshot(parent, worker, {0: state(b"a"), 1: state(b"a")})])
    last_of_1 = reply.states[1]
    sent = piped_snapshot(parent, worker, {0: state(b"b"), 1: "its get_state raised"})
    assert sent.states is None, "nothing left for the pipe: the worker answers quietly"
    [reply] = parent.fill([sent])
    kept = reply.states[0]
    assert isinstance(kept, SlotState) and kept.read() == state(b"b")
    assert pickle.loads(pickle.dumps(kept)) == state(b"b")  # what a replay's message carries
    assert reply.states[1] == "its get_state raised"
    # The same refusal again is a word in the slot, and the parent still gives its reason; another reason
    # is written whole; the refusals leave the refused env's last snapshot alone.
    for fill, reason in ((b"c", "its get_state raised"), (b"d", "its get_state raised"), (b"e", "another reason")):
        [reply] = parent.fill([piped_snapshot(parent, worker, {0: state(fill), 1: reason})])
        assert reply.states[1] == reason and reply.states[0].read() == state(fill)
    assert last_of_1.read() == state(b"a")


def test_a_first_snapshot_step_of_refusals_alone_makes_the_slots():
    parent, worker = StateSlots(len(IDS)), WorkerSlots()
    try:
        parent.aim(IDS)
        [first] = parent.fill([snapshot_reply({0: "no way", 1: "no way"})])
        assert first.states == {0: "no way", 1: "no way"}
        told = Told()
        sent = piped_snapshot(parent, worker, {0: "no way", 1: "no way"}, told)
        assert sent.states is None and parent.all_told([told], frozenset())  # the next ones are announced
        [reply] = parent.fill([sent])
        assert reply.states == {0: "no way", 1: "no way"}
    finally:
        worker.close()
        parent.close()


def test_a_worker_dying_while_it_writes_leaves_the_last_snapshot_whole(ends):
    parent, worker = ends
    [reply] = parent.fill([piped_snapshot(parent, worker, {0: state(b"b"), 1: state(b"b")})])
    last = reply.states[0]
    # The next snapshot step, announced as a counted step, writes the other slot; its worker dies unanswered.
    parent.aim(IDS, announce=True)
    step = worker.announced(Step(IDS))
    assert step.snapshot == frozenset()
    worker.keep(snapshot_reply({0: state(b"c"), 1: state(b"c")}))
    parent.lost(list(IDS))
    assert last.read() == state(b"b")
    # Its replacement writes that slot again, never the last snapshot's.
    fresh = WorkerSlots()
    [reply] = parent.fill([piped_snapshot(parent, fresh, {0: state(b"d"), 1: state(b"d")})])
    assert reply.states[0].read() == state(b"d") and last.read() == state(b"b")
    fresh.close()
    assert worker.announced(Step(IDS)) == Step(IDS)  # no step announced since: none taken


def test_a_state_too_large_for_its_slot_comes_on_the_pipe_and_makes_room(ends):
    parent, worker = ends
    large = state(b"e", 2 * MIN_SLOT_BYTES)
    sent = piped_snapshot(parent, worker, {0: large, 1: state(b"e")})
    assert set(sent.states) == {0}
    [reply] = parent.fill([sent])
    small = reply.states[1]
    assert reply.states[0] == large and small.read() == state(b"e")
    told = Told()
    told.told_slots = (object(), frozenset())  # it knows the old slots
    [reply] = parent.fill([piped_snapshot(parent, worker, {0: large, 1: state(b"f")}, told)])
    assert told.told_slots[0] is not None and parent.all_told([told], frozenset())
    assert reply.states[0].read() == large and reply.states[1].read() == state(b"f")
    assert small.read() == state(b"e"), "a state kept in the smaller slots lives on with them"
    # A refusal the worker wrote to the old slots, whose answer the larger slots made the parent drop: the
    # worker gives the reason again in the new slots, not "again".
    worker.learn(parent.tell(Told(), frozenset()), frozenset())
    parent.aim(IDS)
    worker.keep(snapshot_reply({0: state(b"g"), 1: "dropped reason"}))
    parent._make(3 * MIN_SLOT_BYTES)
    [reply] = parent.fill([piped_snapshot(parent, worker, {0: state(b"h"), 1: "dropped reason"}, Told())])
    assert reply.states[1] == "dropped reason"
    parent.close()
    with pytest.raises(ValueError, match="closed"):
        small.read()  # the smaller slots went with the larger ones, though a state kept from them lives


class Diary(FragileWalker):
    """A FragileWalker with the state protocol and a state that grows with each step: past the slots'
    room after a few dozen steps."""

    def __init__(self, tag: int, marker: str) -> None:
        super().__init__(tag, marker)
        self.pages: list[bytes] = []

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pages.append(self.np_random.bytes(512))
        return super().step(action)

    def get_state(self) -> Any:
        return self.position, self.elapsed, self.np_random.bit_generator.state, list(self.pages)

    def set_state(self, saved: Any) -> None:
        self.position, self.elapsed, self.np_random.bit_generator.state, pages = saved
        self.pages = list(pages)


def diary(tag: int, marker: str) -> gym.Env:
    return Diary(tag, marker)


def test_a_subproc_run_keeps_its_snapshots_in_the_slots_and_heals_exactly_as_they_grow(tmp_path):
    marker = str(tmp_path / "fault")
    envs = [functools.partial(diary, tag, marker) for tag in range(NUM_ENVS)]
    actions = [np.random.default_rng(t).integers(0, 3, NUM_ENVS) for t in range(100)]
    with ParallelEnv(envs, asynchronous="restart") as reference:
        unfaulted = trajectory(reference, actions, None, "killed")
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, asynchronous="restart", on_worker_failure="restart",
                     snapshots=10) as penv:
        healed = trajectory(penv, actions, marker, "killed")
        kept = penv._calls.journal.states
        failures = penv.failures
    assert all(isinstance(s, SlotState) for s in kept), kept
    for a, b in zip(unfaulted, healed, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert [sorted(f.restored) for f in failures] == [[2, 3], [0, 1]]


def test_recycled_workers_envs_go_on_from_their_snapshots_in_the_slots(tmp_path):
    """Workers replaced on purpose, every 25 steps, with snapshots every 10 kept in the slots: the run is
    the unfaulted one, and each replacement is logged with the envs put back."""
    marker = str(tmp_path / "never")
    envs = [functools.partial(diary, tag, marker) for tag in range(NUM_ENVS)]
    actions = [np.random.default_rng(t).integers(0, 3, NUM_ENVS) for t in range(100)]
    with ParallelEnv(envs, asynchronous="restart") as reference:
        unfaulted = trajectory(reference, actions, None, "")
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, asynchronous="restart", snapshots=10,
                     recycle=Recycling(steps=25)) as penv:
        recycled = trajectory(penv, actions, None, "")
        failures = penv.failures
    for a, b in zip(unfaulted, recycled, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert failures and {f.kind for f in failures} == {WORKER_RECYCLED}
    assert all(set(f.restored) == set(f.env_ids) for f in failures), failures
