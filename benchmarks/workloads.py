"""The workloads of BENCHMARKS.md: their envs, sizes and pre-sampled actions.

The env classes live at module level so that subprocess and Ray workers can
unpickle ``functools.partial(benchmarks.workloads.BusyEnv)`` by import path.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from benchmarks import real_envs

ACTION_SEED = 12345


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU time."""
    # thread_time, not wall time: an env sharing its core with others still
    # does the full amount of work, so over-subscription cannot look free.
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


class _FixedLengthEnv(gym.Env):
    """Shared episode bookkeeping: truncate after ``episode_steps`` steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, episode_steps: int) -> None:
        self._episode_steps = episode_steps
        self._elapsed = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._elapsed = 0
        return self._observe(), {}

    def step(self, action: Any):
        self._work()
        self._elapsed += 1
        truncated = self._elapsed >= self._episode_steps
        return self._observe(), 1.0, False, truncated, {}

    def _observe(self) -> np.ndarray:
        raise NotImplementedError

    def _work(self) -> None:
        """The cost of one step; nothing by default."""


class _Box64Env(_FixedLengthEnv):
    """Box(64,) observations of zeros and Discrete(4) actions: a step costs only its ``_work``."""

    def __init__(self, episode_steps: int) -> None:
        super().__init__(episode_steps)
        self.observation_space = spaces.Box(-1.0, 1.0, (64,), np.float32)
        self.action_space = spaces.Discrete(4)
        self._obs = np.zeros(64, np.float32)

    def _observe(self) -> np.ndarray:
        return self._obs


class BusyEnv(_Box64Env):
    """CPU-bound: each step burns ``cpu_seconds`` of CPU."""

    def __init__(self, cpu_seconds: float = 0.0005, episode_steps: int = 200) -> None:
        super().__init__(episode_steps)
        self._cpu_seconds = cpu_seconds

    def _work(self) -> None:
        burn_cpu(self._cpu_seconds)


class BigObsEnv(_FixedLengthEnv):
    """An Atari-sized frame stack with a step that costs nothing."""

    def __init__(self, episode_steps: int = 1000) -> None:
        super().__init__(episode_steps)
        shape = (84, 84, 4)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(4)
        # One preallocated frame returned every step, so only the wrapper's
        # cost of moving 28 KB is measured. Noise rather than zeros so that
        # nothing downstream can take a shortcut on uniform data. Every
        # wrapper here copies the obs it receives, so sharing it is safe.
        self._frame = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)

    def _observe(self) -> np.ndarray:
        return self._frame


class JitterEnv(_FixedLengthEnv):
    """Straggler maker: each step sleeps 0.1-2 ms drawn from the env's RNG."""

    def __init__(self, low: float = 0.0001, high: float = 0.002, episode_steps: int = 200) -> None:
        super().__init__(episode_steps)
        self._low, self._high = low, high
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(4)
        self._obs = np.zeros(4, np.float32)

    def _observe(self) -> np.ndarray:
        return self._obs

    def _work(self) -> None:
        # self.np_random is seeded by reset(seed=...), so every wrapper sees
        # the same sequence of delays for the same env.
        time.sleep(self.np_random.uniform(self._low, self._high))


class WaitEnv(_Box64Env):
    """Waits ``wait_s`` each step without using a core, as an env waiting on I/O,
    a renderer or a simulator in another process does."""

    def __init__(self, wait_s: float = 0.001, episode_steps: int = 200) -> None:
        super().__init__(episode_steps)
        self._wait_s = wait_s

    def _work(self) -> None:
        # To a deadline: a sleep that wakes early sleeps the rest, so every
        # step waits its full time however the scheduler wakes it.
        deadline = time.perf_counter() + self._wait_s
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)


class InfoEnv(_FixedLengthEnv):
    """A cheap step that returns four float infos, as MuJoCo envs do; ``infos=False`` is its no-info twin."""

    def __init__(self, infos: bool = True, episode_steps: int = 200) -> None:
        super().__init__(episode_steps)
        self._infos = infos
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._obs = np.zeros(4, np.float32)

    def _observe(self) -> np.ndarray:
        return self._obs

    def step(self, action: Any):
        obs, reward, terminated, truncated, _ = super().step(action)
        if not self._infos:
            return obs, reward, terminated, truncated, {}
        # A new dict of NumPy floats each step, named and typed as HalfCheetah's.
        position = np.float64(self._elapsed * 0.01)
        return obs, reward, terminated, truncated, {
            "x_position": position, "x_velocity": np.float64(1.0), "reward_forward": np.float64(1.0),
            "reward_ctrl": np.float32(-0.1 * int(action))}


@dataclass(frozen=True)
class Workload:
    """One row group of the table: an env, how many copies, how long to run."""

    name: str
    num_envs: int
    make_env: Callable[[], gym.Env]
    num_actions: int  # Discrete(num_actions) actions, unless action_dims says Box
    steps: int  # batch steps per timed repeat (each moves every env once)
    quick_steps: int
    measure_memory: bool = False
    description: str = ""
    # The wrappers it runs by default (None: every one not limited to other
    # workloads), and the name that selects it with others of its kind.
    wrappers: tuple[str, ...] | None = None
    group: str = ""
    # Box(-1, 1, (action_dims,)) float32 actions where > 0 (MuJoCo's), else Discrete.
    action_dims: int = 0
    # Modules its envs import beyond Gymnasium's: without them it is skipped, with a line saying so.
    requires: tuple[str, ...] = ()
    # The workload this one is measured beside, round by round, and reported over (infos8 / noinfos8).
    twin: str | None = None
    quick: bool = True  # part of a --quick run
    # k: the wrappers that take it (WrapperSpec.per_worker) run N / k workers of k envs; 0: their own layout.
    envs_per_worker: int = 0
    # What each step of its envs waits (WaitEnv): efficiency is reported over the step's measured length.
    wait_s: float = 0.0

    def factories(self) -> list[Callable[[], gym.Env]]:
        """Zero-arg env factories, one per env, picklable by import path."""
        return [self.make_env] * self.num_envs

    def actions(self, steps: int) -> np.ndarray:
        """The (steps, num_envs) actions every wrapper replays, same seed for all."""
        rng = np.random.default_rng(ACTION_SEED)
        if self.action_dims:
            shape = (steps, self.num_envs, self.action_dims)
            return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        return rng.integers(0, self.num_actions, size=(steps, self.num_envs), dtype=np.int64)


_cartpole = functools.partial(gym.make, "CartPole-v1")
TENSOR_WRAPPERS = ("parallelenv-tensor", "tensorenv-direct", "gymnasium-numpy-vector")
COLLECT_WRAPPERS = ("parallelenv-collect-plain", "parallelenv-collect-overlapped")
# What infos cost the parent is the question there: ours and Gymnasium's, the in-process ones as the reference.
INFO_WRAPPERS = ("parallelenv-dummy", "parallelenv-subproc", "gymnasium-sync", "gymnasium-async")


def _info_workloads(num_envs: int, steps: int, quick_steps: int) -> tuple[Workload, Workload]:
    """``infosN`` and its no-info twin ``noinfosN``, measured round by round together."""
    quick = num_envs == 8  # a smoke run needs one size of them
    return (
        Workload(f"infos{num_envs}", num_envs, functools.partial(InfoEnv, infos=True), 2, steps=steps,
                 quick_steps=quick_steps, description="cheap step, four float infos: what infos cost the parent",
                 wrappers=INFO_WRAPPERS, group="infos", twin=f"noinfos{num_envs}", quick=quick),
        Workload(f"noinfos{num_envs}", num_envs, functools.partial(InfoEnv, infos=False), 2, steps=steps,
                 quick_steps=quick_steps, description=f"infos{num_envs}'s twin returning no infos",
                 wrappers=INFO_WRAPPERS, group="infos", quick=quick),
    )


# The caller's cost as workers grow: ours on each path, and the one-process-per-env peers where k is 1.
SLEEP_WRAPPERS = ("parallelenv-subproc-counted", "parallelenv-subproc-perpipe", "parallelenv-subproc-healing",
                  "lockstep")
SLEEP_PEERS = ("gymnasium-async", "sb3-subproc")


def _sleep_workloads() -> list[Workload]:
    """``sleepT-WxK``: W workers of K envs whose step sleeps T ms, so that many workers wait side by side
    on 2 cores as on a core each, and what is left to measure is the caller's own work per batch step."""
    workloads = []
    for wait_ms, steps_of_1, steps_of_4 in ((5, 400, 150), (20, 150, 50)):
        for workers, k in ((8, 1), (64, 1), (64, 4)):
            wrappers = SLEEP_WRAPPERS + (SLEEP_PEERS if (workers, k) == (64, 1) else ())
            workloads.append(Workload(
                f"sleep{wait_ms}-{workers}x{k}", workers * k, functools.partial(WaitEnv, wait_s=wait_ms / 1000),
                4, steps=steps_of_1 if k == 1 else steps_of_4, quick_steps=40,
                description=f"{workers} workers x {k} envs, each step sleeping {wait_ms} ms: the caller's cost "
                            "per batch step",
                wrappers=wrappers, group="sleep", envs_per_worker=k, wait_s=wait_ms / 1000,
                # One smoke run of the three paths: 64 processes a wrapper take seconds to start on 2 cores.
                quick=(wait_ms, workers) == (5, 8)))
    return workloads


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("cartpole8", 8, _cartpole, 2, steps=1000, quick_steps=300,
                 description="CartPole-v1: per-step wrapper overhead"),
        # Not in --quick (nor jitter16, nor the tensor ones): 64 or 16 processes a wrapper, or torch's import,
        # each costs seconds a run, and bench-quick must stay under two minutes on a busy machine.
        Workload("cartpole64", 64, _cartpole, 2, steps=300, quick_steps=60, quick=False,
                 measure_memory=True, description="CartPole-v1 x64: overhead and memory"),
        Workload("busy8", 8, functools.partial(BusyEnv), 4, steps=500, quick_steps=100,
                 description="0.5 ms CPU per step: parallel speed-up"),
        Workload("bigobs8", 8, functools.partial(BigObsEnv), 4, steps=1500, quick_steps=200,
                 description="84x84x4 uint8 obs: moving large observations"),
        Workload("jitter16", 16, functools.partial(JitterEnv), 4, steps=200, quick_steps=40, quick=False,
                 description="0.1-2 ms random sleep: stragglers, async k-of-n"),
        # A policy chooses the actions here (the pre-sampled ones only say how many steps).
        Workload("collect16", 16, functools.partial(WaitEnv), 4, steps=300, quick_steps=50,
                 description="1 ms wait per step, torch MLP policy: VecWorker.collect, overlapped or not",
                 wrappers=COLLECT_WRAPPERS),
        # Batched envs: the factories only say how many; each wrapper builds its own vectorised CartPole.
        *(Workload(f"tensor-cartpole-{n}", n, _cartpole, 2, steps=steps, quick_steps=20,
                   description=f"CartPole-v1 x{n} as batched arrays/tensors on the CPU",
                   wrappers=TENSOR_WRAPPERS, group="tensor-cartpole", quick=False)
          for n, steps in ((4096, 500), (65536, 100))),
        # Before the real ones, whose start-up takes seconds: a --quick run that its budget cuts short
        # loses the slowest rows.
        *_info_workloads(8, steps=1000, quick_steps=200),
        Workload("cheetah8", 8, real_envs.make_half_cheetah, 0, steps=1000, quick_steps=100, action_dims=6,
                 requires=("mujoco",), description="MuJoCo HalfCheetah-v5: a real simulator with per-step infos"),
        Workload("pong8", 8, real_envs.make_pong, 6, steps=300, quick_steps=40, requires=("ale_py", "cv2"),
                 description="Atari Pong, AtariPreprocessing and 4 frames stacked: big obs and infos"),
        *_sleep_workloads(),
        *_info_workloads(64, steps=300, quick_steps=40),
        *_info_workloads(256, steps=100, quick_steps=15),
    )
}

GROUPS: dict[str, list[str]] = {}
for _workload in WORKLOADS.values():
    if _workload.group:
        GROUPS.setdefault(_workload.group, []).append(_workload.name)
