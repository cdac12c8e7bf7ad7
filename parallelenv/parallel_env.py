"""ParallelEnv: validate the user's call, route it to a backend, assemble the results.

No IPC happens here: the backend runs the calls, and
:class:`~parallelenv.inflight.InFlight` keeps where each env's call stands.
``step`` is ``send`` followed by ``recv`` of the same envs.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing.util  # noqa: F401  (its exit hook must be registered before ours, to run after it)
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from parallelenv import arguments
from parallelenv.backends import BackendConfig, resolve_backend
from parallelenv.backends.base import Backend
from parallelenv.batching import check_batch, put, take
from parallelenv.calls import (
    NO_ARGUMENT,
    Call,
    CallMethod,
    Failure,
    GetAttr,
    ReplaceEnv,
    Reset,
    SetAttr,
    Step,
    env_error,
)
from parallelenv.errors import ClosedError
from parallelenv.inflight import InFlight
from parallelenv.policies import Policy, resolve_policy
from parallelenv.results import batch_results, item_results
from parallelenv.serialised import one_caller_at_a_time

DEFAULT_CALL_TIMEOUT_S = 600.0
# At exit, how long close() waits for a call another thread still has under way.
EXIT_LOCK_WAIT_S = 1.0


class ParallelEnv:
    """A list of Gymnasium envs stepped in parallel behind one object.

    Args:
        envs: ``gym.Env`` instances or zero-argument callables returning one.
            Factories are preferred for processes and Ray: nothing unpicklable
            crosses a process boundary.
        para_mode: where the envs run: ``"dummy"`` (the default: in the
            caller, one after another), ``"subproc"``, ``"ray"``,
            ``"ray-subproc"``, ``"tensor"`` (``envs`` is then one
            :class:`~parallelenv.tensor.TensorEnv`), or a name given to
            :func:`~parallelenv.register_backend`. README.rst says which to pick.
        asynchronous: what happens to envs that finish at different times:
            ``None`` (the default: when one env finishes, all are finished
            until ``reset``), ``"idle"``, ``"restart"`` or ``"continue"`` (see
            README). Training loops usually want ``"restart"``.
        num_cpus: cores for this ParallelEnv; default: all of this machine's
            (for the Ray backends: all of the cluster's).
        num_gpus: GPUs for the Ray backends, spread over their actors (fractions allowed).
        no_warning: silence the warnings raised inside the envs.
        call_timeout: seconds an env call may take before its worker is
            declared hung, killed, and :class:`~parallelenv.WorkerTimeoutError`
            raised; None waits forever.
        output: ``"numpy"`` (default) or ``"torch"``: results as torch tensors
            on ``device``; actions may then be torch tensors too.
        device: where ``output="torch"`` puts results (default ``"cpu"``).
        **backend_options: passed to the backend (``num_workers``,
            ``start_method`` for ``"subproc"``).

    Example:
        >>> import gymnasium as gym
        >>> from parallelenv import ParallelEnv
        >>> with ParallelEnv([lambda: gym.make("CartPole-v1")] * 4) as penv:  # dummy, asynchronous=None
        ...     obs, info = penv.reset(seed=0)
        ...     obs, rew, terminated, truncated, info = penv.step([0, 1, 0, 1])
        >>> obs.shape, penv.para_mode, penv.asynchronous
        ((4, 4), 'dummy', None)
    """

    def __new__(cls, envs: Any = None, para_mode: str = "dummy", *args: Any, **kwargs: Any) -> ParallelEnv:
        # A backend may be a ParallelEnv subclass serving the front API itself (the tensor backend).
        penv = super().__new__(_own_front(para_mode) or cls if cls is ParallelEnv else cls)
        penv._lock = threading.RLock()
        return penv

    #: Whether a step's results are buffers that the next step overwrites
    #: (the tensor backend's, by default), rather than the caller's own.
    reuses_result_buffers = False

    def __init__(
        self,
        envs: Sequence[Any],
        para_mode: str = "dummy",
        asynchronous: str | None = None,
        num_cpus: int | None = None,
        num_gpus: float = 0,
        no_warning: bool = True,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
        output: str = "numpy",
        device: Any = None,
        **backend_options: Any,
    ) -> None:
        self._closed = True  # until the backend exists, close() has nothing to do
        self._to_torch = None if output == "numpy" and device is None else _torch_output(output, device)
        if isinstance(envs, (gym.Env, str)) or not isinstance(envs, Sequence) or not envs:
            raise TypeError("envs must be a non-empty list of gym.Env instances or factories of them")
        self._policy = resolve_policy(asynchronous)
        factory = resolve_backend(para_mode)
        arguments.check_limits(num_cpus, call_timeout)
        config = BackendConfig(
            policy=self._policy,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            no_warning=no_warning,
            call_timeout=call_timeout,
        )
        self.para_mode = para_mode
        self.asynchronous = asynchronous
        self.call_timeout = call_timeout
        self._backend: Backend = factory(list(envs), config, **backend_options)
        self._closed = False
        _OPEN.add(self)
        n = self.num_envs = self._backend.num_envs
        self.single_observation_space = self._backend.single_observation_space
        self.single_action_space = self._backend.single_action_space
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._calls = InFlight(self._backend, self._policy, call_timeout)

    @classmethod
    def make(
        cls,
        env_id: str,
        num_envs: int,
        para_mode: str = "dummy",
        *,
        asynchronous: str | None = None,
        num_cpus: int | None = None,
        num_gpus: float = 0,
        no_warning: bool = True,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
        output: str | None = None,
        device: Any = None,
        backend_options: dict[str, Any] | None = None,
        **gym_kwargs: Any,
    ) -> ParallelEnv:
        """``num_envs`` copies of a registered Gymnasium env, built where they run.

        ``output`` is ``"numpy"`` (the CPU backends' default) or ``"torch"`` (the
        tensor backend's only one); ``device`` is where results live: with
        ``output="torch"`` on the CPU backends, and for ``para_mode="tensor"`` the device of the tensor env
        itself (default ``cuda`` when there is one). Other keyword arguments
        go to ``gymnasium.make`` (or to the tensor env).

        Example:
            >>> from parallelenv import ParallelEnv
            >>> penv = ParallelEnv.make("CartPole-v1", num_envs=2, para_mode="dummy")
            >>> len(penv)
            2
            >>> penv.close()
        """
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}; use a positive int")
        front = _own_front(para_mode)
        if front is not None:
            if device is not None:
                gym_kwargs["device"] = device
            if output is not None:
                gym_kwargs["output"] = output
            return front.make(
                env_id, num_envs, para_mode, asynchronous=asynchronous, num_cpus=num_cpus, num_gpus=num_gpus,
                no_warning=no_warning, call_timeout=call_timeout, backend_options=backend_options, **gym_kwargs,
            )
        factory = functools.partial(gym.make, env_id, **gym_kwargs)
        return cls(
            [factory] * num_envs,
            para_mode=para_mode,
            asynchronous=asynchronous,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            no_warning=no_warning,
            call_timeout=call_timeout,
            output=output or "numpy",
            device=device,
            **(backend_options or {}),
        )

    def __len__(self) -> int:
        return self.num_envs

    @property
    def backend(self) -> Backend:
        """The :class:`~parallelenv.backends.Backend` running the envs, e.g. for its ``env_pids()``."""
        return self._backend

    @property
    def policy(self) -> Policy:
        """The :class:`~parallelenv.policies.Policy` that ``asynchronous`` named: ask it, not the string."""
        return self._policy

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.num_envs} envs"
        return f"ParallelEnv({state}, para_mode={self.para_mode!r}, asynchronous={self.asynchronous!r})"

    def __enter__(self) -> ParallelEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A safety net only: call close() (or use `with`) to release workers promptly.
        try:
            self._close_at_exit()
        except Exception:
            pass

    # ----------------------------------------------------------------- public calls

    @one_caller_at_a_time
    def reset(
        self, seed: Any = None, options: Any = None, id: Any = None, align: str = "item"
    ) -> Any:
        """Reset the envs of ``id`` (all when None); returns ``(obs, info)``.

        Args:
            seed: None; an int, from which each env derives its own independent
                seed; or a list with one seed (or None) per env of ``id``.
            options: None, one dict for every env, or a list with one per env.
            id: env indices; results come back in this order.
            align: ``"item"`` for batched ``(obs, info)``, ``"batch"`` for a
                list of per-env ``(obs, info)`` tuples.
        """
        ids = self._ids(id)
        arguments.check_align(align)
        call = Reset(tuple(ids.tolist()), arguments.env_seeds(seed, ids), arguments.env_options(options, ids))
        infos, failures = self._calls.run(call, ids)
        reset = _without(ids, failures)
        self._calls.mark_reset(reset)
        obs = take(self._backend.buffers.obs, None if reset is self._calls.all_ids else reset)
        env_ids = reset if failures else None
        if align == "batch":
            results = batch_results(obs, None, reset, infos, None, env_ids=env_ids)
        else:
            results = item_results(obs, None, reset, infos, None, env_ids=env_ids)
        results = results if self._to_torch is None else self._to_torch.results(results, align)
        if failures:
            raise env_error(failures, results)
        return results

    @one_caller_at_a_time
    def step(self, actions: Any, id: Any = None, align: str = "item") -> Any:
        """Step the envs of ``id`` with one action each; returns their results.

        With ``align="item"``: ``(obs, reward, terminated, truncated, info)``
        batched in the order of ``id``; with ``align="batch"``: a list of
        per-env 5-tuples. Envs the policy has finished answer with None results.
        """
        ids = self._ids(id)
        arguments.check_align(align)
        calls = self._calls
        self._send(actions, ids)
        calls.wait(calls.answered(ids), None, drain=True, wanted=len(ids))
        if calls.failures:
            self._raise_env_error(ids, align)
        return self._take_results(ids, align, with_env_id=False)

    @one_caller_at_a_time
    def send(self, actions: Any, id: Any = None) -> None:
        """Hand ``actions`` to the envs of ``id`` and return at once (see :meth:`recv`)."""
        self._send(actions, self._ids(id))

    @one_caller_at_a_time
    def recv(self, wait_num: int | None = None, timeout: float | None = None, align: str = "item") -> Any:
        """Results of the envs that have answered a :meth:`send`, at least ``wait_num`` of them.

        Args:
            wait_num: how many envs to wait for; None waits for every env sent to.
            timeout: seconds to wait at most; then whatever is ready is returned,
                possibly nothing. Results not returned are kept for a later recv.
            align: as for :meth:`step`. ``info["env_id"]`` says which envs answered.
        """
        self._check_usable()
        arguments.check_align(align)
        calls = self._calls
        outstanding = calls.num_pending + calls.num_ready
        wait_num = arguments.wait_count(wait_num, outstanding)
        deadline = None if timeout is None else time.monotonic() + timeout
        calls.wait(lambda: calls.num_ready >= wait_num, deadline, drain=False, wanted=wait_num - calls.num_ready)
        if calls.failures:
            self._raise_env_error(calls.ready_in_send_order(), align)
        return self._take_results(calls.ready_in_send_order(), align, with_env_id=True)

    @one_caller_at_a_time
    def get_env_attr(self, name: str, id: Any = None) -> list[Any]:
        """The attribute ``name`` of each env of ``id`` (None where an env has none)."""
        ids = self._ids(id)
        return self._values(GetAttr(tuple(ids.tolist()), _name(name)), ids)

    @one_caller_at_a_time
    def set_env_attr(self, name: str, value: Any, id: Any = None) -> None:
        """Set the attribute ``name`` to ``value`` on every env of ``id``."""
        ids = self._ids(id)
        self._values(SetAttr(tuple(ids.tolist()), _name(name), value), ids)

    @one_caller_at_a_time
    def customized_method(self, name: str | Callable[..., Any], data: Any = None, id: Any = None) -> list[Any]:
        """Call the env method ``name`` on each env of ``id``; returns their return values.

        Args:
            name: a method name, or a function called as ``name(env, ...)``
                where the env runs (it travels with cloudpickle to process and
                Ray backends), with the arguments a method would get.
            data: None to call without arguments, or a list with one entry per
                env of ``id``, in its order. A dict entry is that env's keyword
                arguments: ``{"x": 1, "y": 2}`` calls ``env.name(x=1, y=2)``.
                Any other entry is passed as the single positional argument
                (to pass a dict positionally, give
                ``parallelenv.calls.Arguments((the_dict,))``). The tensor
                backend calls its batched env once: see
                :meth:`~parallelenv.tensor.front.TensorParallelEnv.customized_method`.
            id: env indices; results come back in this order.

        Example:
            >>> import gymnasium as gym
            >>> from parallelenv import ParallelEnv
            >>> with ParallelEnv([lambda: gym.make("CartPole-v1")] * 4) as penv:
            ...     penv.customized_method("has_wrapper_attr", data=[{"name": "gravity"}, {"name": "mass"}], id=[3, 1])
            [True, False]
        """
        ids = self._ids(id)
        per_env = (NO_ARGUMENT,) * len(ids) if data is None else arguments.per_env(data, ids, "data")
        method = name if callable(name) else _name(name)
        return self._values(CallMethod(tuple(ids.tolist()), method, per_env), ids)

    @one_caller_at_a_time
    def replace_envs(self, envs: Any, id: Any = None) -> None:
        """Close the envs of ``id`` and put new ones in their place, where they run.

        The new envs must have the spaces of the old ones, and need a
        :meth:`reset` before their first step.

        Args:
            envs: one ``gym.Env`` or zero-argument factory per env of ``id``;
                factories are built in the worker (or actor) hosting the env.
            id: the envs to replace.

        Example:
            >>> import gymnasium as gym
            >>> from parallelenv import ParallelEnv
            >>> with ParallelEnv.make("CartPole-v1", num_envs=2, para_mode="dummy") as penv:
            ...     penv.replace_envs([lambda: gym.make("CartPole-v1", max_episode_steps=50)], id=[1])
            ...     obs, info = penv.reset(seed=0, id=[1])
            ...     penv.get_env_attr("spec", id=[1])[0].max_episode_steps
            50
        """
        ids = self._ids(id)
        sources = arguments.per_env(envs, ids, "envs")
        self._values(ReplaceEnv(tuple(ids.tolist()), sources), ids)

    def as_gymnasium(self) -> Any:
        """This ParallelEnv as a ``gymnasium.vector.VectorEnv`` (see :mod:`parallelenv.integrations.gymnasium`)."""
        from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

        return GymnasiumVectorEnv(self)

    def close(self) -> None:
        """Stop every worker and free every resource; safe to call again.

        A call under way in another thread is waited for (up to its
        ``call_timeout``) first.
        """
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.close()

    def _close_at_exit(self) -> None:
        """close() for ``__del__`` and interpreter exit, where a thread still in a call must not stop it."""
        acquired = self._lock.acquire(timeout=EXIT_LOCK_WAIT_S)
        try:
            self._close()
        finally:
            if acquired:
                self._lock.release()

    # ----------------------------------------------------------------- helpers

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("this ParallelEnv is closed")
        broken = self._calls.broken
        if broken is not None:
            raise type(broken)(broken.env_indices, broken.reason) from broken

    def _ids(self, id: Any) -> np.ndarray:
        self._check_usable()
        return self._calls.all_ids if id is None else arguments.env_ids(id, self.num_envs)

    def _send(self, actions: Any, ids: np.ndarray) -> None:
        calls = self._calls
        calls.require_idle(ids, "send to")
        if self._to_torch is not None:
            actions = self._to_torch.actions(actions)
        batch = check_batch(self.single_action_space, actions, len(ids))
        calls.number_sends(ids)
        if self._policy.tracks_finished:
            live = self._policy.live(calls.finished, ids)
            if not live.all():
                calls.set_none_results(ids[~live])
                ids, batch = ids[live], take(batch, live)
                if not ids.size:
                    return
        put(self._backend.buffers.actions, calls.rows(ids), batch)
        calls.dispatch(Step(tuple(ids.tolist())), ids)

    def _values(self, call: Call, ids: np.ndarray) -> list[Any]:
        """Each env's answer to ``call``, in the order of ``ids``; an EnvError if any raised."""
        values, failures = self._calls.run(call, ids)
        if failures:
            raise env_error(failures, values)
        return [values[i] for i in ids.tolist()]

    def _raise_env_error(self, ready: np.ndarray, align: str) -> None:
        """Raise the failures of a step or recv, handing over the results of the ``ready`` envs that did not raise."""
        failures = self._calls.take_failures()
        failed = np.isin(ready, [failure.env_index for failure in failures])
        self._calls.receive(ready[failed])
        answered = ready[~failed]
        results = self._take_results(answered, align, with_env_id=True) if answered.size else None
        raise env_error(failures, results)

    def _take_results(self, ids: np.ndarray, align: str, with_env_id: bool) -> Any:
        """Copy the results of READY ``ids`` out of the buffers; they become IDLE."""
        buffers = self._backend.buffers
        rows = self._calls.rows(ids)
        obs = take(buffers.obs, None if ids is self._calls.all_ids else ids)
        step_arrays = (buffers.reward[rows].copy(), buffers.terminated[rows].copy(), buffers.truncated[rows].copy())
        infos, none_result = self._calls.receive(ids)
        env_ids = ids if with_env_id else None
        if align == "batch":
            results = batch_results(obs, step_arrays, ids, infos, none_result, env_ids=env_ids)
        else:
            results = item_results(obs, step_arrays, ids, infos, none_result, env_ids=env_ids)
        return results if self._to_torch is None else self._to_torch.results(results, align)


# ParallelEnvs not closed when the interpreter exits: close them while their
# backends can still shut down cleanly (workers joined, shared memory unlinked).
_OPEN: weakref.WeakSet[ParallelEnv] = weakref.WeakSet()


@atexit.register
def _close_open_envs() -> None:
    for penv in list(_OPEN):
        try:
            penv._close_at_exit()
        except Exception:
            pass


def _without(ids: np.ndarray, failures: list[Failure]) -> np.ndarray:
    """``ids`` less the envs that failed; ``ids`` itself when none did."""
    if not failures:
        return ids
    return ids[~np.isin(ids, [failure.env_index for failure in failures])]


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"an attribute or method name must be a non-empty str, not {name!r}")
    return name


def _own_front(para_mode: Any) -> type[ParallelEnv] | None:
    """The ParallelEnv subclass a backend brings as its own front, if it does."""
    factory = resolve_backend(para_mode)
    return factory if isinstance(factory, type) and issubclass(factory, ParallelEnv) else None


def _torch_output(output: Any, device: Any) -> Any:
    if output not in ("numpy", "torch"):
        raise ValueError(f"output={output!r}; use 'numpy' or 'torch'")
    if output == "numpy":
        raise ValueError("device= is for output='torch'")
    # Imports torch, or says how to install it.
    from parallelenv.torch_output import TorchOutput

    return TorchOutput(device)
