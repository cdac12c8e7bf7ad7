"""How calls and replies travel over a worker's pipe.

Most messages are pickles. The one that dominates, a step of every env a
worker hosts, is a single byte, and its reply when no env returned an info
is an empty message: the results themselves are already in shared memory,
and the parent knows which call a reply answers because each worker answers
in the order it was asked.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from parallelenv.calls import Done, Failure, Step, method_name

STEP_GROUP = b"s"  # pickles start with b"\x80", so one byte cannot be mistaken for one
# The same step, counted down on the backend's countdown (see backends.countdown):
# the worker that answers last also wakes the parent.
STEP_GROUP_COUNTED = b"c"
STEP_DONE_NO_INFO = b""


def encode(message: Any) -> bytes:
    """Plain pickle where it can; cloudpickle for lambdas and classes defined in __main__."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def encode_call(call: Any, group_ids: tuple[int, ...]) -> bytes:
    if type(call) is Step and call.env_ids == group_ids:
        return STEP_GROUP
    return encode(call)


def decode_call(data: bytes, group_step: Step) -> Any:
    return group_step if data == STEP_GROUP or data == STEP_GROUP_COUNTED else pickle.loads(data)


def encode_reply(reply: Any, call: Any) -> bytes:
    if type(reply) is Done and reply.call_type is Step and not reply.values:
        return STEP_DONE_NO_INFO
    try:
        return encode(reply)
    except Exception as exc:  # an info, attribute or return value that cannot be pickled
        return encode(_cannot_send(call, exc))


def decode_reply(data: bytes, env_ids: tuple[int, ...]) -> Any:
    """The reply to the call for ``env_ids``, the oldest this worker has not answered."""
    if data == STEP_DONE_NO_INFO:
        return Done(Step, env_ids, {})
    return pickle.loads(data)


def _cannot_send(call: Any, exc: Exception) -> Failure:
    failure = Failure.from_exception(call, call.env_ids[0], method_name(call), exc)
    message = f"its result cannot be sent back from the worker process: {failure.message}"
    return Failure(failure.call_type, failure.env_ids, failure.env_index, failure.method, failure.exc_type, message, failure.traceback)
