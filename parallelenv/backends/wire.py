"""How calls and replies travel over a worker's pipe.

Most messages are pickles. The one that dominates, a step of every env a
worker hosts, is a single byte, and its reply when no env returned an info
is an empty message: the results themselves are already in shared memory,
and the parent knows which call a reply answers because each worker answers
in the order it was asked.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

import cloudpickle

from parallelenv.calls import Done, Failure, Step, method_name, per_env_fields

_STEP_GROUP = b"s"  # pickles start with b"\x80", so one byte cannot be mistaken for one
_STEP_GROUP_COUNTED = b"c"
_STEP_DONE_NO_INFO = b""


@dataclass(frozen=True)
class CountedStep:
    """A step of the worker's whole group, counted down on the backend's
    countdown (see :mod:`parallelenv.backends.countdown`): the worker that
    answers last wakes the parent, and an answer without infos is only counted."""

    step: Step


def encode(message: Any) -> bytes:
    """Plain pickle where it can (faster); cloudpickle for what plain pickle refuses."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def encode_call(call: Any, group_ids: tuple[int, ...], counted: bool = False) -> bytes:
    """A call as the worker will read it.

    cloudpickle, not pickle: a function or class the user defined in the
    script being run (``__main__``) pickles by reference, and the worker's
    ``__main__`` is not that script; cloudpickle sends such objects by value.
    Anything that cannot travel raises here, in the caller, before any worker
    is sent anything.
    """
    if type(call) is Step and call.env_ids == group_ids:
        return _STEP_GROUP_COUNTED if counted else _STEP_GROUP
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


def decode_call(data: bytes, group_step: Step, counted_group_step: CountedStep) -> Any:
    """The call, a :class:`CountedStep`, or another message (``Close``); ``group_step`` is the worker's whole group."""
    if data == _STEP_GROUP:
        return group_step
    if data == _STEP_GROUP_COUNTED:
        return counted_group_step
    return pickle.loads(data)


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


def encode_reply(reply: Done) -> bytes:
    if reply.call_type is Step and not reply.values and not reply.failures:
        return _STEP_DONE_NO_INFO
    try:
        return encode(reply)
    except Exception:  # an info, attribute or return value that cannot be pickled
        return encode(_sendable(reply))


def decode_reply(data: bytes, env_ids: tuple[int, ...]) -> Done:
    """The reply to the call for ``env_ids``, the oldest this worker has not answered."""
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
    return reply


def _sendable(reply: Done) -> Done:
    """``reply`` with each value that cannot be pickled turned into its env's failure."""
    values, failures = {}, list(reply.failures)
    for env_id, value in reply.values.items():
        try:
            encode(value)
        except Exception as exc:
            failure = Failure.from_exception(env_id, reply.call_type.__name__.lower(), exc)
            message = f"its result cannot be sent back from the worker process: {failure.message}"
            failures.append(dataclasses.replace(failure, message=message))
        else:
            values[env_id] = value
    return Done(reply.call_type, reply.env_ids, values, tuple(failures))
