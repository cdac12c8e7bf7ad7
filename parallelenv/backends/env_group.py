"""Runs calls against a group of envs: the only per-env logic of the CPU backends.

Every CPU backend hosts its envs in :class:`EnvGroup` objects: the dummy
backend one in the caller, the subprocess backend one per worker process,
the Ray backends one per actor. A group reads its envs' actions from and
writes their results into :class:`Buffers` rows indexed by global env id,
and answers every call with a :class:`Reply`: an env that raises is
reported in it, and the call still runs on every other env it names.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv.backends.buffers import Buffers
from parallelenv.backends.env_sources import EnvSource, close_quietly, make_env
from parallelenv.backends.spaces import SpacePair, check_replacement
from parallelenv.batching import is_per_env_objects, row_writer, rows_reader, rows_view
from parallelenv.calls import (
    NO_ARGUMENT,
    Arguments,
    Call,
    CallMethod,
    Failure,
    GetAttr,
    Rebuild,
    ReplaceEnv,
    Replay,
    Reply,
    Reset,
    SetAttr,
    Step,
    method_name,
)
from parallelenv.infos.keys import ENDED_STATE, RESET, RESET_INFO
from parallelenv.state.capture import EnvState, captured, restore_env
from parallelenv.timing.host_clock import TIMES_ATTRIBUTE, HostClock

# Observations are written in one assignment from the list of them when
# their rows are a slice (a whole group's step): NumPy copies each into its
# row, with no temporary array, faster than row by row (the performance
# page). Rows picked by a list are written one by one: a list assignment
# through fancy indexing first stacks the frames, an extra copy of each,
# which costs more than the loop once a row is larger than this.
ROW_BY_ROW_BYTES = 4096


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

    def __init__(self, envs: list[gym.Env], first_id: int, restart: bool, timed: bool = False) -> None:
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
            Replay: self._replay,
        }
        # States taken since the envs' last call, for the snapshot step expected next (take_ahead_if_due),
        # and what it is expected from: the calls between the last two snapshot steps, and the last one's.
        self.taken_ahead: dict[int, EnvState | str] | None = None
        self._cadence = self._calls_since_snapshot = 0
        self._snapshot_ids: tuple[int, ...] = ()
        self._trusted: frozenset[str] = frozenset()
        # ParallelEnv(stats=True): each env's step and reset times, and the time spent running calls.
        self._clock = HostClock(self.all_ids) if timed else None
        if timed:
            self.run = self._timed_run  # type: ignore[method-assign]

    def spaces(self) -> list[SpacePair]:
        """Each env's observation and action space."""
        return [(env.observation_space, env.action_space) for env in self.envs]

    def attach(self, buffers: Buffers) -> None:
        self.buffers = buffers
        self._read_actions = rows_reader(buffers.actions)
        # A step of the whole group (every step of a training loop) reads its rows through views made once.
        self._read_group_actions = rows_reader(rows_view(buffers.actions, self._all_rows))
        obs = buffers.obs
        # Late bound for one array: the renew handover puts a new one in its place (handover.Renew).
        self._write_obs = self._write_obs_row if isinstance(obs, np.ndarray) else row_writer(obs)
        self._obs_in_rows = isinstance(obs, np.ndarray) and not is_per_env_objects(obs)
        self._small_obs = self._obs_in_rows and obs[0].nbytes <= ROW_BY_ROW_BYTES
        self._ended = buffers.ended if self.restart else None
        self._ended_since_cleared = self._ended is not None  # whether any row of this group's may be set
        self._columns = buffers.info_columns

    def run(self, call: Call) -> Reply:
        if type(call) is Step and call.snapshot is not None:
            self._snapshot_came(call)
        else:
            self._calls_since_snapshot += 1
            self.taken_ahead = None  # they were taken for a snapshot step, and another call came
        return self._handlers[type(call)](call)

    def _timed_run(self, call: Call) -> Reply:
        began = perf_counter()
        try:
            return EnvGroup.run(self, call)
        finally:
            self._clock.ran_call(perf_counter() - began)  # type: ignore[union-attr]

    def _snapshot_came(self, call: Step) -> None:
        if self._snapshot_ids:
            self._cadence = self._calls_since_snapshot + 1
        if call.snapshot != self._trusted:
            self.taken_ahead = None  # taken with other classes' pickles trusted
        self._calls_since_snapshot, self._snapshot_ids, self._trusted = 0, call.env_ids, call.snapshot

    def take_ahead_if_due(self) -> None:
        """Where the calls so far say a snapshot step comes next (lossless healing's cadence), take the
        states it will want now: a host calls this between calls, when nothing waits on this process, and
        the snapshot step then costs the time of its step alone. Another call drops them (see run)."""
        if not self._cadence or self._calls_since_snapshot + 1 != self._cadence or self.taken_ahead is not None:
            return
        began = perf_counter()
        self.taken_ahead = {env_id: captured(self._env(env_id), self._trusted) for env_id in self._snapshot_ids}
        if self._clock is not None:
            self._clock.ran_call(perf_counter() - began)

    def _write_obs_row(self, env_id: int, obs: Any) -> None:
        self.buffers.obs[env_id] = obs

    def close(self) -> None:
        for env in self.envs:
            close_quietly(env)

    def _env(self, env_id: int) -> gym.Env:
        return self.envs[env_id - self.first_id]

    def _reset(self, call: Reset) -> Reply:
        infos, failures = {}, []
        clock = self._clock
        for env_id, seed, options in zip(call.env_ids, call.seeds, call.options, strict=True):
            try:
                if clock is None:
                    obs, info = self._env(env_id).reset(seed=seed, options=options)
                else:
                    began = perf_counter()
                    obs, info = self._env(env_id).reset(seed=seed, options=options)
                    clock.resets[env_id].add(perf_counter() - began)
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, "reset", exc))
                continue
            self._write_obs(env_id, obs)
            infos[env_id] = info
        return Reply(Reset, call.env_ids, infos, tuple(failures))

    def _step(self, call: Step) -> Reply:
        if call.snapshot is not None:
            return self._snapshot_and_step(call)
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
        restart, clock = self.restart, self._clock
        step_times = clock.step_times if clock is not None else None
        if self._ended_since_cleared:  # until an env's episode ends, below; rows of others may stay set
            self._ended[rows] = False  # type: ignore[index]
            self._ended_since_cleared = type(rows) is not slice
        for env_id, env, action in zip(ids, envs, actions, strict=True):
            try:
                if clock is None:
                    result = env.step(action)
                else:
                    began = perf_counter()
                    result = env.step(action)
                    step_times[env_id].append(perf_counter() - began)  # type: ignore[index]
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, "step", exc))
                continue
            if restart and (result[2] or result[3]):
                try:
                    result = self._restarted(env_id, env, result)
                except Exception as exc:
                    failures.append(Failure.from_exception(env_id, "reset", exc))
                    continue
            results.append(result)
        stepped = rows
        if failures:  # the rows of the envs that raised keep what they held
            failed = {failure.env_index for failure in failures}
            ids = tuple(env_id for env_id in ids if env_id not in failed)
            rows = list(ids)
        infos: Sequence[dict] = ()
        if results:
            observations, rewards, terminations, truncations, infos = zip(*results, strict=True)
            self._store(ids, rows, observations, rewards, terminations, truncations)
        columns = self._columns
        if columns is not None and columns.columns:
            values = columns.write(stepped, ids, infos)
        else:
            # Most steps of most envs have no info: one C-level pass says so before any dict is built.
            values = {env_id: info for env_id, info in zip(ids, infos, strict=True) if info} if any(infos) else {}
        return Reply(Step, call.env_ids, values, tuple(failures))

    def _snapshot_and_step(self, call: Step) -> Reply:
        """Each env's state before it steps (lossless healing's snapshot, see Step.snapshot), in the reply;
        those taken ahead where they were (nothing has changed them since)."""
        assert call.snapshot is not None
        taken, self.taken_ahead = self.taken_ahead or {}, None
        states = {env_id: taken[env_id] if env_id in taken else captured(self._env(env_id), call.snapshot)
                  for env_id in call.env_ids}
        return self._step(Step(call.env_ids, call.live, call.awaited)).with_states(states)

    def _restarted(self, env_id: int, env: gym.Env, result: tuple) -> tuple:
        """The step result of an env that finished, reset in the same step ("restart").

        The env may reuse its obs array for the next episode, so the ended
        episode's last obs is copied before the reset: into its row of
        ``buffers.ended_obs`` where the buffers have those rows, else into
        the info as ``ended_state``. The reset's info, if any, is the info's
        ``reset_info``, as Gymnasium's same-step autoreset reports it.
        """
        obs, reward, terminated, truncated, info = result
        ended = self._ended
        if ended is None:
            ended_state = obs.copy() if isinstance(obs, np.ndarray) else copy.deepcopy(obs)
        else:
            self.buffers.ended_obs[env_id] = obs
        if self._clock is None:
            new_obs, reset_info = env.reset()
        else:
            began = perf_counter()
            new_obs, reset_info = env.reset()
            self._clock.resets[env_id].add(perf_counter() - began)
        if reset_info:
            info = {**info, RESET_INFO: reset_info}
        if ended is None:
            info = {**info, ENDED_STATE: ended_state, RESET: True}
        else:
            ended[env_id] = True  # only once the reset succeeded: a failed one reports the env's error instead
            self._ended_since_cleared = True
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
        if call.name == TIMES_ATTRIBUTE:  # the host's clock (None where it keeps none), not the envs'
            times = self._clock.read(call.env_ids) if self._clock is not None else dict.fromkeys(call.env_ids)
            return Reply(GetAttr, call.env_ids, times)

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
        return Reply(type(call), call.env_ids, values, tuple(failures))

    def _replace(self, call: ReplaceEnv) -> Reply:
        sources = dict(zip(call.env_ids, call.sources, strict=True))
        return self._each(call, "replace", lambda old, env_id: self._put_new_env(env_id, sources[env_id]))

    def _put_new_env(self, env_id: int, source: EnvSource) -> gym.Env:
        """Build an env from ``source`` and put it in place of env ``env_id``, which is closed."""
        old = self._env(env_id)
        new = make_env(source)
        if new.unwrapped is old.unwrapped:
            raise ValueError(
                f"env {env_id} was given as an env instance, which runs here as it is: it cannot be rebuilt from "
                "itself. Pass a factory to rebuild it"
            )
        try:
            check_replacement(new, old, env_id)
        except ValueError:
            close_quietly(new)
            raise
        close_quietly(old)
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
        return Reply(Rebuild, call.env_ids, infos, tuple(failures))

    def _replay(self, call: Replay) -> Reply:
        """Each env back in its snapshot, replaying its entries; the last, the step under way, is stepped
        as any step is (its results in the buffers). An env that raises on the way fails the step."""
        failures, stepping = [], []
        for env_id, state, entries in zip(call.env_ids, call.states, call.entries, strict=True):
            env = self._env(env_id)
            try:
                restore_env(env, state)
                for entry in entries[:-1]:
                    if entry[0] == "reset":
                        env.reset(seed=entry[1], options=entry[2])
                    elif any(env.step(entry[1])[2:4]) and self.restart:  # as _restarted resets it
                        env.reset()
            except Exception as exc:
                failures.append(Failure.from_exception(env_id, "replay", exc))
                continue
            row_writer(self.buffers.actions)(env_id, entries[-1][1])
            stepping.append(env_id)
        stepped = self._step(Step(tuple(stepping))) if stepping else Reply(Step, (), {}, ())
        return Reply(Replay, call.env_ids, stepped.values, (*failures, *stepped.failures))
