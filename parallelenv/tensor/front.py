"""The ``tensor`` backend: a ParallelEnv over one batched :class:`TensorEnv`.

The envs are rows of tensors on one device, so there is nothing to
dispatch: a call runs at once, in the caller, as masked tensor operations.
The policies of :mod:`parallelenv.policies` run unchanged over a boolean
``finished`` tensor. ``step`` on every env (``id=None``) skips all index
work; with ``id``, the rows are picked with an index tensor. Nothing in a
step reads a value back from the device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from parallelenv import arguments
from parallelenv.backends.base import unknown_options
from parallelenv.batching import check_batch
from parallelenv.calls import Failure
from parallelenv.errors import AlreadyPendingError, ClosedError
from parallelenv.parallel_env import DEFAULT_CALL_TIMEOUT_S, ParallelEnv, _name
from parallelenv.policies import resolve_policy
from parallelenv.serialised import one_caller_at_a_time
from parallelenv.tensor.env import Rows, TensorEnv, torch_dtype
from parallelenv.tensor.results import (
    StepResult,
    apply_none_results,
    concatenate,
    per_env_resets,
    per_env_results,
    rows,
)

_MISSING = object()


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


class TensorParallelEnv(ParallelEnv):
    """``ParallelEnv(tensor_env, para_mode="tensor")``: the front API over a :class:`TensorEnv`.

    Results are torch tensors on the env's device; ``info`` entries are
    tensors too, and present on every step (their ``_`` masks say which envs
    set them), since deciding whether any env set one would mean reading
    the device. ``info["env_id"]`` of :meth:`recv` is a NumPy array.

    A step of every env (``id=None``) hands over the env's output buffers,
    allocated once and rewritten by the next step, as Isaac Gym does: copy
    (``.clone()``) what you keep beyond it, or pass ``copy=True`` for fresh
    tensors (on the CPU, fresh megabytes cost page faults that nearly halve
    the speed at N=65536). The env's state lives elsewhere, so changing the
    buffers changes no env. Results for ``id`` are always fresh tensors.

    Example:
        >>> import torch
        >>> from parallelenv import ParallelEnv
        >>> from parallelenv.envs import CartPole
        >>> with ParallelEnv(CartPole(num_envs=1024, device="cpu"), para_mode="tensor", asynchronous="restart") as penv:
        ...     obs, info = penv.reset(seed=0)
        ...     obs, reward, terminated, truncated, info = penv.step(torch.ones(1024, dtype=torch.int64))
        >>> obs.shape, sorted(info)
        (torch.Size([1024, 4]), ['_ended_state', '_reset', 'ended_state', 'reset'])
    """

    def __init__(
        self, envs: Any, para_mode: str = "tensor", asynchronous: str | None = None, **options: Any
    ) -> None:
        """Takes the arguments and defaults of :class:`ParallelEnv`; ``num_gpus`` and ``no_warning`` do not apply."""
        self._closed = True
        self.para_mode, self.asynchronous = para_mode, asynchronous
        self._policy = resolve_policy(asynchronous)
        self.call_timeout = options.pop("call_timeout", DEFAULT_CALL_TIMEOUT_S)
        arguments.check_limits(options.pop("num_cpus", None), self.call_timeout)
        options.pop("num_gpus", None)
        options.pop("no_warning", None)
        if not isinstance(envs, TensorEnv):
            raise TypeError(f"para_mode='tensor' runs one TensorEnv, not a {type(envs).__name__} (a non-empty list "
                            "of gym envs goes to the other backends)")
        self._copy = bool(options.pop("copy", False))
        output = options.pop("output", "torch")
        if output != "torch":
            raise ValueError(f"output={output!r}: the tensor backend's results are torch tensors")
        options.pop("device", None)  # the env's own device decides
        unknown_options("tensor", options)
        self.env = envs
        n = self.num_envs = envs.num_envs
        self.device = envs.device
        self.single_observation_space = envs.single_observation_space
        self.single_action_space = envs.single_action_space
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._action_shape = torch.Size((n, *(self.single_action_space.shape or ())))
        self._action_dtype = torch_dtype(self.single_action_space)
        self._finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        # Allocated once: a fresh megabyte every step costs page faults that double a step at large N.
        self._ended = torch.empty_like(envs.obs)
        self._done = torch.empty_like(envs.terminated)
        self._pending = np.zeros(n, dtype=bool)  # sent, not yet received: host-side bookkeeping
        self._sent: list[tuple[np.ndarray, StepResult]] = []
        self._closed = False

    @classmethod
    def make(cls, env_id: str, num_envs: int, para_mode: str = "tensor", **kwargs: Any) -> ParallelEnv:
        """The tensor env registered for ``env_id`` (see :mod:`parallelenv.envs`); keyword
        arguments the ParallelEnv does not take go to the env (``device=``, ...)."""
        from parallelenv.envs import make_tensor_env

        front = {k: kwargs.pop(k) for k in ("asynchronous", "num_cpus", "num_gpus", "no_warning", "call_timeout",
                                            "output") if k in kwargs}
        backend_options = kwargs.pop("backend_options", None) or {}
        return cls(make_tensor_env(env_id, num_envs, **kwargs), para_mode, **front, **backend_options)

    # ----------------------------------------------------------------- public calls

    @one_caller_at_a_time
    def reset(self, seed: Any = None, options: Any = None, id: Any = None, align: str = "item") -> Any:
        ids = self._ids(id)
        arguments.check_align(align)
        seeds = arguments.seed_argument(seed, self._host_ids(ids))
        per_env_options = arguments.env_options(options, self._host_ids(ids))
        index = None if ids is None else self._index(ids)
        self._require_idle(ids, "reset")
        try:
            if seeds is not None:
                self.env.rng.seed(index, seeds)
            info: dict[str, Any] = {}
            for env_options, rows_of in self._option_groups(per_env_options, ids, index):
                self.env.reset_rows(rows_of, env_options)
                info.update(self.env.infos)  # envs outside the rows keep their masks False
        except Exception as exc:
            self._raise_env_error(exc, ids, "reset")
        if index is None:
            self._finished.zero_()
        else:
            self._finished[index] = False
        obs = self.env.obs.clone() if index is None else self.env.obs[index]
        info = rows(info, index)
        return per_env_resets(obs, info) if align == "batch" else (obs, info)

    @one_caller_at_a_time
    def step(self, actions: Any, id: Any = None, align: str = "item") -> Any:
        ids = self._ids(id)
        if align != "item":
            arguments.check_align(align)
        result = self._run_step(actions, ids)
        return per_env_results(result, None) if align == "batch" else result.as_item()

    @one_caller_at_a_time
    def send(self, actions: Any, id: Any = None) -> None:
        ids = self._ids(id)
        result = self._run_step(actions, ids)
        host = self._host_ids(ids)
        self._pending[host] = True
        self._sent.append((host, result))

    @one_caller_at_a_time
    def recv(self, wait_num: int | None = None, timeout: float | None = None, align: str = "item") -> Any:
        self._check_usable()
        arguments.check_align(align)
        arguments.wait_count(wait_num, int(self._pending.sum()))
        # A batched env answers every send as it is made: all of them are ready.
        sent, self._sent = self._sent, []
        self._pending[:] = False
        env_ids = np.concatenate([host for host, _ in sent])
        result = concatenate([r for _, r in sent])
        if align == "batch":
            return per_env_results(result, env_ids)
        result.info["env_id"], result.info["_env_id"] = env_ids, np.ones(len(env_ids), dtype=bool)
        return result.as_item()

    @one_caller_at_a_time
    def get_env_attr(self, name: str, id: Any = None) -> list[Any]:
        """Per-env tensors (first dimension ``num_envs``) come back as each env's row; any
        other attribute as the same value for every env; None where there is none."""
        ids = self._ids(id)
        name = _name(name)
        count = self.num_envs if ids is None else len(ids)
        try:
            value = getattr(self.env, name, None)
        except Exception as exc:
            self._raise_env_error(exc, ids, name)
        if isinstance(value, torch.Tensor) and self._per_env(value):
            return list((value if ids is None else value[self._index(ids)]).unbind(0))
        return [value] * count

    @one_caller_at_a_time
    def set_env_attr(self, name: str, value: Any, id: Any = None) -> None:
        """A per-env tensor gets ``value`` in the rows of ``id``; any other attribute can
        only be set for every env at once."""
        ids = self._ids(id)
        name = _name(name)
        try:
            current = getattr(self.env, name, _MISSING)
            per_env = isinstance(current, torch.Tensor) and self._per_env(current)
        except Exception as exc:
            self._raise_env_error(exc, ids, name)
        if not per_env and ids is not None and len(ids) < self.num_envs:
            raise ValueError(f"{name!r} is not a per-env tensor of this {type(self.env).__name__}, so it is "
                             "shared by every env: set it with id=None")
        try:
            if isinstance(current, torch.Tensor) and per_env:
                current[slice(None) if ids is None else self._index(ids)] = value
            else:
                setattr(self.env, name, value)
        except Exception as exc:
            self._raise_env_error(exc, ids, name)

    @one_caller_at_a_time
    def customized_method(self, name: str | Callable[..., Any], data: Any = None, id: Any = None) -> list[Any]:
        """Call ``env.name`` once for the batch; it returns one value per env of ``ids``.

        ``ids`` is an index tensor on the env's device. ``data=None`` calls
        ``env.name(ids)``. Keyword dicts, one per env, are batched per keyword:
        ``data=[{"x": 1, "y": 2}, {"x": 3, "y": 4}]`` calls
        ``env.name(ids, x=[1, 3], y=[2, 4])``, each list in the order of ``id``
        (every dict must have the same keys). Any other entries are passed as
        one list: ``env.name(ids, data)``. A function is called as
        ``name(env, ids, ...)`` with the same arguments.

        Example:
            >>> import torch
            >>> from parallelenv import ParallelEnv
            >>> from parallelenv.envs import CartPole
            >>> class Pushed(CartPole):
            ...     def push(self, ids, velocity, spin):
            ...         self.state[ids, 1] += torch.tensor(velocity, device=self.device)
            ...         self.state[ids, 3] += torch.tensor(spin, device=self.device)
            ...         return self.state[ids, 1].tolist()
            >>> with ParallelEnv(Pushed(num_envs=4, device="cpu"), para_mode="tensor") as penv:
            ...     _ = penv.reset(seed=0)
            ...     velocities = penv.customized_method("push", [{"velocity": 1.0, "spin": 0.0},
            ...                                                  {"velocity": -1.0, "spin": 0.5}], id=[2, 0])
            >>> [round(v) for v in velocities]
            [1, -1]
        """
        ids = self._ids(id)
        function = name if callable(name) else None
        name = getattr(function, "__name__", "function") if function else _name(name)
        host = self._host_ids(ids)
        per_env = None if data is None else list(arguments.per_env(data, host, "data"))
        keywords = None if per_env is None else _keywords_batched(per_env)
        index = torch.from_numpy(host).to(self.device)
        try:
            method = functools.partial(function, self.env) if function else getattr(self.env, name)
            if per_env is None:
                values = method(index)
            else:
                values = method(index, per_env) if keywords is None else method(index, **keywords)
            values = list(values)
        except Exception as exc:
            self._raise_env_error(exc, ids, name)
        if len(values) != len(host):
            raise ValueError(f"{type(self.env).__name__}.{name} returned {len(values)} values for {len(host)} envs")
        return values

    @property
    def reuses_result_buffers(self) -> bool:  # type: ignore[override]
        return not self._copy

    @one_caller_at_a_time
    def replace_envs(self, envs: Any, id: Any = None) -> None:
        """Not for a batched env: its envs are rows of one object, not objects of their own."""
        raise TypeError(
            "para_mode='tensor' runs one batched TensorEnv, whose envs cannot be replaced one by one: "
            "set their per-env attributes with set_env_attr, or build a new TensorEnv"
        )

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sent = []
        self.env.close()

    # ----------------------------------------------------------------- helpers

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("this ParallelEnv is closed")

    def _ids(self, id: Any) -> np.ndarray | None:  # type: ignore[override]  # None: every env, the fast path
        """None for every env (the fast path), else the checked host index array."""
        self._check_usable()
        if id is None:
            return None
        if isinstance(id, torch.Tensor):
            id = id.cpu().numpy()  # ids that came back from the device: one read, outside any step
        return arguments.env_ids(id, self.num_envs)

    def _host_ids(self, ids: np.ndarray | None) -> np.ndarray:
        return np.arange(self.num_envs) if ids is None else ids

    def _index(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(ids).to(self.device, non_blocking=True)

    def _require_idle(self, ids: np.ndarray | None, doing: str) -> None:
        if not self._sent:
            return
        busy = np.flatnonzero(self._pending) if ids is None else ids[self._pending[ids]]
        if busy.size:
            raise AlreadyPendingError(f"{doing} envs {busy.tolist()} whose previous call has not been received: "
                                      "recv() first")

    def _actions(self, actions: Any, count: int) -> torch.Tensor:
        if (isinstance(actions, torch.Tensor) and actions.shape == self._action_shape
                and actions.dtype == self._action_dtype and actions.device == self.device):
            return actions  # the hot path: a whole batch, as the env takes it
        expected = (count, *self._action_shape[1:])
        if isinstance(actions, torch.Tensor):
            if tuple(actions.shape) != expected:
                raise ValueError(f"actions has shape {tuple(actions.shape)}; expected {expected} "
                                 f"({count} envs of {self.single_action_space})")
            if actions.dtype == self._action_dtype and actions.device == self.device:
                return actions
            if actions.dtype != self._action_dtype:
                if actions.is_floating_point() and not self._action_dtype.is_floating_point:
                    raise TypeError(f"actions of dtype {actions.dtype} cannot be cast safely to "
                                    f"{self.single_action_space.dtype} of {self.single_action_space}")
                actions = actions.to(self._action_dtype)
            return actions.to(self.device, non_blocking=True)
        checked = np.asarray(check_batch(self.single_action_space, actions, count))
        return torch.from_numpy(checked.astype(self.single_action_space.dtype, copy=False)).to(self.device)

    def _run_step(self, actions: Any, ids: np.ndarray | None) -> StepResult:
        self._require_idle(ids, "send to")
        acts = self._actions(actions, self.num_envs if ids is None else len(ids))
        env, policy = self.env, self._policy
        index = None if ids is None else self._index(ids)
        idle = None
        try:
            if index is None and not policy.tracks_finished:
                env.infos = {}
                env.step_envs(acts)  # the fast path: every env, no masks
                asked = None
            else:
                asked = env._everyone.clone() if index is None else env.mask(index)
                if index is not None:
                    env.actions[index] = acts
                    acts = env.actions
                if policy.tracks_finished:
                    idle = self._finished.clone() if index is None else self._finished[index]
                    asked &= ~self._finished
                env.step_where(acts, asked)
        except Exception as exc:
            self._raise_env_error(exc, ids, "step")
        result = self._collect(index, asked)
        if idle is not None:
            apply_none_results(result, idle)
        return result

    def _collect(self, index: torch.Tensor | None, asked: torch.Tensor | None) -> StepResult:
        """This step's rows of the env's output buffers; restart or finish envs as the policy says.

        A step of every env hands the buffers over as they are (the env only
        writes them, never reads them); with ``id``, or when None results
        will be written into them, the rows are copied.
        """
        env, policy = self.env, self._policy
        done = torch.logical_or(env.terminated, env.truncated, out=self._done)
        if asked is not None:
            done &= asked
        info = rows(env.infos, index) if env.infos else {}
        mine = done if index is None else done[index]
        if policy.restarts_finished_envs:
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
                self._raise_env_error(exc, None if index is None else index.cpu().numpy(), "reset")
            env.infos = {}
            if self._copy and index is None:
                ended, mine = ended.clone(), mine.clone()
            # One tensor serves as the value and the mask of both entries.
            info["ended_state"], info["_ended_state"], info["reset"], info["_reset"] = ended, mine, mine, mine
        if policy.tracks_finished:
            policy.after_step(self._finished, slice(None) if index is None else index, mine)
        if index is not None:
            return StepResult(env.obs[index], env.reward[index], env.terminated[index], env.truncated[index], info)
        if policy.tracks_finished or self._copy:  # the caller's own, or None results go into them
            return StepResult(env.obs.clone(), env.reward.clone(), env.terminated.clone(), env.truncated.clone(), info)
        return StepResult(env.obs, env.reward, env.terminated, env.truncated, info)

    def _option_groups(
        self, per_env_options: Sequence[Any], ids: np.ndarray | None, index: torch.Tensor | None
    ) -> list[tuple[Any, Rows]]:
        """Envs that share reset options, as (options, rows) pairs: one reset per distinct options."""
        first = per_env_options[0] if per_env_options else None
        if all(o is first for o in per_env_options) or all(o == first for o in per_env_options):
            return [(first, index)]
        groups: list[tuple[Any, list[int]]] = []
        for env_id, options in zip(self._host_ids(ids).tolist(), per_env_options, strict=True):
            for group_options, members in groups:
                if group_options == options:
                    members.append(env_id)
                    break
            else:
                groups.append((options, [env_id]))
        return [(options, self._index(np.array(members))) for options, members in groups]

    def _raise_env_error(self, exc: Exception, ids: np.ndarray | None, method: str) -> Any:
        """An exception from the env's code becomes an EnvError naming the env.

        A batched env raises once for the batch: it names the env at fault by
        setting ``env_index`` on the exception; otherwise the first env of the call is named.
        """
        env_index = getattr(exc, "env_index", None)
        if not isinstance(env_index, int):
            env_index = 0 if ids is None else int(ids[0])
        Failure.from_exception(env_index, method, exc).raise_error()

    def _per_env(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.num_envs
