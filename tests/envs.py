"""Small envs with known behaviour for the test suite.

They live in an importable module so that worker processes can unpickle
factories that refer to them by reference.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CountingEnv(gym.Env):
    """Obs is [env_tag, step count, last action, seed draw]; episodes last ``episode_length`` steps.

    ``terminate=True`` ends episodes by termination, else by truncation. The
    obs carries a draw from the env's seeded RNG so that seeding is visible.
    """

    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float64)
    action_space = spaces.Discrete(5)

    def __init__(self, tag: int = 0, episode_length: int = 3, terminate: bool = True) -> None:
        self.tag = tag
        self.episode_length = episode_length
        self.terminate = terminate
        self.count = 0
        self.draw = 0.0
        self.step_calls = 0
        self.gravity = 9.8

    def _obs(self, action: float) -> np.ndarray:
        return np.array([self.tag, self.count, action, self.draw])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.count = 0 if not options else options.get("start", 0)
        self.draw = float(self.np_random.random())
        return self._obs(-1), {"seed_draw": self.draw}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), action
        self.step_calls += 1
        self.count += 1
        done = self.count >= self.episode_length
        info = {"count": self.count} if self.count % 2 == 0 else {}
        return self._obs(float(action)), float(self.tag * 10 + self.count), done and self.terminate, done and not self.terminate, info

    def double(self, x: float) -> float:
        return 2 * x

    def describe(self) -> str:
        return f"env {self.tag}"

    def echo(self, x: Any, y: Any = None) -> tuple[int, Any, Any]:
        """Which env got which arguments: ``(tag, x, y)``."""
        return (self.tag, x, y)


class WideCountingEnv(CountingEnv):
    """A CountingEnv whose obs row is 64 KiB: its first four values as CountingEnv's, the rest the tag.

    Large enough that in-process buffers hand a step's observations over rather
    than copy them (parallelenv.backends.buffers.RENEW_OBS_MIN_BYTES), small
    enough for the rows of ended episodes (ENDED_ROW_MAX_BYTES).
    """

    observation_space = spaces.Box(-np.inf, np.inf, (8192,), np.float64)

    def __init__(self, tag: int = 0, episode_length: int = 3, terminate: bool = True, delay: float = 0.0) -> None:
        super().__init__(tag, episode_length, terminate)
        self.delay = delay

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.delay:
            time.sleep(self.delay)  # the env's own cost, not a wait on the test's side
        return super().step(action)

    def _obs(self, action: float) -> np.ndarray:
        obs = np.full(8192, float(self.tag))
        obs[:4] = super()._obs(action)
        return obs


class DictObsEnv(gym.Env):
    """Dict and Tuple observations, a Box action, seeded random dynamics."""

    observation_space = spaces.Dict(
        {
            "position": spaces.Box(-10, 10, (2,), np.float32),
            "grid": spaces.MultiBinary((2, 3)),
            "pair": spaces.Tuple((spaces.Discrete(4), spaces.Box(0, 1, (1,), np.float32))),
        }
    )
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, episode_length: int = 7) -> None:
        self.episode_length = episode_length
        self.t = 0
        self.position = np.zeros(2, np.float32)

    def _obs(self) -> dict[str, Any]:
        return {
            "position": self.position.copy(),
            "grid": self.np_random.integers(0, 2, (2, 3)).astype(np.int8),
            "pair": (int(self.np_random.integers(4)), self.np_random.random(1).astype(np.float32)),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        self.position = np.clip(self.position + action, -10, 10).astype(np.float32)
        reward = float(-np.abs(self.position).sum() + self.np_random.normal())
        return self._obs(), reward, bool(self.t >= self.episode_length), False, {"t": self.t}


class FaultyEnv(CountingEnv):
    """Misbehaves at step ``at_step``: ``how`` is "raise", "hang", "exit" or "segfault"-like kill."""

    def __init__(self, tag: int = 0, at_step: int = 2, how: str = "raise", episode_length: int = 100) -> None:
        super().__init__(tag, episode_length)
        self.at_step = at_step
        self.how = how

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.step_calls + 1 == self.at_step:
            if self.how == "raise":
                raise RuntimeError(f"env {self.tag} broke on purpose")
            if self.how == "hang":
                threading.Event().wait()  # forever; only a kill ends it
            if self.how == "exit":
                os._exit(3)
            if self.how == "kill":
                os.kill(os.getpid(), 9)
        return super().step(action)


class FailingResetEnv(CountingEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        raise ValueError(f"env {self.tag} cannot reset")


class DelayEnv(CountingEnv):
    """Each step sleeps ``delay`` seconds: async tests use delays ~100x apart."""

    def __init__(self, tag: int = 0, delay: float = 0.0, episode_length: int = 1000) -> None:
        super().__init__(tag, episode_length)
        self.delay = delay

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.delay:
            time.sleep(self.delay)  # the env's own cost, not a wait on the test's side
        return super().step(action)


class StallingEnv(DelayEnv):
    """While its ``stall`` attribute is set, a step waits (up to a minute) for a kill of its worker;
    a ``stall`` that is a path is created first, to say the step has begun to wait."""

    stall: bool | str = False

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.stall:
            if isinstance(self.stall, str):
                open(self.stall, "w").close()
            threading.Event().wait(60)
        return super().step(action)


class LeakyEnv(CountingEnv):
    """Holds on to ``leak_mb`` MiB more of written memory after each step, as a leaky simulator does."""

    def __init__(self, tag: int = 0, leak_mb: float = 0.0, episode_length: int = 50) -> None:
        super().__init__(tag, episode_length)
        self.leak_mb = leak_mb
        self.leaked: list[bytes] = []

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.leak_mb:
            self.leaked.append(b"x" * int(self.leak_mb * 2**20))  # written: resident, not just reserved
        return super().step(action)


class WarningEnv(CountingEnv):
    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        import warnings

        warnings.warn("a warning from inside the env", UserWarning, stacklevel=1)
        return super().step(action)


class OtherSpaceEnv(CountingEnv):
    action_space = spaces.Discrete(3)


class RenderingEnv(CountingEnv):
    """Renders a 2x3 frame filled with its tag and step count."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    render_mode = "rgb_array"

    def render(self) -> np.ndarray:
        return np.full((2, 3, 3), self.tag * 10 + self.count, dtype=np.uint8)


class SlowToBuildEnv(CountingEnv):
    """Takes ``build_s`` seconds to build, as a simulator that loads its assets does."""

    def __init__(self, tag: int, build_s: float, episode_length: int = 3) -> None:
        super().__init__(tag, episode_length)
        time.sleep(build_s)  # the env's own cost, not a wait on the test's side


def counting(tag: int = 0, episode_length: int = 3, terminate: bool = True) -> Any:
    """A picklable factory of a CountingEnv."""
    return lambda: CountingEnv(tag, episode_length, terminate)


class EchoEnv(gym.Env):
    """Its actions and observations share one ``space``: a step observes the action it was given.

    A reset draws its observation from the space, seeded by the reset's seed
    (or by ``tag`` before the first seeded reset), so that each env's draws
    are known; episodes last ``episode_length`` steps, and the reward is
    ``tag * 10 + step count``.
    """

    def __init__(self, space: gym.Space, tag: int = 0, episode_length: int = 3) -> None:
        self.observation_space = copy.deepcopy(space)  # its own RNG
        self.action_space = copy.deepcopy(space)
        self.observation_space.seed(tag)
        self.tag = tag
        self.episode_length = episode_length
        self.count = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.count = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.count += 1
        info = {"count": self.count} if self.count % 2 == 0 else {}
        return action, float(self.tag * 10 + self.count), self.count >= self.episode_length, False, info


class BagSpace(gym.Space):
    """A custom space of no fixed shape: lists of ints below ``n``, of any length up to ``n``.

    Gymnasium batches a custom Space subclass as a Tuple of per-env spaces,
    as it batches Graph, Sequence, Text and OneOf.
    """

    def __init__(self, n: int = 4, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.n = n

    def sample(self, mask: Any = None, probability: Any = None) -> list[int]:
        return self.np_random.integers(0, self.n, self.np_random.integers(0, self.n + 1)).tolist()

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and len(x) <= self.n and all(isinstance(i, int) and 0 <= i < self.n for i in x)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BagSpace) and other.n == self.n

    def __repr__(self) -> str:
        return f"BagSpace({self.n})"


class SoakEnv(CountingEnv):
    """A CountingEnv whose actions can inject faults: the soak tests of surviving failures drive them.

    Actions 0-4 step as CountingEnv does; the others misbehave in the step
    that receives them.
    """

    STEP_RAISES, NEXT_RESET_RAISES, EXITS, HANGS = 5, 6, 7, 8
    action_space = spaces.Discrete(9)

    def __init__(self, tag: int = 0) -> None:
        super().__init__(tag, episode_length=3)
        self.reset_raises = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if self.reset_raises:
            raise RuntimeError(f"env {self.tag}: injected fault in reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = int(action)
        if action == self.STEP_RAISES:
            raise RuntimeError(f"env {self.tag}: injected fault in step")
        if action == self.EXITS:
            os._exit(3)
        if action == self.HANGS:
            threading.Event().wait()  # until its worker is killed
        if action == self.NEXT_RESET_RAISES:
            self.reset_raises = True  # and the episode ends now, so that the "restart" policy resets it
            obs, reward, _, _, info = super().step(0)
            return obs, reward, True, False, info
        return super().step(action)


class ReadOnlyHere(int):
    """An int that unpickles in the process that pickled it and raises in any other: an action a worker
    cannot read, as one whose class the worker cannot import."""

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return _read_only_in, (int(self), os.getpid())


def _read_only_in(value: int, pid: int) -> ReadOnlyHere:
    if os.getpid() != pid:
        raise RuntimeError(f"{value} can be read only in process {pid}")
    return ReadOnlyHere(value)
