"""A pytest plugin that swaps the peers' vector-env classes for our views.

Loaded as ``pytest -p compat.shim --peer gymnasium --para-mode subproc``: before
the peer's test modules are collected (and so before they import the names),
``gymnasium.vector.SyncVectorEnv`` and ``AsyncVectorEnv`` (``--peer gymnasium``),
or SB3's ``DummyVecEnv`` and ``SubprocVecEnv`` (``--peer sb3``), become classes
that take the peer's constructor arguments and build our view over a
``ParallelEnv(env_fns, para_mode=...)``. The test bodies run untouched.

What each peer argument becomes is written once, here:

- ``autoreset_mode``: ``SAME_STEP`` is the ``"restart"`` policy; ``NEXT_STEP``
  and ``DISABLED`` are ``"continue"``, the view resetting finished envs
  itself (NEXT_STEP) or leaving that to ``reset(options={"reset_mask": ...})``.
- SB3 resets a finished env in the step that finishes it: ``"restart"``.
- ``context`` / ``start_method``: the subproc backend's ``start_method``
  (the dummy backend starts no process, so it has none).
- ``shared_memory``, ``copy``, ``daemon``: no counterpart; the subproc backend
  always passes observations through shared memory, results are always the
  caller's own copies, and workers always end with their parent.
- ``observation_mode`` other than ``"same"`` and ``worker``: refused, since a
  ParallelEnv's envs share one observation space and run our own worker loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from gymnasium.vector import AutoresetMode

from parallelenv import ParallelEnv

POLICY_OF_AUTORESET_MODE = {
    AutoresetMode.SAME_STEP: "restart",
    AutoresetMode.NEXT_STEP: "continue",
    AutoresetMode.DISABLED: "continue",
}
PEERS = ("gymnasium", "sb3")
PARA_MODES = ("dummy", "subproc")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parallelenv compat")
    group.addoption("--peer", choices=PEERS, required=True, help="whose vector-env classes to swap")
    group.addoption("--para-mode", choices=PARA_MODES, required=True, help="the backend under the views")


def pytest_configure(config: pytest.Config) -> None:
    para_mode = config.getoption("para_mode")
    if config.getoption("peer") == "gymnasium":
        _swap_gymnasium(para_mode)
    else:
        _swap_sb3(para_mode)


def pytest_report_header(config: pytest.Config) -> str:
    return f"parallelenv compat: {config.getoption('peer')} classes swapped for views on {config.getoption('para_mode')!r}"


def _start_options(para_mode: str, start_method: str | None) -> dict[str, Any]:
    return {"start_method": start_method} if start_method is not None and para_mode == "subproc" else {}


def _swap_gymnasium(para_mode: str) -> None:
    import gymnasium.vector

    from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

    class SyncVectorEnv(GymnasiumVectorEnv):
        """``gymnasium.vector.SyncVectorEnv(...)`` built as our view."""

        def __init__(
            self,
            env_fns: Sequence[Callable[[], Any]],
            copy: bool = True,
            observation_mode: Any = "same",
            autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        ) -> None:
            _build_gymnasium_view(self, env_fns, observation_mode, autoreset_mode, None)

    class AsyncVectorEnv(GymnasiumVectorEnv):
        """``gymnasium.vector.AsyncVectorEnv(...)`` built as our view."""

        def __init__(
            self,
            env_fns: Sequence[Callable[[], Any]],
            shared_memory: bool = True,
            copy: bool = True,
            context: str | None = None,
            daemon: bool = True,
            worker: Any = None,
            observation_mode: Any = "same",
            autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        ) -> None:
            if worker is not None:
                raise TypeError("worker=: a ParallelEnv runs its own worker loop")
            _build_gymnasium_view(self, env_fns, observation_mode, autoreset_mode, context)

    def _build_gymnasium_view(
        view: GymnasiumVectorEnv, env_fns: Any, observation_mode: Any, autoreset_mode: Any, context: str | None
    ) -> None:
        if not (isinstance(observation_mode, str) and observation_mode == "same"):
            raise ValueError(f"observation_mode={observation_mode!r}: a ParallelEnv's envs share one observation space")
        mode = AutoresetMode(autoreset_mode)
        penv = ParallelEnv(
            list(env_fns),
            para_mode=para_mode,
            asynchronous=POLICY_OF_AUTORESET_MODE[mode],
            **_start_options(para_mode, context),
        )
        try:
            GymnasiumVectorEnv.__init__(view, penv, autoreset_mode=mode)
        except BaseException:
            penv.close()
            raise

    gymnasium.vector.SyncVectorEnv = SyncVectorEnv
    gymnasium.vector.AsyncVectorEnv = AsyncVectorEnv


def _swap_sb3(para_mode: str) -> None:
    from stable_baselines3.common import env_util, vec_env

    from parallelenv.integrations.sb3 import SB3VecEnv

    class DummyVecEnv(SB3VecEnv):
        """SB3's ``DummyVecEnv(env_fns)`` built as our view."""

        def __init__(self, env_fns: list[Callable[[], Any]]) -> None:
            super().__init__(ParallelEnv(list(env_fns), para_mode=para_mode, asynchronous="restart"))

    class SubprocVecEnv(SB3VecEnv):
        """SB3's ``SubprocVecEnv(env_fns, start_method)`` built as our view."""

        def __init__(self, env_fns: list[Callable[[], Any]], start_method: str | None = None) -> None:
            options = _start_options(para_mode, start_method)
            super().__init__(ParallelEnv(list(env_fns), para_mode=para_mode, asynchronous="restart", **options))

    for module in (vec_env, env_util):
        module.DummyVecEnv = DummyVecEnv
        module.SubprocVecEnv = SubprocVecEnv
