"""What the user's data in a call or reply becomes on a pipe: a call that cannot travel raises, naming
its entry, before anything is sent; in a worker's reply, what cannot be pickled becomes its env's
failure, not a lost reply.

Plain pickle where it can (faster), cloudpickle for what plain pickle
refuses; a value or observation row that neither can send is dropped and its
env fails with a message that says why, so that one env's unpicklable info
never costs the other envs of the worker their answers.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

from parallelenv.backends import pickling
from parallelenv.calls import Failure, Reply, method_name, per_env_fields


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
        return pickling.dumps(message)


def encode_user_data(message: Any, call: Any) -> bytes:
    """cloudpickle ``message``, which carries ``call``; a TypeError says what cannot travel, and for which env."""
    try:
        return pickling.dumps(message)
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
                pickling.dumps(entry)
            except Exception:
                return f"the {name} entry {entry!r} of env {env_id}"
    return "what was passed"



def sendable_pickle(message: Reply | WithRows) -> bytes:
    try:
        return encode(message)
    except Exception:  # an info, attribute, return value or observation that cannot be pickled
        return encode(_sendable(message))


def _sendable(message: Reply | WithRows) -> Reply | WithRows:
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
    return _failing(dataclasses.replace(message, values=values), failures)


def _unsendable(env_id: int, reply: Reply, value: Any, what: str) -> Failure | None:
    try:
        encode(value)
    except Exception as exc:
        failure = Failure.from_exception(env_id, reply.call_type.__name__.lower(), exc)
        return dataclasses.replace(failure, message=f"its {what} cannot be sent back from the worker process: "
                                                    f"{failure.message}")
    return None


def _failing(reply: Reply, failures: list[Failure]) -> Reply:
    """``reply`` with these envs failing too, their values dropped."""
    if not failures:
        return reply
    failed = {failure.env_index for failure in failures}
    values = {env_id: value for env_id, value in reply.values.items() if env_id not in failed}
    # A snapshot step's states stay: an env's unsendable info does not cost the snapshot of the others.
    return dataclasses.replace(reply, values=values, failures=(*reply.failures, *failures))
