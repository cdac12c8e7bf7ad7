"""How calls and replies travel over a worker's pipe.

Every message starts with a header byte that names its kind, and
:data:`KINDS` is the one table of them: each kind's header, encoder and
decoder. The receiver looks the header up and lets that kind read the rest;
nothing is told apart by what it unpickles to. The one message without a
header is the empty reply (below). While a worker starts, before the first
call, it reports with plain pickles (``Ready`` or a ``Failure``), which the
parent waits for and nothing else; no header is a pickle's first byte.

The message that dominates, a step of every env a worker hosts, is its
header and the obs slot (below), and its reply when no env returned an info
is an empty message: the results themselves are already in shared memory,
and the parent knows which call a reply answers because each worker answers
in the order it was asked. Such a step is *counted* when the parent sleeps
on the countdown rather than on the pipes (see
:mod:`parallelenv.backends.subproc.countdown`); the backend decides it, and its
own header tells the worker. A step of some of a worker's envs (``send`` to
a few envs, or one half of them in overlapped collection) is the header and
their ids as 32-bit integers, not a pickle, which costs the parent far more;
a snapshot step of a whole group (``Step.snapshot``), the obs slot, what the worker
is told of its state slots (:mod:`~parallelenv.backends.subproc.state_slots`) and the classes trusted.

A step's numeric infos go into columns of the shared buffers once the
parent has learned them (:mod:`parallelenv.infos.columns`): it tells
each worker their layout in front of its next call.

Shared buffers may hand observations over in turns (see
``Buffers.use_obs_slot``): a step of a whole group names the slot its
observations go to in a second byte, and any other call that must write
into another slot than the worker's last one is preceded by a switch.

The parts of spaces of no fixed shape are in no shared memory (see
:mod:`parallelenv.batching`): a step carries its envs' rows of such action
parts, and a reply that leaves results carries its envs' rows of such
observation parts, each written into the receiver's buffers on arrival.
Where every part has a fixed shape, nothing of this is sent.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from parallelenv.backends.buffers import Buffers
from parallelenv.backends.subproc.sendable import WithRows, encode, encode_user_data, sendable_pickle
from parallelenv.backends.subproc.state_slots import WorkerSlots
from parallelenv.batching import read_private_rows, write_private_rows
from parallelenv.calls import NO_RESULT_CALLS, Failure, Reply, Step

_STEP_ID = np.dtype(np.int32)
QUIET = b""  # the reply to a step when no env returned an info: its results are all in shared memory


@dataclass(frozen=True)
class Kind:
    """One kind of message, an entry of :data:`KINDS`: its header byte, what follows it, and how it is read.

    ``payload(*args)`` makes what follows the header from the encoder's
    arguments; ``decode`` reads the whole message, header included: on a
    worker with its :class:`CallReader` (a call and whether it is counted),
    on the parent with the env ids and buffers of the call it answers.
    """

    name: str
    header: bytes
    to_worker: bool  # a call, read by a worker; else a reply, read by the parent
    payload: Callable[..., bytes]
    decode: Callable[..., Any]

    def encode(self, *args: Any) -> bytes:
        return self.header + self.payload(*args)


def encode_call(call: Any, group_ids: tuple[int, ...], counted: bool = False, buffers: Buffers | None = None,
                worker_obs_slot: int = 0, tell_slots: Callable[[], bytes] | None = None) -> bytes:
    """A call as the worker will read it; a step carries its actions' rows of ``buffers``' private parts,
    and a call for a worker whose obs slot (``worker_obs_slot``) is not the buffers' now names theirs.
    ``tell_slots``: what a snapshot step of the worker's whole group tells it of its state slots, asked
    only for that message (:meth:`~parallelenv.backends.subproc.state_slots.StateSlots.tell`).

    ``counted``: the call is a step of the worker's whole group ``group_ids``
    that the parent collects through the countdown; the backend decides
    that, from the caller's :attr:`Step.awaited` and what else is in flight.

    cloudpickle, not pickle: a function or class the user defined in the
    script being run (``__main__``) pickles by reference, and the worker's
    ``__main__`` is not that script; cloudpickle sends such objects by value.
    Anything that cannot travel raises here, in the caller, before any worker
    is sent anything.
    """
    obs_slot = 0 if buffers is None else buffers.obs_slot
    private = buffers is not None and buffers.private_actions
    whole_group = type(call) is Step and call.live is None and call.env_ids == group_ids
    if counted and not whole_group:
        # The worker would answer on its pipe, and the parent wait on the countdown for it.
        raise ValueError(f"only a step of a worker's whole group can be counted, not {call!r}")
    if whole_group and not private:
        if call.snapshot is None:
            return (_COUNTED_GROUP_STEPS if counted else _GROUP_STEPS)[obs_slot]
        told = b"" if tell_slots is None else tell_slots()
        return (COUNTED_SNAPSHOT_STEP if counted else SNAPSHOT_STEP).encode(obs_slot, call.snapshot, told)
    if type(call) is Step and private:
        message = (COUNTED_STEP_WITH_ROWS if counted else STEP_WITH_ROWS).encode(call, buffers)
    elif type(call) is Step and call.snapshot is None and call.live is None:
        message = STEP_OF_SOME.encode(call.env_ids)
    else:
        message = CALL.encode(call)
    return message if obs_slot == worker_obs_slot else USE_OBS_SLOT.encode(obs_slot, message)


def _slot(obs_slot: int) -> bytes:
    return bytes([obs_slot])


def _snapshot_step(obs_slot: int, trusted: frozenset[str], told: bytes = b"") -> bytes:
    # The class names whose pickle the caller trusts (Step.snapshot) a line each: no pickle to make or read.
    return bytes([obs_slot]) + len(told).to_bytes(2, "little") + told + "\n".join(sorted(trusted)).encode()


def _step_ids(env_ids: tuple[int, ...]) -> bytes:
    return np.array(env_ids, dtype=_STEP_ID).tobytes()


def _step_with_rows(step: Step, buffers: Buffers) -> bytes:
    rows = read_private_rows(buffers.private_actions, step.env_ids)
    return encode_user_data(WithRows(step, step.env_ids, rows), step)


def _call(call: Any) -> bytes:
    return encode_user_data(call, call)


def _switched(obs_slot: int, message: bytes) -> bytes:
    return bytes([obs_slot]) + message


class CallReader:
    """A worker's end of its pipe: its buffers, and the step of its whole group, made once.

    The action rows a step brings are written into ``buffers`` as it is
    read, and the obs slot a call names is made theirs.
    """

    def __init__(self, group_ids: tuple[int, ...], buffers: Buffers | None = None) -> None:
        self.buffers = buffers
        group_step = Step(group_ids)
        # What the hot path returns: made once, not on every step.
        self.group_step = (group_step, False)
        self.counted_group_step = (group_step, True)
        self.slots = WorkerSlots()  # where snapshot steps leave their states

    def use_obs_slot(self, obs_slot: int) -> None:
        if self.buffers is not None:
            self.buffers.use_obs_slot(obs_slot)


class UnknownMessage(ValueError):
    """A message whose first byte names no kind of message that end reads."""


def decode_call(data: bytes, reader: CallReader) -> tuple[Any, bool]:
    """The call in ``data`` and whether it is counted; ``(None, False)`` when the worker is to close.

    A call that is not a step (``Attach`` included) is what the parent sent, unpickled.
    """
    try:
        kind = _CALLS[data[0]]
    except (KeyError, IndexError):
        raise UnknownMessage(_unknown(data, "call")) from None
    return kind.decode(data, reader)


def is_counted(data: bytes) -> bool:
    """Whether ``data`` is a counted step, from its header bytes alone (an obs slot's or the info columns'
    wrapping skipped): for a call the worker could not read, whose answer the parent awaits on the
    countdown if it was counted."""
    while data:
        kind = _CALLS.get(data[0])
        if kind is USE_OBS_SLOT:
            data = _switched_call(data)
        elif kind is INFO_COLUMNS:
            data = _columns_call(data)[1]
        else:
            return kind in (COUNTED_GROUP_STEP, COUNTED_STEP_WITH_ROWS, COUNTED_SNAPSHOT_STEP)
    return False


def decode_attach(data: bytes) -> Any:
    """What a starting worker reads once it has reported its spaces: the ``Attach``, or None to close."""
    try:
        kind = _CALLS[data[0]]
    except (KeyError, IndexError):
        kind = None
    if kind is not ATTACH and kind is not CLOSE:
        raise UnknownMessage(_unknown(data, "attach or close"))
    return kind.decode(data, CallReader(()))[0]


def _unknown(data: bytes, expected: str) -> str:
    head = f"header byte {data[:1]!r}" if data else "an empty message"
    known = ", ".join(f"{kind.header!r} ({kind.name})" for kind in KINDS)
    return f"expected a {expected}, got {head}; the kinds of message are {known}"


def _read_group_step(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    reader.use_obs_slot(data[1])
    return reader.group_step


def _read_counted_group_step(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    reader.use_obs_slot(data[1])
    return reader.counted_group_step


def _read_snapshot_step(data: bytes, reader: CallReader, counted: bool = False) -> tuple[Step, bool]:
    reader.use_obs_slot(data[1])
    told_end = 4 + int.from_bytes(data[2:4], "little")
    trusted = frozenset(data[told_end:].decode().split("\n")) if len(data) > told_end else frozenset()
    reader.slots.learn(data[4:told_end], trusted)
    return Step(reader.group_step[0].env_ids, snapshot=trusted), counted


def _read_counted_snapshot_step(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    return _read_snapshot_step(data, reader, counted=True)


def _read_step_of_some(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    return Step(tuple(np.frombuffer(data, _STEP_ID, offset=1).tolist())), False


def _read_rows(data: bytes, reader: CallReader) -> Any:
    message = pickle.loads(memoryview(data)[1:])
    assert reader.buffers is not None, "a step with action rows needs the buffers to write them into"
    write_private_rows(reader.buffers.private_actions, message.env_ids, message.rows)
    return message.message


def _read_step_with_rows(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    return _read_rows(data, reader), False


def _read_counted_step_with_rows(data: bytes, reader: CallReader) -> tuple[Step, bool]:
    return _read_rows(data, reader), True


def _read_pickled(data: bytes, reader: CallReader | None = None) -> tuple[Any, bool]:
    return pickle.loads(memoryview(data)[1:]), False


def _switched_call(data: bytes) -> bytes:
    """The call that a USE_OBS_SLOT message wraps."""
    return data[2:]


def _read_switched(data: bytes, reader: CallReader) -> tuple[Any, bool]:
    assert reader.buffers is not None, "an obs slot needs the buffers it is one of"
    reader.use_obs_slot(data[1])
    return decode_call(_switched_call(data), reader)


def _with_columns(columns: tuple[Any, ...], message: bytes) -> bytes:
    layout = pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)
    return len(layout).to_bytes(4, "little") + layout + message


def _columns_call(data: bytes) -> tuple[bytes, bytes]:
    """The pickled column layout of an INFO_COLUMNS message, and the call it wraps."""
    size = int.from_bytes(data[1:5], "little")
    return data[5:5 + size], data[5 + size:]


def _read_with_columns(data: bytes, reader: CallReader) -> tuple[Any, bool]:
    assert reader.buffers is not None and reader.buffers.info_columns is not None, "info columns need the buffers"
    layout, call = _columns_call(data)
    reader.buffers.info_columns.lay_out(pickle.loads(layout))
    return decode_call(call, reader)


def _read_close(data: bytes, reader: CallReader) -> tuple[None, bool]:
    return None, False


def is_quiet(encoded_reply: bytes) -> bool:
    """Whether a step's reply says no more than its results in shared memory do."""
    return encoded_reply == QUIET


@dataclass(frozen=True)
class Unreadable:
    """The reply to a call the worker could not read (a module it cannot import, a header it does not know)."""

    exc_type: str
    message: str
    traceback: str


def unreadable(exc: BaseException) -> bytes:
    failure = Failure.from_exception(-1, "", exc)
    return UNREADABLE.encode(Unreadable(failure.exc_type, failure.message, failure.traceback))


def encode_reply(reply: Reply, buffers: Buffers | None = None) -> bytes:
    """``reply`` as the parent reads it; one that leaves results brings its envs' rows of ``buffers``' private parts."""
    private = buffers.private_obs if buffers is not None else None
    if reply.call_type is Step and not reply.values and not reply.failures and reply.info is None and not private \
            and reply.states is None:
        return QUIET
    if private and reply.call_type not in NO_RESULT_CALLS:
        return DONE_WITH_ROWS.encode(WithRows(reply, reply.env_ids, read_private_rows(private, reply.env_ids)))
    return DONE.encode(reply)


def decode_reply(data: bytes, env_ids: tuple[int, ...], buffers: Buffers | None = None) -> Reply:
    """The reply to the call for ``env_ids``, the oldest this worker has not answered.

    The observation rows it brings are written into ``buffers`` here.
    """
    if data == QUIET:
        return Reply(Step, env_ids, {})
    try:
        kind = _REPLIES[data[0]]
    except KeyError:
        raise UnknownMessage(_unknown(data, "reply")) from None
    return kind.decode(data, env_ids, buffers)


def _read_reply(data: bytes, env_ids: tuple[int, ...], buffers: Buffers | None) -> Reply:
    return pickle.loads(memoryview(data)[1:])


def _read_reply_with_rows(data: bytes, env_ids: tuple[int, ...], buffers: Buffers | None) -> Reply:
    message = pickle.loads(memoryview(data)[1:])
    assert buffers is not None, "a reply with observation rows needs the buffers to write them into"
    write_private_rows(buffers.private_obs, message.env_ids, message.rows)
    return message.message


def _read_unreadable(data: bytes, env_ids: tuple[int, ...], buffers: Buffers | None) -> Reply:
    reply = pickle.loads(memoryview(data)[1:])
    failures = tuple(
        Failure(i, "unpickle", reply.exc_type, f"the worker could not read the call: {reply.message}", reply.traceback)
        for i in env_ids
    )
    # Its envs fail with the reason, whatever the call was (a step's action rows may hold a user's object).
    return Reply(type(None), env_ids, {}, failures)


def _nothing() -> bytes:
    return b""


# The table of every kind of message; the parent sends the first ones, workers the last ones.
GROUP_STEP = Kind("step of the worker's whole group, and its obs slot", b"s", True, _slot, _read_group_step)
COUNTED_GROUP_STEP = Kind("counted step of the worker's whole group, and its obs slot", b"c", True, _slot,
                          _read_counted_group_step)
SNAPSHOT_STEP = Kind("step of the worker's whole group taking their states first (Step.snapshot)", b"t", True,
                     _snapshot_step, _read_snapshot_step)
COUNTED_SNAPSHOT_STEP = Kind("counted step of the worker's whole group taking their states first", b"T", True,
                             _snapshot_step, _read_counted_snapshot_step)
STEP_OF_SOME = Kind("step of some envs, their ids as int32", b"p", True, _step_ids, _read_step_of_some)
STEP_WITH_ROWS = Kind("step with its envs' private action rows", b"r", True, _step_with_rows, _read_step_with_rows)
COUNTED_STEP_WITH_ROWS = Kind("counted step of the worker's whole group with its private action rows", b"R", True,
                              _step_with_rows, _read_counted_step_with_rows)
CALL = Kind("any other call, pickled", b"k", True, _call, _read_pickled)
USE_OBS_SLOT = Kind("obs slot for the call that follows", b"u", True, _switched, _read_switched)
INFO_COLUMNS = Kind("the info columns to write from now on, for the call that follows", b"i", True, _with_columns,
                   _read_with_columns)
ATTACH = Kind("the shared buffers to attach to", b"a", True, encode, _read_pickled)
CLOSE = Kind("close", b"q", True, _nothing, _read_close)
DONE = Kind("reply", b"d", False, sendable_pickle, _read_reply)
DONE_WITH_ROWS = Kind("reply with its envs' private observation rows", b"w", False, sendable_pickle,
                      _read_reply_with_rows)
UNREADABLE = Kind("the call could not be read", b"x", False, encode, _read_unreadable)
KINDS = (GROUP_STEP, COUNTED_GROUP_STEP, SNAPSHOT_STEP, COUNTED_SNAPSHOT_STEP, STEP_OF_SOME, STEP_WITH_ROWS,
         COUNTED_STEP_WITH_ROWS, CALL, USE_OBS_SLOT, INFO_COLUMNS, ATTACH, CLOSE, DONE, DONE_WITH_ROWS, UNREADABLE)


def _by_header(to_worker: bool) -> dict[int, Kind]:
    kinds = {}
    for kind in KINDS:
        # Headers are distinct in both directions, so that a message read at the wrong end is an
        # error; and none is a pickle's first byte, so that no startup report reads as a message.
        if len(kind.header) != 1 or kind.header in (b"\x80", *(k.header for k in KINDS if k is not kind)):
            raise RuntimeError(f"the header {kind.header!r} of {kind.name!r} is not a byte of its own")
        if kind.to_worker == to_worker:
            kinds[kind.header[0]] = kind
    return kinds


_CALLS = _by_header(to_worker=True)
_REPLIES = _by_header(to_worker=False)
# The hot path's messages, one per obs slot, made once.
_GROUP_STEPS = [GROUP_STEP.encode(obs_slot) for obs_slot in range(256)]
_COUNTED_GROUP_STEPS = [COUNTED_GROUP_STEP.encode(obs_slot) for obs_slot in range(256)]
CLOSING = CLOSE.encode()


def framed_counted_group_steps() -> list[bytes]:
    """The counted step of a worker's whole group, for each obs slot, framed as a
    :class:`~multiprocessing.connection.Connection` frames a message (a 4-byte big-endian length first)."""
    return [struct.pack("!i", len(message)) + message for message in _COUNTED_GROUP_STEPS]
