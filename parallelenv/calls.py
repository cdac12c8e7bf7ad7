"""Typed messages between the front object and the env hosts.

A call names the envs it is for by their global index; a backend that hosts
envs in groups splits a call with :func:`split_call` so that each group only
receives its own envs and their share of the per-env data. Step actions are
not in the message: the front writes them into the backend's action buffer,
which for the subprocess backend is shared memory.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar, Union

from parallelenv.errors import EnvError, RemoteTraceback, SharedEnvError

PER_ENV = {"per_env": True}


@dataclass(frozen=True)
class Reset:
    env_ids: tuple[int, ...]
    seeds: tuple[int | None, ...] = field(metadata=PER_ENV)
    options: tuple[dict[str, Any] | None, ...] = field(metadata=PER_ENV)


@dataclass(frozen=True)
class Step:
    env_ids: tuple[int, ...]
    # None, or a boolean mask over env_ids in the array kind of the backend's
    # buffers: the envs it leaves out are finished and must not be stepped.
    # The call tracker passes it instead of leaving those envs out of env_ids
    # only where reading the mask on the host would wait for a device.
    live: Any = None
    # The caller waits for every env of this step before it does anything
    # else (``step()``, not ``send()`` and a ``recv`` of some): a backend may
    # then hand the step's results over all at once, when the last env has
    # answered (see parallelenv.backends.subproc.countdown). The caller's choice,
    # stated with the call: a backend never guesses it from how it is waited on.
    awaited: bool = False
    # None, or the env classes whose pickle the caller trusts: each host then takes its envs' states
    # before it steps them, into the reply's ``states`` (lossless healing's snapshots, which so cost
    # no call of their own: see parallelenv.state.journal).
    snapshot: frozenset[str] | None = None


@dataclass(frozen=True)
class GetAttr:
    env_ids: tuple[int, ...]
    name: str


@dataclass(frozen=True)
class SetAttr:
    env_ids: tuple[int, ...]
    name: str
    value: Any


@dataclass(frozen=True)
class CallMethod:
    env_ids: tuple[int, ...]
    # A method name, or a function called with the env as its first argument.
    name: str | Callable[..., Any]
    # One argument per env; NO_ARGUMENT calls the method with none.
    data: tuple[Any, ...] = field(metadata=PER_ENV)


@dataclass(frozen=True)
class ReplaceEnv:
    """Close each env named and put a new one, built from its source, in its place."""

    env_ids: tuple[int, ...]
    # One gym.Env or zero-argument factory per env; a factory is called where the env runs.
    sources: tuple[Any, ...] = field(metadata=PER_ENV)


@dataclass(frozen=True)
class Rebuild:
    """Close each env named, build a new one from its source in its place, and reset it.

    What ``on_env_error="restart"`` sends for an env that raised: its reply
    is a reset's (the new episode's first observation in the buffers).
    """

    env_ids: tuple[int, ...]
    sources: tuple[Any, ...] = field(metadata=PER_ENV)
    seeds: tuple[int | None, ...] = field(metadata=PER_ENV)


@dataclass(frozen=True)
class Replay:
    """Put each env named back into its last snapshot and play what it was sent since, in order; the
    last entry of each is the step under way, answered as a step (lossless healing: see
    :mod:`parallelenv.state.journal`). An entry is ``("step", action)`` or ``("reset", seed, options)``."""

    env_ids: tuple[int, ...]
    states: tuple[Any, ...] = field(metadata=PER_ENV)
    entries: tuple[tuple[tuple[Any, ...], ...], ...] = field(metadata=PER_ENV)


Call = Union[Reset, Step, GetAttr, SetAttr, CallMethod, ReplaceEnv, Rebuild, Replay]


#: The calls whose replies leave nothing in the buffers; after any other call,
#: each env that answered has its new observation there.
NO_RESULT_CALLS = frozenset({GetAttr, SetAttr, CallMethod, ReplaceEnv})


class _NoArgument:
    """Marks a CallMethod entry that calls the method without an argument."""

    def __repr__(self) -> str:
        return "NO_ARGUMENT"

    def __reduce__(self) -> str:
        return "NO_ARGUMENT"


NO_ARGUMENT = _NoArgument()


@dataclass(frozen=True)
class Arguments:
    """A CallMethod entry with any arguments, as vector ``call`` APIs pass them.

    An attribute that is not callable is returned as it is, as
    ``gymnasium.vector.VectorEnv.call`` does.
    """

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """An env raised; the exception travels as data until the front raises it."""

    env_index: int
    method: str
    exc_type: str
    message: str
    traceback: str
    # The exception itself while the failure stays in the process that raised it (an env run in
    # the caller: dummy, tensor): the caller's EnvError is chained to it, frames and all, so that
    # a debugger's post-mortem reaches the env's code. It never travels (see __getstate__).
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # A traceback cannot be pickled, and an exception of the env's own class may not unpickle.
        return {name: value for name, value in self.__dict__.items() if name != "exception"}

    @classmethod
    def from_exception(cls, env_index: int, method: str, exc: BaseException) -> Failure:
        """Describe ``exc``, raised by env ``env_index`` in ``method``."""
        exc_cls = type(exc)
        return cls(
            env_index=env_index,
            method=method,
            exc_type=f"{exc_cls.__module__}.{exc_cls.__qualname__}".removeprefix("builtins."),
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            exception=exc,
        )

    def error(self) -> EnvError:
        """The :class:`EnvError` to raise in the caller, chained to the env's exception where it was
        raised in this process, else to its remote traceback.

        In this process the EnvError also carries the env's frames at the end of
        its own traceback, so that ``pdb.pm()`` and ``sys.last_traceback``, which
        follow the error raised rather than its cause, land in the env's code.
        """
        error = EnvError.of(self.env_index, self.method, self.exc_type, self.message, self.traceback)
        if self.exception is not None:
            error.__cause__ = self.exception
            error.__traceback__ = self.exception.__traceback__
        else:
            error.__cause__ = RemoteTraceback(self.traceback)
        return error

    def raise_error(self) -> NoReturn:
        if isinstance(self.exception, SharedEnvError):
            raise self.exception  # a check of ours, made in this process: no env raised it
        raise self.error()


# Every call gets one reply of one shape per host, whatever happened to its envs.
# Not frozen: a frozen dataclass sets each field through object.__setattr__,
# a cost that every reply would pay on the step path. Nothing writes to a Reply.
@dataclass(slots=True)
class Reply:
    """A call ran on every env it named.

    ``values`` maps each env that answered to its answer: the info dict for
    Reset, the attribute for GetAttr, the return value for CallMethod, None
    for SetAttr and ReplaceEnv. Step replies leave out empty infos, since
    most steps of most envs have none. An env that raised is in
    ``failures`` instead; the call still ran on every other env it named,
    so one env's exception never costs the others their results.
    """

    call_type: type
    env_ids: tuple[int, ...]
    values: dict[int, Any]
    failures: tuple[Failure, ...] = ()
    # A Gymnasium vector info over env_ids, in their order, from a host whose
    # envs answer as one batch (a vectorised env; ``values`` then holds no
    # infos), or read from the host's info columns (``values`` holds what they
    # did not take, and ``info_kinds`` the type each column's values had).
    info: dict[str, Any] | None = None
    info_kinds: Mapping[str, type] | None = None
    # A snapshot step's: each env's state before the step, or why it could not be taken (Step.snapshot).
    states: dict[int, Any] | None = None

    def failed_ids(self) -> list[int]:
        return [failure.env_index for failure in self.failures]

    def with_states(self, states: dict[int, Any] | None) -> Reply:
        """This reply with ``states`` (a snapshot step's; built directly: dataclasses.replace costs
        several times more, on every snapshot step of every host)."""
        return Reply(self.call_type, self.env_ids, self.values, self.failures, self.info, self.info_kinds, states)


def env_error(failures: list[Failure], results: Any) -> EnvError:
    """The EnvError of the lowest env that raised, naming every other one and carrying the others' results.

    Failures arrive in the order their hosts answered; sorted, the error is the same on every backend.
    """
    failures = sorted(failures, key=_env_index)
    error = failures[0].error()
    error.failed_env_ids = [failure.env_index for failure in failures]
    error.results = results
    if len(failures) > 1:
        error.args = (f"{error.args[0]} (envs {error.failed_env_ids[1:]} raised too)",)
    return error


def _env_index(failure: Failure) -> int:
    return failure.env_index


def split_call(call: Call, positions: list[int]) -> Call:
    """Keep only the envs at ``positions`` of ``call.env_ids``, with their per-env data."""
    env_ids = tuple(call.env_ids[p] for p in positions)
    if type(call) is Step:  # the hot path of k-of-n stepping: no dataclasses.replace machinery
        return Step(env_ids, None if call.live is None else call.live[positions], call.awaited, call.snapshot)
    per_env = per_env_fields(type(call))
    if not per_env:
        return dataclasses.replace(call, env_ids=env_ids)
    changes: dict[str, Any] = {name: tuple(getattr(call, name)[p] for p in positions) for name in per_env}
    return dataclasses.replace(call, env_ids=env_ids, **changes)


_PER_ENV_FIELDS: dict[type, tuple[str, ...]] = {}


def per_env_fields(call_type: Any) -> tuple[str, ...]:
    if call_type not in _PER_ENV_FIELDS:
        _PER_ENV_FIELDS[call_type] = tuple(f.name for f in dataclasses.fields(call_type) if f.metadata.get("per_env"))
    return _PER_ENV_FIELDS[call_type]


def method_name(call: Call) -> str:
    """The env-facing name of a call, as used in error messages."""
    if isinstance(call, (GetAttr, SetAttr)):
        return call.name
    if isinstance(call, CallMethod):
        return call.name if isinstance(call.name, str) else getattr(call.name, "__name__", repr(call.name))
    if isinstance(call, ReplaceEnv):
        return "replace"
    return type(call).__name__.lower()


Message = TypeVar("Message", bound=Union[Reset, Step, GetAttr, SetAttr, CallMethod, ReplaceEnv, Rebuild, Reply])


def shifted(message: Message, offset: int) -> Message:
    """The same call or reply for envs numbered ``offset`` higher.

    A host that runs a group of envs behind its own local numbering (a Ray
    actor over a subproc backend) turns global ids into local ones on the
    way in and back on the way out.
    """
    changes: dict[str, Any] = {"env_ids": tuple(i + offset for i in message.env_ids)}
    if isinstance(message, Reply):
        changes["values"] = {i + offset: value for i, value in message.values.items()}
        changes["failures"] = tuple(
            dataclasses.replace(failure, env_index=failure.env_index + offset) for failure in message.failures
        )
        if message.states is not None:
            changes["states"] = {i + offset: state for i, state in message.states.items()}
    return dataclasses.replace(message, **changes)
