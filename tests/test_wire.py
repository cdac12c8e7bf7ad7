"""The subproc backend's wire (parallelenv.backends.subproc.wire): every kind of message, encoded and read back.

These run in one process: what they guard is the table from header byte to
encoder and decoder, which a wrong byte breaks for every call of that kind
without any env misbehaving.
"""

from __future__ import annotations

import multiprocessing
import select
import threading

import numpy as np
import pytest
from envs import CountingEnv
from gymnasium import spaces

from parallelenv.backends.buffers import Buffers
from parallelenv.backends.env_group import EnvGroup
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.countdown import Countdown
from parallelenv.backends.subproc.worker import Attach, _serve
from parallelenv.batching import zeros
from parallelenv.calls import CallMethod, Failure, GetAttr, Rebuild, ReplaceEnv, Reply, Reset, SetAttr, Step, split_call

GROUP = (4, 5, 6, 7)  # a worker's envs: the second group of 8


def fixed_buffers(spare_obs_slots: int = 0) -> Buffers:
    return Buffers.allocate(spaces.Box(0, 1, (3,)), spaces.Discrete(2), 8, zeros, spare_obs_slots=spare_obs_slots)


def text_buffers() -> Buffers:
    """Buffers whose observations and actions have no fixed shape: their rows travel in the messages."""
    return Buffers.allocate(spaces.Text(8), spaces.Text(8), 8, zeros)


def read(message: bytes, buffers: Buffers | None = None) -> tuple[object, bool]:
    return wire.decode_call(message, wire.CallReader(GROUP, buffers))


def kind(message: bytes) -> wire.Kind:
    return next(k for k in wire.KINDS if k.header == message[:1])


# ---------------------------------------------------------------- calls


@pytest.mark.parametrize("counted", [False, True])
def test_a_step_of_the_whole_group_is_its_header_and_obs_slot(counted):
    message = wire.encode_call(Step(GROUP), GROUP, counted, fixed_buffers())
    assert message == (b"c" if counted else b"s") + bytes([0])
    assert kind(message) is (wire.COUNTED_GROUP_STEP if counted else wire.GROUP_STEP)
    assert read(message) == (Step(GROUP), counted)


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("trusted", [frozenset(), frozenset({"a.Env", "b.Other"})])
def test_a_snapshot_step_of_the_whole_group_is_its_header_obs_slot_and_trusted_classes(counted, trusted):
    buffers = fixed_buffers(spare_obs_slots=1)
    buffers.use_obs_slot(1)
    message = wire.encode_call(Step(GROUP, snapshot=trusted), GROUP, counted, buffers, worker_obs_slot=1)
    assert kind(message) is (wire.COUNTED_SNAPSHOT_STEP if counted else wire.SNAPSHOT_STEP)
    assert wire.is_counted(message) is counted
    worker = fixed_buffers(spare_obs_slots=1)
    assert read(message, worker) == (Step(GROUP, snapshot=trusted), counted)
    assert worker.obs_slot == 1


def test_a_step_of_the_whole_group_names_the_obs_slot_it_writes_into():
    parent, worker = fixed_buffers(spare_obs_slots=2), fixed_buffers(spare_obs_slots=2)
    parent.use_obs_slot(2)
    message = wire.encode_call(Step(GROUP), GROUP, False, parent, worker_obs_slot=0)
    assert message == b"s\x02"  # the slot is in the step itself: no switch before it
    read(message, worker)
    assert worker.obs_slot == 2 and worker.obs is worker.obs_slots[2]


def test_a_step_of_some_envs_is_their_ids_as_int32():
    ids = (5, 7, 70000)  # beyond 16 bits
    message = wire.encode_call(Step(ids), GROUP)
    assert kind(message) is wire.STEP_OF_SOME
    assert message[1:] == np.array(ids, dtype=np.int32).tobytes()
    assert len(message) == 1 + 4 * len(ids)
    assert read(message) == (Step(ids), False)


@pytest.mark.parametrize(("ids", "counted"), [((5, 6), False), (GROUP, False), (GROUP, True)])
def test_a_step_with_actions_of_no_fixed_shape_carries_their_rows(ids, counted):
    parent, worker = text_buffers(), text_buffers()
    for env_id in ids:
        parent.actions[env_id] = f"act{env_id}"
    message = wire.encode_call(Step(ids), GROUP, counted, parent)
    assert kind(message) is (wire.COUNTED_STEP_WITH_ROWS if counted else wire.STEP_WITH_ROWS)
    assert read(message, worker) == (Step(ids), counted)
    assert [worker.actions[i] for i in ids] == [f"act{i}" for i in ids]
    assert all(worker.actions[i] is None for i in range(8) if i not in ids)


def test_only_a_step_of_the_whole_group_can_be_counted():
    # A worker told to count a step of some would answer on its pipe while the parent slept on the countdown.
    with pytest.raises(ValueError, match="whole group"):
        wire.encode_call(Step((4, 5)), GROUP, counted=True)
    with pytest.raises(ValueError, match="whole group"):
        wire.encode_call(GetAttr(GROUP, "tag"), GROUP, counted=True)
    with pytest.raises(ValueError, match="whole group"):  # rows of no fixed shape or not
        wire.encode_call(Step((4, 5)), GROUP, counted=True, buffers=text_buffers())


def test_the_awaited_flag_is_the_backends_to_act_on_not_the_workers():
    # A worker's step is the same message whether its caller awaits the step or not:
    # the backend turns the flag into a counted step, or not (see test_subproc_countdown).
    for ids in (GROUP, (5, 6)):
        assert wire.encode_call(Step(ids, awaited=True), GROUP) == wire.encode_call(Step(ids), GROUP)
    assert split_call(Step((1, 2, 3), awaited=True), [0, 2]) == Step((1, 3), awaited=True)


@pytest.mark.parametrize(
    "call",
    [
        Reset(GROUP, (1, None, 3, None), ({"start": 2}, None, None, None)),
        GetAttr((5,), "tag"),
        SetAttr((4, 6), "delay", 0.25),
        CallMethod(GROUP, "add", (1, 2, 3, 4)),
        ReplaceEnv((5,), ("factory",)),
        Rebuild((6,), ("factory",), (7,)),
        Step(GROUP, live=np.array([True, False, True, True])),  # a mask travels pickled
    ],
    ids=lambda call: type(call).__name__,
)
def test_any_other_call_round_trips_pickled(call):
    message = wire.encode_call(call, GROUP, buffers=fixed_buffers())
    assert kind(message) is wire.CALL
    decoded, counted = read(message)
    assert not counted
    if type(call) is Step:
        assert decoded.env_ids == call.env_ids and decoded.live.tolist() == call.live.tolist()
    else:
        assert decoded == call


def test_a_call_for_a_worker_in_another_obs_slot_switches_it_first():
    parent, worker = fixed_buffers(spare_obs_slots=1), fixed_buffers(spare_obs_slots=1)
    worker.use_obs_slot(1)
    call = Reset((5,), (0,), (None,))
    message = wire.encode_call(call, GROUP, buffers=parent, worker_obs_slot=1)
    assert message[:2] == b"u\x00" and kind(message[2:]) is wire.CALL
    assert read(message, worker) == (call, False)
    assert worker.obs_slot == 0
    # A worker already in the buffers' slot is sent the call alone.
    assert wire.encode_call(call, GROUP, buffers=parent, worker_obs_slot=0) == message[2:]
    some = wire.encode_call(Step((5,)), GROUP, buffers=parent, worker_obs_slot=1)
    assert some[:2] == b"u\x00" and read(some, worker) == (Step((5,)), False)


def test_attach_and_close():
    attach = Attach("psm_name", spaces.Box(0, 1, (3,)), spaces.Discrete(2), 8, True, 1)
    message = wire.ATTACH.encode(attach)
    assert wire.decode_attach(message) == attach
    assert wire.decode_attach(wire.CLOSING) is None  # closed while it started
    assert read(wire.CLOSING) == (None, False)


# ---------------------------------------------------------------- replies


def test_a_quiet_step_reply_is_empty():
    assert wire.encode_reply(Reply(Step, GROUP, {})) == wire.QUIET == b""
    assert wire.decode_reply(b"", GROUP) == Reply(Step, GROUP, {})


@pytest.mark.parametrize(
    "reply",
    [
        Reply(Step, GROUP, {5: {"count": 2}}),
        Reply(Step, GROUP, {}, (Failure(6, "step", "ValueError", "bad", "tb"),)),
        Reply(Step, GROUP, {}, info={"count": np.arange(4)}),
        Reply(GetAttr, (5,), {5: [1, 2]}),
        Reply(SetAttr, (4, 6), {4: None, 6: None}),
    ],
    ids=["info", "failure", "batched info", "getattr", "setattr"],
)
def test_a_reply_round_trips(reply):
    message = wire.encode_reply(reply)
    assert kind(message) is wire.DONE
    decoded = wire.decode_reply(message, reply.env_ids)
    assert (decoded.call_type, decoded.env_ids, decoded.failures) == (reply.call_type, reply.env_ids, reply.failures)
    assert repr(decoded.values) == repr(reply.values) and repr(decoded.info) == repr(reply.info)


def test_a_reply_with_observations_of_no_fixed_shape_carries_their_rows():
    worker, parent = text_buffers(), text_buffers()
    for env_id in GROUP:
        worker.obs[env_id] = f"obs{env_id}"
    message = wire.encode_reply(Reply(Step, GROUP, {}), worker)  # quiet, but its rows must travel
    assert kind(message) is wire.DONE_WITH_ROWS
    assert wire.decode_reply(message, GROUP, parent) == Reply(Step, GROUP, {})
    assert [parent.obs[i] for i in GROUP] == [f"obs{i}" for i in GROUP]
    # A call that leaves no results brings no rows.
    assert kind(wire.encode_reply(Reply(GetAttr, GROUP, dict.fromkeys(GROUP)), worker)) is wire.DONE


def test_a_value_that_cannot_travel_back_fails_its_env_only():
    reply = Reply(GetAttr, (4, 5), {4: threading.Lock(), 5: "fine"})
    decoded = wire.decode_reply(wire.encode_reply(reply), reply.env_ids)
    assert decoded.values == {5: "fine"}
    assert decoded.failed_ids() == [4] and "cannot be sent back" in decoded.failures[0].message


def test_a_call_the_worker_could_not_read_fails_every_env_of_it():
    decoded = wire.decode_reply(wire.unreadable(ModuleNotFoundError("No module named 'mine'")), (4, 5))
    assert kind(wire.unreadable(ValueError())) is wire.UNREADABLE
    assert decoded.failed_ids() == [4, 5]
    assert decoded.failures[0].exc_type == "ModuleNotFoundError"
    assert "could not read the call: No module named 'mine'" in decoded.failures[0].message


# ---------------------------------------------------------------- the table


def test_every_kind_has_a_header_byte_of_its_own():
    headers = [k.header for k in wire.KINDS]
    assert all(len(header) == 1 for header in headers)
    assert len(set(headers)) == len(headers)
    assert b"\x80" not in headers  # a worker's startup report is a plain pickle


def test_an_unknown_header_byte_is_a_clear_error():
    with pytest.raises(wire.UnknownMessage, match=r"expected a call, got header byte b'z'.*b's' \(step"):
        read(b"z123")
    with pytest.raises(wire.UnknownMessage, match="expected a call, got an empty message"):
        read(b"")
    with pytest.raises(wire.UnknownMessage, match=r"expected a reply, got header byte b'z'"):
        wire.decode_reply(b"z", GROUP)
    # Each end reads only its own kinds: a reply is no call, nor a call a reply.
    with pytest.raises(wire.UnknownMessage, match=r"expected a call, got header byte b'd'"):
        read(wire.encode_reply(Reply(GetAttr, GROUP, {})))
    with pytest.raises(wire.UnknownMessage, match=r"expected a reply, got header byte b's'"):
        wire.decode_reply(wire.encode_call(Step(GROUP), GROUP), GROUP)
    with pytest.raises(wire.UnknownMessage, match="expected a attach or close"):
        wire.decode_attach(wire.encode_call(Step(GROUP), GROUP))


# ---------------------------------------------------------------- a worker reading them


@pytest.mark.timeout(60)
def test_a_worker_answers_each_kind_by_its_header():
    """``_serve`` on a thread, with a pipe: plain and counted steps, an unknown header, then close."""
    ctx = multiprocessing.get_context("spawn")
    countdown = Countdown(ctx, 1)
    buffers = Buffers.allocate(CountingEnv.observation_space, CountingEnv.action_space, 2, zeros)
    group = EnvGroup([CountingEnv(0, 100), CountingEnv(1, 100)], first_id=0, restart=False)
    group.attach(buffers)
    parent, child = ctx.Pipe(duplex=True)
    worker = threading.Thread(target=_serve, args=(child, group, 0.0, countdown.for_worker(0)), daemon=True)
    worker.start()
    all_ids = (0, 1)

    def send(message: bytes) -> None:
        parent.send_bytes(message)
        countdown.ring()  # as the backend wakes a worker that sleeps on the countdown's words

    plain = wire.encode_call(Step(all_ids), all_ids, counted=False, buffers=buffers)
    counted = wire.encode_call(Step(all_ids), all_ids, counted=True, buffers=buffers)
    try:
        send(plain)  # count 1: no info
        assert parent.recv_bytes() == wire.QUIET
        countdown.arm()
        send(counted)  # count 2: an info, which follows on the pipe
        assert _countdown_completes(countdown) and not countdown.answered_quietly(0)
        assert wire.decode_reply(parent.recv_bytes(), all_ids, buffers).values == {0: {"count": 2}, 1: {"count": 2}}
        countdown.arm()
        send(counted)  # count 3: answered through the countdown alone
        assert _countdown_completes(countdown) and countdown.answered_quietly(0)
        assert not parent.poll(0.2)
        assert buffers.obs[:, 1].tolist() == [3, 3]
        send(b"z")
        decoded = wire.decode_reply(parent.recv_bytes(), all_ids, buffers)
        assert "header byte b'z'" in decoded.failures[0].message
        send(wire.CLOSING)
        worker.join(timeout=10)
        assert not worker.is_alive()
    finally:
        parent.close()
        child.close()
        countdown.close()


def _countdown_completes(countdown: Countdown) -> bool:
    poll = select.poll()
    poll.register(countdown.fileno(), select.POLLIN)
    return bool(poll.poll(10_000)) and countdown.complete()
