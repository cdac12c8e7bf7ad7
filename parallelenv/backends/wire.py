"""How calls and replies travel over a worker's pipe.

Most messages are pickles. The one that dominates, a step of every env a
worker hosts, is a single byte, and its reply when no env returned an info
is an empty message: the results themselves are already in shared memory,
and the parent knows which call a reply answers because each worker answers
in the order it was asked. A step of some of a worker's envs (``send`` to a
few envs, or one half of them in overlapped collection) is a byte and their
ids as 32-bit integers: pickling it costs the parent tens of microseconds.

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

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from parallelenv.backends.buffers import Buffers
from parallelenv.batching import read_private_rows, write_private_rows
from parallelenv.calls import NO_RESULT_CALLS, Done, Failure, Step, method_name, per_env_fields

_STEP_GROUP = b"s"  # pickles start with b"\x80", so one byte cannot be mistaken for one
_STEP_GROUP_COUNTED = b"c"
_STEP_SOME = b"p"  # followed by the env ids, as int32
_USE_OBS_SLOT = b"u"  # followed by the slot, as a byte, and the call
_STEP_ID = np.dtype(np.int32)
_STEP_DONE_NO_INFO = b""


@dataclass(frozen=True)
class CountedStep:
    """A step of the worker's whole group, counted down on the backend's
    countdown (see :mod:`parallelenv.backends.countdown`): the worker that
    answers last wakes the parent, and an answer without infos is only counted."""

    step: Step


@dataclass(frozen=True)
class WithRows:
    """A call or reply (``message``, about ``env_ids``) and those envs' rows of the buffers' private parts."""

    message: Any
    env_ids: tuple[int, ...]
    rows: list[Any]


def encode(message: Any) -> bytes:
    """Plain pickle where it can (faster); cloudpickle for what plain pickle refuses."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def encode_call(call: Any, group_ids: tuple[int, ...], counted: bool = False, buffers: Buffers | None = None,
                worker_obs_slot: int = 0) -> bytes:
    """A call as the worker will read it; a step carries its actions' rows of ``buffers``' private parts,
    and a call for a worker whose obs slot (``worker_obs_slot``) is not the buffers' now names theirs.

    cloudpickle, not pickle: a function or class the user defined in the
    script being run (``__main__``) pickles by reference, and the worker's
    ``__main__`` is not that script; cloudpickle sends such objects by value.
    Anything that cannot travel raises here, in the caller, before any worker
    is sent anything.
    """
    obs_slot = 0 if buffers is None else buffers.obs_slot
    if type(call) is Step and not (buffers is not None and buffers.private_actions) and call.env_ids == group_ids:
        return (_STEP_GROUP_COUNTED if counted else _STEP_GROUP) + _SLOT_BYTES[obs_slot]
    message = _encode_call(call, counted, buffers)
    return message if obs_slot == worker_obs_slot else _USE_OBS_SLOT + _SLOT_BYTES[obs_slot] + message


_SLOT_BYTES = [bytes([slot]) for slot in range(256)]


def _encode_call(call: Any, counted: bool, buffers: Buffers | None) -> bytes:
    if type(call) is Step:
        if buffers is not None and buffers.private_actions:
            message = CountedStep(call) if counted else call
            rows = read_private_rows(buffers.private_actions, call.env_ids)
            return encode_user_data(WithRows(message, call.env_ids, rows), call)
        if call.live is None:
            return _STEP_SOME + np.array(call.env_ids, dtype=_STEP_ID).tobytes()
    return encode_user_data(call, call)


def encode_user_data(message: Any, call: Any) -> bytes:
    """cloudpickle ``message``, which carries ``call``; a TypeError says what cannot travel, and for which env."""
    try:
        return cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"{method_name(call)}: {_what_cannot_travel(call)} cannot be sent to where the envs run "
            f"({type(exc).__name__}: {exc}); nothing was sent"
        ) from exc


def _what_cannot_travel(call: Any) -> str:
    """The first per-env entry of ``call`` that cannot be pickled, by env; else the call's arguments."""
    for name in per_env_fields(type(call)):
        for env_id, entry in zip(call.env_ids, getattr(call, name), strict=True):
            try:
                cloudpickle.dumps(entry)
            except Exception:
                return f"the {name} entry {entry!r} of env {env_id}"
    return "what was passed"


def decode_call(data: bytes, group_step: Step, counted_group_step: CountedStep, buffers: Buffers | None = None) -> Any:
    """The call, a :class:`CountedStep`, or another message (``Close``); ``group_step`` is the worker's whole group.

    The action rows a step brings are written into ``buffers`` here, and the obs slot it names made theirs.
    """
    head = data[:1]
    if head == _USE_OBS_SLOT:
        assert buffers is not None, "an obs slot needs the buffers it is one of"
        buffers.use_obs_slot(data[1])
        data = data[2:]
        head = data[:1]
    if head == _STEP_GROUP or head == _STEP_GROUP_COUNTED:
        if buffers is not None:
            buffers.use_obs_slot(data[1])
        return group_step if head == _STEP_GROUP else counted_group_step
    if head == _STEP_SOME:
        return Step(tuple(np.frombuffer(data, _STEP_ID, offset=1).tolist()))
    message = pickle.loads(data)
    if isinstance(message, WithRows):
        assert buffers is not None, "a step with action rows needs the buffers to write them into"
        write_private_rows(buffers.private_actions, message.env_ids, message.rows)
        message = message.message
        if isinstance(message, CountedStep):  # the worker knows a counted step by its own object
            return counted_group_step
    return message


def is_quiet(encoded_reply: bytes) -> bool:
    """Whether a step's reply says no more than its results in shared memory do."""
    return encoded_reply == _STEP_DONE_NO_INFO


@dataclass(frozen=True)
class Unreadable:
    """The reply to a call the worker could not unpickle (e.g. a module it cannot import)."""

    exc_type: str
    message: str
    traceback: str


def unreadable(exc: BaseException) -> bytes:
    failure = Failure.from_exception(-1, "", exc)
    return encode(Unreadable(failure.exc_type, failure.message, failure.traceback))


def encode_reply(reply: Done, buffers: Buffers | None = None) -> bytes:
    """``reply`` as the parent reads it; one that leaves results brings its envs' rows of ``buffers``' private parts."""
    private = buffers.private_obs if buffers is not None else None
    if reply.call_type is Step and not reply.values and not reply.failures and not private:
        return _STEP_DONE_NO_INFO
    message: Done | WithRows = reply
    if private and reply.call_type not in NO_RESULT_CALLS:
        message = WithRows(reply, reply.env_ids, read_private_rows(private, reply.env_ids))
    try:
        return encode(message)
    except Exception:  # an info, attribute, return value or observation that cannot be pickled
        return encode(_sendable(message))


def decode_reply(data: bytes, env_ids: tuple[int, ...], buffers: Buffers | None = None) -> Done:
    """The reply to the call for ``env_ids``, the oldest this worker has not answered.

    The observation rows it brings are written into ``buffers`` here.
    """
    if data == _STEP_DONE_NO_INFO:
        return Done(Step, env_ids, {})
    reply = pickle.loads(data)
    if isinstance(reply, Unreadable):
        failures = tuple(
            Failure(i, "unpickle", reply.exc_type, f"the worker could not read the call: {reply.message}", reply.traceback)
            for i in env_ids
        )
        # A step of a whole group is one byte that always reads: this call was no step.
        return Done(type(None), env_ids, {}, failures)
    if isinstance(reply, WithRows):
        assert buffers is not None, "a reply with observation rows needs the buffers to write them into"
        write_private_rows(buffers.private_obs, reply.env_ids, reply.rows)
        reply = reply.message
    return reply


def _sendable(message: Done | WithRows) -> Done | WithRows:
    """``message`` with each value or observation row that cannot be pickled turned into its env's failure."""
    if isinstance(message, WithRows):
        failures, kept = [], []
        for position, env_id in enumerate(message.env_ids):
            failure = _unsendable(env_id, message.message, [rows[position] for rows in message.rows], "observation")
            if failure is None:
                kept.append(position)
            else:
                failures.append(failure)
        reply = _sendable(_failing(message.message, failures))
        return WithRows(reply, tuple(message.env_ids[p] for p in kept), [rows[kept] for rows in message.rows])
    values, failures = {}, []
    for env_id, value in message.values.items():
        failure = _unsendable(env_id, message, value, "result")
        if failure is None:
            values[env_id] = value
        else:
            failures.append(failure)
    return _failing(Done(message.call_type, message.env_ids, values, message.failures, message.info), failures)


def _unsendable(env_id: int, reply: Done, value: Any, what: str) -> Failure | None:
    try:
        encode(value)
    except Exception as exc:
        failure = Failure.from_exception(env_id, reply.call_type.__name__.lower(), exc)
        return dataclasses.replace(failure, message=f"its {what} cannot be sent back from the worker process: "
                                                    f"{failure.message}")
    return None


def _failing(reply: Done, failures: list[Failure]) -> Done:
    """``reply`` with these envs failing too, their values dropped."""
    if not failures:
        return reply
    failed = {failure.env_index for failure in failures}
    values = {env_id: value for env_id, value in reply.values.items() if env_id not in failed}
    return Done(reply.call_type, reply.env_ids, values, (*reply.failures, *failures), reply.info)
