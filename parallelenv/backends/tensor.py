"""The ``tensor`` backend: one batched :class:`~parallelenv.tensor.TensorEnv`, its envs rows of tensors.

There is nothing to send anywhere: a call runs at once, in the caller, as
masked tensor operations, and ``collect`` hands its reply back. The
buffers are the env's own output tensors, so a step of every env moves no
data; each reply carries the env's vector info as it is (``Reply.info``).
Nothing in a step reads a value back from the device: finished envs come
as a mask (``Step.live``), and an env that ended is restarted through a
mask too. The env raises for the batch: its exception names the env at
fault through an ``env_index`` attribute (else the first env of the
call), and the call counts as run on no env.
"""

from __future__ import annotations

import functools
from typing import Any

from parallelenv.arrays import import_torch

torch = import_torch("the tensor backend")

from parallelenv.arguments import DerivedSeeds  # noqa: E402  (after torch's ImportError says what to install)
from parallelenv.backends.base import BackendConfig, RunsInCaller, unknown_options  # noqa: E402
from parallelenv.backends.buffers import Buffers  # noqa: E402
from parallelenv.backends.env_sources import refuse_env_ids  # noqa: E402
from parallelenv.calls import NO_ARGUMENT, Call, CallMethod, Failure, GetAttr, ReplaceEnv, Reply, Reset, SetAttr, Step  # noqa: E402
from parallelenv.infos.keys import ENDED_STATE, ENDED_STATE_MASK, RESET, RESET_MASK  # noqa: E402
from parallelenv.tensor.compiled import FusedStep, resolve_mode  # noqa: E402
from parallelenv.tensor.env import Rows, TensorEnv  # noqa: E402
from parallelenv.timing.device_clock import DeviceClock  # noqa: E402
from parallelenv.timing.host_clock import TIMES_ATTRIBUTE  # noqa: E402

_MISSING = object()


class TensorBackend(RunsInCaller):
    """Runs each call on the batched env at once; ``collect`` hands back the reply.

    Args:
        env: the :class:`TensorEnv`.
        compile: run a step of every env (with its restarts) as one compiled function: ``"auto"`` (the
            default: compiled for the shipped envs from 65,536 envs on the CPU, its compile time logged
            once as a warning; else eager), False (eager), True (the best for the env's device), or a
            mode of :data:`parallelenv.tensor.compiled.MODES`. Results equal the eager step's within
            float rounding; an env whose step cannot be compiled runs eager, with a warning.

    Results of a call on every env are the env's output buffers, which the
    next step rewrites (``ParallelEnv(copy=False)``, its default here), as
    Isaac Gym hands them over: on the CPU, fresh megabytes every step cost
    page faults, which slow large batches down. ``copy=True`` gives
    fresh tensors.
    """

    calls_each_batch_once = True  # a CallMethod is one call of the batched env (see _call)

    def __init__(self, env: Any, config: BackendConfig, compile: Any = "auto", **options: Any) -> None:
        unknown_options("tensor", options)
        refuse_env_ids(env)
        if not isinstance(env, TensorEnv):
            raise TypeError(f"para_mode='tensor' runs one TensorEnv, not a {type(env).__name__} (a non-empty list "
                            "of gym envs goes to the other backends)")
        if config.restarts_workers or config.rebuilds_envs:
            raise ValueError(
                "para_mode='tensor' has no workers to restart and no per-env envs to rebuild: all its envs are one "
                "TensorEnv in the caller. Use on_worker_failure='raise' and on_env_error='raise' (the defaults)"
            )
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.buffers = Buffers(env.obs, env.actions, env.reward, env.terminated, env.truncated, lent=True)
        self._restarts = config.policy.restarts_finished_envs
        # Allocated once: a fresh megabyte every step costs page faults, a large share of a step at large N.
        self._ended = torch.empty_like(env.obs)
        self._done = torch.empty_like(env.terminated)
        self._replies: list[Reply] = []
        self._every_env_ids = tuple(range(self.num_envs))
        mode = resolve_mode(compile, env)
        self._fused = None if mode is None else \
            FusedStep(env, self._restarts, self._ended, self._done, mode, asked=compile != "auto")
        self._clock = DeviceClock(env.device) if config.times_envs else None  # ParallelEnv(stats=True)

    def dispatch(self, call: Call) -> None:
        index = None if self._every_env(call.env_ids) else self._index(call.env_ids)
        try:
            if type(call) is Step:
                info = self._step(index, call.live) if self._clock is None else \
                    self._clock.timed("step", lambda: self._step(index, call.live))
                self._replies.append(Reply(Step, call.env_ids, {}, (), info))
            elif type(call) is Reset:
                info = self._reset(call, index) if self._clock is None else \
                    self._clock.timed("reset", lambda: self._reset(call, index))
                self._replies.append(Reply(Reset, call.env_ids, {}, info=info))
            elif type(call) is GetAttr and call.name == TIMES_ATTRIBUTE:  # the clock's, not the env's
                times = self._clock.read(call.env_ids) if self._clock is not None else [None] * len(call.env_ids)
                self._replies.append(Reply(GetAttr, call.env_ids, dict(zip(call.env_ids, times, strict=True))))
            else:
                if self._fused is not None:
                    self._fused.invalidate()  # attributes may change: a captured graph would not see it
                values = self._answer(call, index)
                self._replies.append(Reply(type(call), call.env_ids, dict(zip(call.env_ids, values, strict=True))))
        except _EnvRaised as raised:
            exc, method = raised.args
            env_index = getattr(exc, "env_index", None)
            if not isinstance(env_index, int):
                env_index = call.env_ids[0]
            Failure.from_exception(env_index, method, exc).raise_error()

    def close(self) -> None:
        self._replies = []
        self.env.close()

    # ----------------------------------------------------------------- calls

    def _every_env(self, env_ids: tuple[int, ...]) -> bool:
        """Whether a call is for every env in order; the caller names them with one tuple, so
        comparing the tuple itself, not its items, answers on every step but the first."""
        if env_ids is self._every_env_ids:
            return True
        if env_ids == self._every_env_ids:
            self._every_env_ids = env_ids
            return True
        return False

    def _index(self, env_ids: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(env_ids, dtype=torch.int64).to(self.env.device, non_blocking=True)

    def _step(self, index: torch.Tensor | None, live: torch.Tensor | None) -> dict[str, Any]:
        """Step the envs of ``index`` (every env when None) that ``live`` leaves in; their results
        stay in the buffers' rows, and every other row keeps its last result."""
        env, buffers = self.env, self.buffers
        if index is None and self._fused is not None:
            try:
                info = self._fused(buffers.actions, live)
            except Exception as exc:
                raise _EnvRaised(exc, "step") from exc
            if not self._restarts:
                return info
            mine = self._done if buffers.lent else self._done.clone()
            return self._with_ended(info, self._ended if buffers.lent else self._ended.clone(), mine)
        try:
            if index is None and live is None:
                env.infos = {}
                env.step_envs(buffers.actions)  # the fast path: every env, no masks
                asked = None
            else:
                asked = env._everyone.clone() if index is None else env.mask(index)
                if live is not None:
                    if index is None:
                        asked &= live
                    else:
                        asked[index] = live
                # Envs outside ``index`` may hold results not yet received: they keep them.
                # (Envs of ``index`` that ``live`` leaves out get None results instead.)
                outputs = () if index is None else (env.reward, env.terminated, env.truncated)
                kept = [output.clone() for output in outputs]
                env.step_where(buffers.actions, asked)
                for now, before in zip(outputs, kept, strict=True):
                    torch.where(asked, now, before, out=now)
        except Exception as exc:
            raise _EnvRaised(exc, "step") from exc
        return self._finish(index, asked)

    def _finish(self, index: torch.Tensor | None, asked: torch.Tensor | None) -> dict[str, Any]:
        """The step's vector info over the envs of ``index``; under ``restart``, the envs that ended
        restarted, their last obs in ``info["ended_state"]``."""
        env = self.env
        info = _rows(env.infos, index) if env.infos else {}
        if not self._restarts:
            return info
        done = torch.logical_or(env.terminated, env.truncated, out=self._done)
        if asked is not None:
            done &= asked
        mine = done if index is None else done[index]
        restarting = env.where(done)
        if index is not None:
            ended = env.obs[index]
        elif restarting is None or restarting.dtype == torch.bool:
            ended = self._ended.copy_(env.obs)
        else:  # only the rows that ended: the others are masked out
            ended = self._ended.index_copy_(0, restarting, env.obs.index_select(0, restarting))
        try:
            env.reset_rows(restarting)
        except Exception as exc:
            raise _EnvRaised(exc, "reset") from exc
        env.infos = {}
        if not self.buffers.lent and index is None:
            ended, mine = ended.clone(), mine.clone()
        return self._with_ended(info, ended, mine)

    @staticmethod
    def _with_ended(info: dict[str, Any], ended: torch.Tensor, mine: torch.Tensor) -> dict[str, Any]:
        # One tensor serves as the value and the mask of both entries.
        info[ENDED_STATE], info[ENDED_STATE_MASK], info[RESET], info[RESET_MASK] = ended, mine, mine, mine
        return info

    def _reset(self, call: Reset, index: torch.Tensor | None) -> dict[str, Any]:
        env = self.env
        seeds = call.seeds.base if isinstance(call.seeds, DerivedSeeds) else tuple(call.seeds)
        info: dict[str, Any] = {}
        with _raised_as("reset"):
            if isinstance(seeds, int) or any(seed is not None for seed in seeds):
                env.rng.seed(index, seeds)
            for options, rows in self._option_groups(call, index):
                env.reset_rows(rows, options)
                info.update(env.infos)  # envs outside the rows keep their masks False
        return _rows(info, index)

    def _option_groups(self, call: Reset, index: torch.Tensor | None) -> list[tuple[Any, Rows]]:
        """Envs that share reset options, as (options, rows) pairs: one reset per distinct options."""
        per_env = call.options
        first = per_env[0] if per_env else None
        if all(o is first for o in per_env) or all(o == first for o in per_env):
            return [(first, index)]
        groups: list[tuple[Any, list[int]]] = []
        for env_id, options in zip(call.env_ids, per_env, strict=True):
            for group_options, members in groups:
                if group_options == options:
                    members.append(env_id)
                    break
            else:
                groups.append((options, [env_id]))
        return [(options, self._index(tuple(members))) for options, members in groups]

    def _answer(self, call: Call, index: torch.Tensor | None) -> list[Any]:
        """Attribute reads, writes and method calls: each env's answer, in the order of the call."""
        if isinstance(call, GetAttr):
            return self._get(call.name, index, len(call.env_ids))
        if isinstance(call, SetAttr):
            self._set(call.name, call.value, index, len(call.env_ids))
            return [None] * len(call.env_ids)
        if isinstance(call, CallMethod):
            return self._call(call, index)
        assert isinstance(call, ReplaceEnv), call
        raise TypeError("para_mode='tensor' runs one batched TensorEnv, whose envs cannot be replaced one by one: "
                        "set their per-env attributes with set_env_attr, or build a new TensorEnv")

    def _get(self, name: str, index: torch.Tensor | None, count: int) -> list[Any]:
        """Per-env tensors (first dimension ``num_envs``) come back as each env's row; any
        other attribute as the same value for every env; None where there is none."""
        with _raised_as(name):
            value = getattr(self.env, name, None)
        if self._has_each_envs_value(value):
            return list((value if index is None else value[index]).unbind(0))
        return [value] * count

    def _set(self, name: str, value: Any, index: torch.Tensor | None, count: int) -> None:
        """A per-env tensor gets ``value`` in the rows of ``index``; any other attribute can
        only be set for every env at once."""
        with _raised_as(name):
            current = getattr(self.env, name, _MISSING)
        per_env = self._has_each_envs_value(current)
        if not per_env and count < self.num_envs:
            raise ValueError(f"{name!r} is not a per-env tensor of this {type(self.env).__name__}, so it is "
                             "shared by every env: set it with id=None")
        with _raised_as(name):
            if per_env:
                current[slice(None) if index is None else index] = value
            else:
                setattr(self.env, name, value)

    def _call(self, call: CallMethod, index: torch.Tensor | None) -> list[Any]:
        """``env.name`` called once for the batch, with an index tensor of the call's envs first.

        No data calls ``env.name(ids)``; keyword dicts, one per env, are
        batched per keyword (``env.name(ids, x=[...], y=[...])``); any other
        entries are passed as one list (``env.name(ids, data)``). A function
        is called as ``name(env, ids, ...)``.
        """
        name = call.name if isinstance(call.name, str) else getattr(call.name, "__name__", "function")
        data = list(call.data)
        keywords = None if data[0] is NO_ARGUMENT else _keywords_batched(data)
        ids = self._index(call.env_ids) if index is None else index
        with _raised_as(name):
            method = functools.partial(call.name, self.env) if callable(call.name) else getattr(self.env, name)
            if data[0] is NO_ARGUMENT:
                values = method(ids)
            else:
                values = method(ids, data) if keywords is None else method(ids, **keywords)
            values = list(values)
        if len(values) != len(call.env_ids):
            raise ValueError(f"{type(self.env).__name__}.{name} returned {len(values)} values for "
                             f"{len(call.env_ids)} envs")
        return values

    def _has_each_envs_value(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.num_envs


class _EnvRaised(Exception):
    """An exception of the env's own code, and the method it came from."""


class _raised_as:
    """Turns an exception raised by the env's code into :class:`_EnvRaised` naming ``method``."""

    def __init__(self, method: str) -> None:
        self.method = method

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, Exception) and not isinstance(exc, _EnvRaised):
            raise _EnvRaised(exc, self.method) from exc
        return False


def _rows(info: dict[str, torch.Tensor], index: torch.Tensor | None) -> dict[str, Any]:
    """The rows of ``index`` of a vector info over every env (copies; all rows when None)."""
    return {key: value.clone() if index is None else value[index] for key, value in info.items()}


def _keywords_batched(per_env: list[Any]) -> dict[str, list[Any]] | None:
    """Keyword dicts, one per env, as one list per keyword; None when no entry is a dict.

    The batched env is called once, so the entries must agree: all dicts
    with the same keys, or none a dict (the CPU backends call each env with
    its own entry, so they take any mix).
    """
    is_dict = [isinstance(entry, dict) for entry in per_env]
    if not any(is_dict):
        return None
    if not all(is_dict):
        position = is_dict.index(False)
        raise TypeError(
            f"data[{position}] is a {type(per_env[position]).__name__}, but data[{is_dict.index(True)}] a dict "
            "of keyword arguments: the tensor backend calls its env once for the batch, so either every "
            "entry is a dict or none is"
        )
    keys = per_env[0].keys()
    for position, entry in enumerate(per_env):
        if entry.keys() != keys:
            raise ValueError(
                f"data[{position}] has the keywords {sorted(map(str, entry))}, but data[0] has "
                f"{sorted(map(str, keys))}: the tensor backend batches each keyword over the envs, so "
                "every dict must have the same keys"
            )
    return {key: [entry[key] for entry in per_env] for key in keys}
