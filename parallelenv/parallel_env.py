"""ParallelEnv: validate the user's call, route it to a backend, assemble the results.

No IPC happens here: the backend runs the calls, and
:class:`~parallelenv.tracking.inflight.InFlight` keeps where each env's call stands.
``step`` is ``send`` followed by ``recv`` of the same envs.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector.utils import batch_space

from parallelenv import arguments, make_options
from parallelenv.array_kinds import Selection
from parallelenv.arrays import is_tensor
from parallelenv.backends import BackendConfig, env_maker, resolve_backend
from parallelenv.backends.base import Backend
from parallelenv.calls import Call, Reset, env_error
from parallelenv.env_calls import EnvCalls
from parallelenv.errors import ClosedError
from parallelenv.healing import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_WINDOW_S,
    Healing,
    SurvivedFailure,
    refuse_without_workers,
)
from parallelenv.infos.step_infos import StepInfo
from parallelenv.output import check_output, converter
from parallelenv.policies import Policy, resolve_policy
from parallelenv.recycling import Recycling
from parallelenv.serialised import (
    close_at_exit,
    close_ending_the_call_under_way,
    close_unless_held,
    one_caller_at_a_time,
)
from parallelenv.state.front import EnvStates
from parallelenv.state.journal import journal_for
from parallelenv.timing.front import ShowsStats
from parallelenv.tracking.inflight import InFlight
from parallelenv.tracking.results import Outcome, shaped

DEFAULT_CALL_TIMEOUT_S = 600.0


class ParallelEnv(EnvCalls, EnvStates, ShowsStats):
    """A list of Gymnasium envs stepped in parallel behind one object.

    Args:
        envs: ``gym.Env`` instances or zero-argument callables returning one.
            Factories are preferred for processes and Ray: nothing unpicklable
            crosses a process boundary.
        para_mode: where the envs run: ``"dummy"`` (the default: in the
            caller, one after another), ``"subproc"``, ``"ray"``,
            ``"ray-subproc"``, ``"tensor"`` (``envs`` is then one
            :class:`~parallelenv.tensor.TensorEnv`), or a name given to
            :func:`~parallelenv.register_backend`. :doc:`/guide/backends` says which to pick.
        asynchronous: what happens to envs that finish at different times:
            ``None`` (the default: when one env finishes, all are finished
            until ``reset``), ``"idle"``, ``"restart"`` or ``"continue"``
            (:doc:`/guide/policies`). Training loops usually want ``"restart"``.
        num_cpus: cores for this ParallelEnv; default: all of this machine's
            (for the Ray backends: all of the cluster's).
        num_gpus: GPUs for the Ray backends, spread over their actors (fractions allowed).
        no_warning: silence every warning where envs are built and run, Gymnasium's too (a bad ``render_mode``).
        call_timeout: seconds an env call may take before its worker is
            declared hung, killed, and :class:`~parallelenv.WorkerTimeoutError`
            raised; None waits forever.
        output: ``"numpy"`` or ``"torch"``: results as torch tensors on
            ``device``; actions may then be torch tensors too. Default: what
            the backend gives (NumPy; torch tensors for ``"tensor"``).
        device: where ``output="torch"`` puts results (default ``"cpu"``);
            the tensor backend's results are on its env's device.
        copy: whether results are the caller's own arrays (True, the
            default; for ``"tensor"`` the default is False) or, for a call on
            every env, the backend's result buffers themselves, which the
            next call overwrites (False: no copy per step), as Gymnasium's
            ``copy`` argument means.
        on_worker_failure: ``"raise"`` (the default) or ``"restart"``: a
            worker that dies or hangs past ``call_timeout`` is replaced, its
            envs rebuilt and reset, and the step goes on (``subproc``,
            ``ray``, ``ray-subproc``). :doc:`/guide/failures` says what the
            caller sees.
        on_env_error: ``"raise"`` (the default) or ``"restart"``: an env whose
            step raises is rebuilt from its factory and reset instead.
        max_restarts, restart_window: the budget of restarts: at most
            ``max_restarts`` within any ``restart_window`` seconds; the next
            failure raises.
        recycle: a :class:`~parallelenv.Recycling`: replace workers on purpose after a number of
            steps, an age, or a resident-memory limit (leaky simulators), envs cut as when rebuilt.
        snapshots: with a restart above, take every env's state every this many steps (True: 100) and
            keep the steps since: a rebuilt env goes on from there instead of a new episode (:ref:`env-state-healing`).
        stats: True: measure where the time goes, read by :meth:`stats` (off: nothing is measured);
            ``"live"``: and a line on a terminal every few seconds (:doc:`/guide/timings`).
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

    def __init__(
        self,
        envs: Sequence[Any],
        para_mode: str = "dummy",
        asynchronous: str | None = None,
        num_cpus: int | None = None,
        num_gpus: float = 0,
        no_warning: bool = True,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
        output: str | None = None,
        device: Any = None,
        copy: bool | None = None,
        on_worker_failure: str = "raise",
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window: float = DEFAULT_RESTART_WINDOW_S,
        recycle: Recycling | None = None,
        snapshots: int | bool = False,
        stats: bool | str = False,
        **backend_options: Any,
    ) -> None:
        self._lock = threading.RLock()
        self._closed = True  # until the backend exists, close() has nothing to do
        check_output(output, device)
        if copy not in (None, True, False):
            raise TypeError(f"copy={copy!r}; use True or False")
        self._policy = resolve_policy(asynchronous)
        factory = resolve_backend(para_mode)
        arguments.check_limits(num_cpus, call_timeout)
        self._healing = Healing(on_worker_failure, on_env_error, max_restarts, restart_window)
        config = BackendConfig(
            policy=self._policy, num_cpus=num_cpus, num_gpus=num_gpus, no_warning=no_warning, call_timeout=call_timeout,
            restarts_workers=self._healing.restarts_workers or recycle is not None,  # a worker may be replaced
            rebuilds_envs=self._healing.rebuilds_envs, copy=copy, times_envs=bool(stats),
        )
        self.para_mode = para_mode
        self.asynchronous = asynchronous
        self.call_timeout = call_timeout
        self._backend: Backend = factory(envs, config, **backend_options)
        self._closed = False
        close_at_exit(self)
        if copy is not None:
            self._backend.buffers.lent = not copy
        self._given_envs = envs  # what save() writes as the envs' factories
        sources = list(envs) if self._healing.rebuilds_envs else None
        try:
            refuse_without_workers(self._backend, para_mode, self._healing.restarts_workers, recycle)
            journal = journal_for(snapshots, self._backend.num_envs, config.restarts_workers)
            self._calls = InFlight(self._backend, self._policy, call_timeout, self._healing, sources, recycle, journal)
            self._to_torch = converter(output, device, self._calls.arrays.native_output, self._backend, para_mode)
            self._start_stats(stats)
        except ValueError:
            self.close()
            raise
        n = self.num_envs = self._backend.num_envs
        self.single_observation_space = self._backend.single_observation_space
        self.single_action_space = self._backend.single_action_space
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)

    @classmethod
    def make(
        cls,
        env_id: str,
        num_envs: int,
        para_mode: str = "dummy",
        *,
        backend_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ParallelEnv:
        """``num_envs`` copies of a registered Gymnasium env, built where they run.

        Keyword arguments of :class:`ParallelEnv` (``asynchronous``, ``copy``, ...) go to it; those the
        backend takes (``num_workers``, ...), and ``backend_options``, to the backend; the rest to
        ``gymnasium.make`` (or the tensor env standing for ``env_id``); one neither takes is refused
        (:mod:`parallelenv.make_options`). ``device`` is where results live with
        ``output="torch"`` on the CPU backends, and for ``para_mode="tensor"``
        the device of the tensor env itself (default ``cuda`` when there is one).

        Example:
            >>> from parallelenv import ParallelEnv
            >>> penv = ParallelEnv.make("CartPole-v1", num_envs=2, para_mode="dummy")
            >>> len(penv)
            2
            >>> penv.close()
        """
        options = {name: kwargs.pop(name) for name in _OPTIONS if name in kwargs}
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}; use a positive int")
        make_envs = env_maker(para_mode)
        backend_options, gym_kwargs = make_options.split(env_id, para_mode, make_envs, kwargs, backend_options)
        if make_envs is None:
            envs: Any = [functools.partial(gym.make, env_id, **gym_kwargs)] * num_envs
        else:  # the backend's own kind of env, built here: it runs where it is
            if options.get("device") is not None:
                gym_kwargs["device"] = options.pop("device")
            envs = make_envs(env_id, num_envs, **gym_kwargs)
        return cls(envs, para_mode=para_mode, **options, **backend_options)

    def __len__(self) -> int:
        return self.num_envs

    @property
    def backend(self) -> Backend:
        """The :class:`~parallelenv.backends.Backend` running the envs, e.g. for its ``env_pids()``."""
        return self._backend

    @property
    def reuses_result_buffers(self) -> bool:
        """Whether a call's results on every env are buffers that the next call overwrites
        (the tensor backend's by default), rather than the caller's own."""
        return self._backend.buffers.lent

    @property
    def last_step_info(self) -> StepInfo | None:
        """The infos of the last ``step`` or ``recv`` handed over, each env's values as it gave them
        (:meth:`~parallelenv.infos.step_infos.StepInfo.env_info`), before a vector info cast any;
        None before the first. What the Gymnasium view's ``final_info`` is built from."""
        return self._calls.last_step_info

    @property
    def failures(self) -> list[SurvivedFailure]:
        """Every failure survived under ``on_worker_failure``/``on_env_error="restart"``, oldest first."""
        return list(self._healing.failures)

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
        selection = self._selection(id)
        arguments.check_align(align)
        ids = selection.ids
        call = Reset(selection.env_ids, arguments.env_seeds(seed, ids), arguments.env_options(options, ids))
        return self._results(self._calls.reset(call, selection), align, with_env_id=False)

    @one_caller_at_a_time
    def step(self, actions: Any, id: Any = None, align: str = "item") -> Any:
        """Step the envs of ``id`` with one action each; returns their results.

        With ``align="item"``: ``(obs, reward, terminated, truncated, info)``
        batched in the order of ``id``; with ``align="batch"``: a list of
        per-env 5-tuples. Envs the policy has finished answer with None results.
        """
        selection = self._selection(id)
        if align != "item":
            arguments.check_align(align)
        if self._to_torch is not None:
            actions = self._to_torch.actions(actions)
        return self._results(self._calls.step(selection, actions), align, with_env_id=False)

    @one_caller_at_a_time
    def send(self, actions: Any, id: Any = None) -> None:
        """Hand ``actions`` to the envs of ``id`` and return at once (see :meth:`recv`)."""
        selection = self._selection(id)
        if self._to_torch is not None:
            actions = self._to_torch.actions(actions)
        self._calls.send(selection, actions)

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
        wait_num = arguments.wait_count(wait_num, self._calls.outstanding)
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._results(self._calls.recv(wait_num, deadline), align, with_env_id=True)

    def as_gymnasium(self) -> Any:
        """This ParallelEnv as a ``gymnasium.vector.VectorEnv`` (see :mod:`parallelenv.integrations.gymnasium`)."""
        from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

        return GymnasiumVectorEnv(self)

    def close(self) -> None:
        """Stop every worker and free every resource; safe to call again.

        A call under way in another thread (a watchdog closing a hung
        ParallelEnv) is ended: the workers are stopped under it, it raises
        :class:`~parallelenv.ClosedError` in its thread, and close() returns
        once it has, or after 10 s (a call running an
        env in this process, on ``dummy`` or ``tensor``, cannot be stopped
        from outside: the ParallelEnv closes when it returns).
        """
        close_ending_the_call_under_way(self)

    def _close(self) -> None:
        """Close, the lock held (or given up on at exit)."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.end()
        self._backend.close()

    def _close_at_exit(self) -> None:
        """close() for ``__del__`` and interpreter exit, where a thread still in a call must not stop it."""
        close_unless_held(self)

    # ----------------------------------------------------------------- helpers

    def _check_usable(self) -> None:
        if self._closed or self._calls.interrupted:
            raise ClosedError("this ParallelEnv is closed")
        broken = self._calls.broken
        if broken is not None:
            raise type(broken)(broken.env_indices, broken.reason) from broken

    def _selection(self, id: Any) -> Selection:
        self._check_usable()
        if id is None:
            return self._calls.everyone
        if is_tensor(id):
            id = id.cpu().numpy()  # ids that came back from a device: one read, outside any step
        return self._calls.select(arguments.env_ids(id, self.num_envs))

    def _values(self, call: Call, selection: Selection) -> list[Any]:
        """Each env's answer to ``call``, in the order of ``selection``; an EnvError if any raised."""
        outcome = self._calls.run(call, selection)
        if outcome.failures:
            raise env_error(outcome.failures, outcome.values)
        return [outcome.values[i] for i in selection.env_ids]

    def _results(self, outcome: Outcome, align: str, with_env_id: bool) -> Any:
        """The outcome of a step, recv or reset as ``align`` shapes it; an EnvError carrying them if any env raised."""
        results = shaped(outcome, align, with_env_id, self._calls.arrays)
        if results is not None and self._to_torch is not None:
            results = self._to_torch.results(results, align)
        if outcome.failures:
            raise env_error(outcome.failures, results)
        return results


_OPTIONS, _MAKE_SIGNATURE = make_options.forwarded_signature(ParallelEnv)
ParallelEnv.make.__func__.__signature__ = _MAKE_SIGNATURE  # type: ignore[attr-defined]
