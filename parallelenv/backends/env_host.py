"""Runs calls against a group of envs: the only per-env logic of the CPU backends.

Every CPU backend hosts its envs in :class:`EnvGroup` objects: the dummy
backend one in the caller, the subprocess backend one per worker process,
the Ray backends one per actor. A group reads its envs' actions from and
writes their results into :class:`Buffers` rows indexed by global env id,
and answers every call with a :class:`Done`: an env that raises is
reported in it, and the call still runs on every other env it names.
"""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from parallelenv.backends.buffers import Buffers
from parallelenv.batching import is_per_env_objects, row_writer, rows_reader, rows_view
from parallelenv.calls import (
    NO_ARGUMENT,
    Arguments,
    Call,
    CallMethod,
    Done,
    Failure,
    GetAttr,
    Rebuild,
    ReplaceEnv,
    Reply,
    Reset,
    SetAttr,
    Step,
    method_name,
)

EnvSource = Any  # a gym.Env, or a zero-argument callable returning one


def env_list(envs: Any) -> list[EnvSource]:
    """The user's ``envs`` as a list of env sources, checked where the user gave them.

    A TypeError says what a CPU backend takes. One env instance given as two
    entries (also under other wrappers) is an :class:`~parallelenv.EnvError`
    for ``make``, as :func:`make_envs` reports it, raised before any env is
    sent anywhere: a process backend would pickle each entry on its own, and
    the copies would hide it. Factories cannot be compared here: their envs
    exist once called, which a process backend does in its workers, each on
    its own unpickled copy of the factory. There an env that several
    factories share arrives as copies, each its own env; it is refused where
    one process builds it twice (a factory returning a module-level env).
    """
    sources = _source_list(envs)
    given: dict[int, int] = {}
    for env_id, source in enumerate(sources):
        if isinstance(source, gym.Env):
            try:
                refuse_shared_env(source, env_id, given)
            except ValueError as exc:
                Failure.from_exception(env_id, "make", exc).raise_error()
    return sources


def _source_list(envs: Any) -> list[EnvSource]:
    if isinstance(envs, (gym.Env, str)) or not isinstance(envs, Sequence) or not envs:
        raise TypeError(f"envs must be a non-empty list of gym.Env instances or factories of them, not "
                        f"{type(envs).__name__}")
    return list(envs)


def pickle_sources(sources: Sequence[EnvSource]) -> list[bytes]:
    """cloudpickle each env or factory, naming the first that cannot be sent to a worker."""
    payloads = []
    for env_id, source in enumerate(sources):
        try:
            payloads.append(cloudpickle.dumps(source))
        except Exception as exc:
            raise TypeError(
                f"env {env_id} ({source!r}) cannot be pickled to send it to a worker process: "
                f"{type(exc).__name__}: {exc}. Pass a factory that builds the env in the worker."
            ) from exc
    return payloads


def make_envs(sources: Sequence[EnvSource], first_id: int) -> list[gym.Env] | Failure:
    """Build the envs of a group, or describe the first one that failed.

    An env that is another env of the group (the same object, or the same
    env under other wrappers) fails too: stepped once per entry, it would
    give every entry's results from one env.
    """
    sources = _source_list(sources)
    envs: list[gym.Env] = []
    built: dict[int, int] = {}  # id() of each unwrapped env -> the env id it was built as
    for offset, source in enumerate(sources):
        env_id = first_id + offset
        try:
            env = _make_env(source)
            refuse_shared_env(env, env_id, built)
        except Exception as exc:
            for made in envs:
                _close_quietly(made)
            return Failure.from_exception(env_id, "make", exc)
        envs.append(env)
    return envs


def refuse_shared_env(env: gym.Env, env_id: int, built: dict[int, int]) -> None:
    """Record ``env`` as env ``env_id`` in ``built``, or raise a ValueError naming the env it already is."""
    first = built.setdefault(id(env.unwrapped), env_id)
    if first != env_id:
        raise ValueError(
            f"env {env_id} is the same env instance as env {first} ({env.unwrapped!r}): each entry of envs needs "
            "its own env. Pass factories that build a new env on each call, not one env twice or a factory that "
            "returns the same env every time"
        )


def refuse_instances_to_rebuild(sources: Sequence[EnvSource]) -> None:
    """A ValueError if an env is an instance run where it is: a failed env cannot be rebuilt from itself."""
    instances = [env_id for env_id, source in enumerate(sources) if isinstance(source, gym.Env)]
    if instances:
        raise ValueError(
            f"on_env_error='restart' rebuilds a failed env from its factory, but envs {instances[:8]} are env "
            "instances that run in this process as they are. Pass factories (e.g. lambda: gym.make(...))"
        )


SpacePair = tuple[gym.Space, gym.Space]

# Observations are written in one assignment from the list of them when
# their rows are a slice (a whole group's step): NumPy copies each into its
# row, with no temporary array; bigobs8's frames went in ~7 µs faster a step
# than row by row. Rows picked by a list are written one by one: a list
# assignment through fancy indexing first stacks the frames, an extra copy
# of each, which costs more than the loop once a row is larger than this.
ROW_BY_ROW_BYTES = 4096


class SpaceMismatch(ValueError, RuntimeError):
    """Env ``env_id`` has other spaces than env ``reference_id``: all envs must share theirs.

    Also a RuntimeError, which Gymnasium's vector envs raise for envs of different spaces.
    """

    def __init__(self, env_id: int, kind: str, mine: gym.Space, reference_id: int, reference: gym.Space) -> None:
        super().__init__(
            f"env {env_id} has {kind} {mine}, but env {reference_id} has {reference}; all envs must share their spaces"
        )
        self.fields = (env_id, kind, mine, reference_id, reference)

    def __reduce__(self) -> tuple[Any, ...]:
        return SpaceMismatch, self.fields

    def shifted(self, offset: int) -> SpaceMismatch:
        """The same mismatch for envs numbered ``offset`` higher (a group's envs, in global ids)."""
        env_id, kind, mine, reference_id, reference = self.fields
        return SpaceMismatch(env_id + offset, kind, mine, reference_id + offset, reference)


def common_spaces(per_env: Sequence[SpacePair]) -> SpacePair:
    """The spaces every env shares; a :class:`SpaceMismatch` names the first env that differs from env 0."""
    first = per_env[0]
    for env_id, pair in enumerate(per_env):
        for kind, mine, reference in zip(("observation_space", "action_space"), pair, first, strict=True):
            if mine != reference:
                raise SpaceMismatch(env_id, kind, mine, 0, reference)
    return first


# What ``warnings.simplefilter("ignore")`` inserts.
_IGNORE_EVERY_WARNING = ("ignore", None, Warning, None, 0)
# Where catch_warnings keeps its filters per context (free-threaded builds,
# or -X context_aware_warnings), warnings.filters is not where they are read.
_FILTERS_PER_CONTEXT = getattr(sys.flags, "context_aware_warnings", False)
# How catch_warnings tells the warnings machinery that the filters changed
# (its caches of warnings already shown depend on them), where it exists.
_FILTERS_MUTATED = None if _FILTERS_PER_CONTEXT else getattr(warnings, "_filters_mutated", None)


class silenced:
    """Ignore the warnings raised inside envs while in effect, when ``no_warning`` is set.

    The dummy backend enters one around every call it runs, so it costs as
    little as a filter can: it swaps in a filter list that starts with an
    ignore-everything filter and puts the caller's back on exit, as
    ``catch_warnings`` does less its other bookkeeping (~1 us against ~3 us
    per call). Where the filters are kept per context, or the hook that
    marks them changed is missing, it is ``catch_warnings`` itself.
    """

    __slots__ = ("_no_warning", "_saved", "_catcher")

    def __init__(self, no_warning: bool) -> None:
        self._no_warning = no_warning
        self._saved: list[Any] | None = None
        self._catcher: Any = None

    def __enter__(self) -> None:
        if not self._no_warning:
            return
        if self._saved is not None or self._catcher is not None:
            raise RuntimeError("silenced is already in effect: it cannot be entered twice at once")
        if _FILTERS_MUTATED is not None:
            self._saved = warnings.filters
            warnings.filters = [_IGNORE_EVERY_WARNING, *self._saved]
            _FILTERS_MUTATED()
            return
        self._catcher = warnings.catch_warnings()
        self._catcher.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            warnings.filters, self._saved = self._saved, None
            _FILTERS_MUTATED()  # type: ignore[misc]
        elif self._catcher is not None:
            self._catcher.__exit__(*exc_info)
            self._catcher = None


def _make_env(source: EnvSource) -> gym.Env:
    if isinstance(source, gym.Env):
        return source
    if not callable(source):
        raise TypeError(f"got a {type(source).__name__}, not a gymnasium.Env or a factory of one")
    env = source()
    if not isinstance(env, gym.Env):
        raise TypeError(f"its factory returned a {type(env).__name__}, not a gymnasium.Env")
    return env


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:  # closing is best effort: the env may be what failed
        pass


def _restarted(env: gym.Env, result: tuple) -> tuple:
    """The step result of an env that finished, reset in the same step ("restart")."""
    obs, reward, terminated, truncated, info = result
    # The env may reuse its obs array for the next episode: keep our own copy.
    ended_state = obs.copy() if isinstance(obs, np.ndarray) else copy.deepcopy(obs)
    new_obs, info = _reset_after_end(env, info)
    return new_obs, reward, terminated, truncated, {**info, "ended_state": ended_state, "reset": True}


def _reset_after_end(env: gym.Env, info: dict) -> tuple[Any, dict]:
    """The first obs of an env's next episode, and ``info`` with that episode's reset info."""
    new_obs, reset_info = env.reset()
    if reset_info:  # the new episode's first info, as Gymnasium's same-step autoreset reports it
        info = {**info, "reset_info": reset_info}
    return new_obs, info


def _invoke(method: Any, argument: Any) -> Any:
    """Call an env method as a CallMethod entry says.

    A dict holds the call's keyword arguments (the seed API's "argument
    dictionaries": ``{"x": 1}`` calls ``method(x=1)``); :class:`Arguments`
    holds any arguments (the vector views' ``call``/``env_method``);
    NO_ARGUMENT calls with none; anything else is the one positional argument.
    """
    if argument is NO_ARGUMENT:
        return method()
    if isinstance(argument, dict):
        return method(**argument)
    if isinstance(argument, Arguments):
        return method(*argument.args, **argument.kwargs) if callable(method) else method
    return method(argument)


class EnvGroup:
    """A contiguous block of envs, ``first_id`` onwards, answering calls."""

    def __init__(self, envs: list[gym.Env], first_id: int, restart: bool) -> None:
        self.envs = envs
        self.first_id = first_id
        self.restart = restart
        self.all_ids = tuple(range(first_id, first_id + len(envs)))
        self._all_rows = slice(first_id, first_id + len(envs))
        self._handlers: dict[type, Callable[[Any], Reply]] = {
            Reset: self._reset,
            Step: self._step,
            GetAttr: self._get_attr,
            SetAttr: self._set_attr,
            CallMethod: self._call_method,
            ReplaceEnv: self._replace,
            Rebuild: self._rebuild,
        }

    def spaces(self) -> list[SpacePair]:
        """Each env's observation and action space."""
        return [(env.observation_space, env.action_space) for env in self.envs]

    def attach(self, buffers: Buffers) -> None:
        self.buffers = buffers
        self._read_actions = rows_reader(buffers.actions)
        # A step of the whole group (every step of a training loop) reads its rows through views made once.
        self._read_group_actions = rows_reader(rows_view(buffers.actions, self._all_rows))
        obs = buffers.obs
        # Late bound for one array: the front may renew it (Buffers.renewed_obs).
        self._write_obs = self._write_obs_row if isinstance(obs, np.ndarray) else row_writer(obs)
        self._obs_in_rows = isinstance(obs, np.ndarray) and not is_per_env_objects(obs)
        self._small_obs = self._obs_in_rows and obs[0].nbytes <= ROW_BY_ROW_BYTES
        self._ended = buffers.ended if self.restart else None

    def run(self, call: Call) -> Reply:
        return self._handlers[type(call)](call)

    def _write_obs_row(self, env_id: int, obs: Any) -> None:
        self.buffers.obs[env_id] = obs

    def close(self) -> None:
        for env in self.envs:
            _close_quietly(env)

    def _env(self, env_id: int) -> gym.Env:
        return self.envs[env_id - self.first_id]

    def _reset(self, call: Reset) -> Reply:
        infos, failures = {}, []
        for env_id, seed, options in zip(call.env_ids, call.seeds, call.options, strict=True):
            try:
                obs, info = self._env(env_id).reset(seed=seed, options=options)
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, "reset", exc))
                continue
            self._write_obs(env_id, obs)
            infos[env_id] = info
        return Done(Reset, call.env_ids, infos, tuple(failures))

    def _step(self, call: Step) -> Reply:
        ids = call.env_ids
        if ids == self.all_ids:
            rows: slice | list[int] = self._all_rows
            envs = self.envs
            actions = self._read_group_actions(None)
        else:
            rows, envs = list(ids), [self.envs[i - self.first_id] for i in ids]
            actions = self._read_actions(rows)
        results = []
        failures: list[Failure] = []
        restart = self.restart
        if self._ended is not None:
            self._ended[rows] = False  # until an env's episode ends, below
        for env_id, env, action in zip(ids, envs, actions, strict=True):
            try:
                result = env.step(action)
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, "step", exc))
                continue
            if restart and (result[2] or result[3]):
                try:
                    if self._ended is None:
                        result = _restarted(env, result)
                    else:
                        result = self._restarted_into_buffers(env_id, env, result)
                except Exception as exc:
                    failures.append(Failure.from_exception(env_id, "reset", exc))
                    continue
            results.append(result)
        if failures:  # the rows of the envs that raised keep what they held
            failed = {failure.env_index for failure in failures}
            ids = tuple(env_id for env_id in ids if env_id not in failed)
            rows = list(ids)
        if results:
            observations, rewards, terminations, truncations, infos = zip(*results, strict=True)
            self._store(ids, rows, observations, rewards, terminations, truncations)
            values = {env_id: info for env_id, info in zip(ids, infos, strict=True) if info}
        else:
            values = {}
        return Done(Step, call.env_ids, values, tuple(failures))

    def _restarted_into_buffers(self, env_id: int, env: gym.Env, result: tuple) -> tuple:
        """As :func:`_restarted`, with the ended episode's last obs written into its row of ``buffers.ended_obs``
        (a copy: the env may reuse its obs array) and flagged in ``buffers.ended``, rather than put in the info."""
        obs, reward, terminated, truncated, info = result
        self.buffers.ended_obs[env_id] = obs
        new_obs, info = _reset_after_end(env, info)
        self._ended[env_id] = True  # only once the reset succeeded: a failed one reports the env's error instead
        return new_obs, reward, terminated, truncated, info

    def _store(
        self,
        ids: tuple[int, ...],
        rows: slice | list[int],
        observations: Sequence,
        rewards: Sequence,
        terminations: Sequence,
        truncations: Sequence,
    ) -> None:
        """Write a step's results into the buffers: one numpy assignment per array, not per env."""
        buffers = self.buffers
        buffers.reward[rows] = rewards
        buffers.terminated[rows] = terminations
        buffers.truncated[rows] = truncations
        if self._obs_in_rows and (self._small_obs or type(rows) is slice):
            buffers.obs[rows] = observations
        else:
            for env_id, obs in zip(ids, observations, strict=True):
                self._write_obs(env_id, obs)

    def _get_attr(self, call: GetAttr) -> Reply:
        def get(env: gym.Env, env_id: int) -> Any:
            return env.get_wrapper_attr(call.name) if env.has_wrapper_attr(call.name) else None

        return self._each(call, call.name, get)

    def _set_attr(self, call: SetAttr) -> Reply:
        return self._each(call, call.name, lambda env, env_id: env.set_wrapper_attr(call.name, call.value))

    def _call_method(self, call: CallMethod) -> Reply:
        arguments = dict(zip(call.env_ids, call.data, strict=True))

        def invoke(env: gym.Env, env_id: int) -> Any:
            method = functools.partial(call.name, env) if callable(call.name) else env.get_wrapper_attr(call.name)
            return _invoke(method, arguments[env_id])

        return self._each(call, method_name(call), invoke)

    def _each(self, call: Call, method: str, run: Callable[[gym.Env, int], Any]) -> Reply:
        """``run(env, env_id)`` on every env of ``call``; each env's value, or its failure."""
        values, failures = {}, []
        for env_id in call.env_ids:
            env = self._env(env_id)
            try:
                values[env_id] = run(env, env_id)
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, method, exc))
        return Done(type(call), call.env_ids, values, tuple(failures))

    def _replace(self, call: ReplaceEnv) -> Reply:
        sources = dict(zip(call.env_ids, call.sources, strict=True))
        return self._each(call, "replace", lambda old, env_id: self._put_new_env(env_id, sources[env_id]))

    def _put_new_env(self, env_id: int, source: EnvSource) -> gym.Env:
        """Build an env from ``source`` and put it in place of env ``env_id``, which is closed."""
        old = self._env(env_id)
        new = _make_env(source)
        if new.unwrapped is old.unwrapped:
            raise ValueError(
                f"env {env_id} was given as an env instance, which runs here as it is: it cannot be rebuilt from "
                "itself. Pass a factory to rebuild it"
            )
        # The buffers are shaped by the spaces: a new env must fit the old one's rows.
        for kind in ("observation_space", "action_space"):
            mine, theirs = getattr(new, kind), getattr(old, kind)
            if mine != theirs:
                _close_quietly(new)
                raise ValueError(f"the new env has {kind} {mine}, but env {env_id} has {theirs}")
        _close_quietly(old)
        self.envs[env_id - self.first_id] = new
        return new

    def _rebuild(self, call: Rebuild) -> Reply:
        """A new env from its source for each env named, reset: answered as a reset is."""
        infos, failures = {}, []
        for env_id, source, seed in zip(call.env_ids, call.sources, call.seeds, strict=True):
            method = "make"
            try:
                env = self._put_new_env(env_id, source)
                method = "reset"
                obs, info = env.reset(seed=seed)
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, method, exc))
                continue
            self._write_obs(env_id, obs)
            infos[env_id] = info
        return Done(Rebuild, call.env_ids, infos, tuple(failures))
