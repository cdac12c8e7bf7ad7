"""The env the soak runs: a counter whose actions inject faults, and which may leak memory per step.

It lives in an importable module so that worker processes and Ray actors
unpickle its factories by reference.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FaultyEnv(gym.Env):
    """Obs is [tag, step count]; episodes last ``episode_length`` steps.

    Actions below :attr:`STEP_RAISES` step; the others inject the fault they
    name in the step that receives them. A file ``marker`` (when given) makes
    the next step exit or hang, as it says, and is removed: a fault of the
    worker, not of the actions, so that a step replayed after it steps on (as
    lossless healing replays it). Each step keeps ``leak_kb`` KiB more of
    written memory, as a leaky simulator does, until the env is rebuilt; the
    leak is no part of its state (:meth:`get_state`), as a simulator's is not.
    """

    STEP_RAISES, NEXT_RESET_RAISES, EXITS, HANGS = 2, 3, 4, 5
    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = spaces.Discrete(6)

    def __init__(self, tag: int = 0, leak_kb: float = 0.0, episode_length: int = 200,
                 marker: str | None = None) -> None:
        self.tag = tag
        self.leak_bytes = int(leak_kb * 1024)
        self.episode_length = episode_length
        self.marker = marker
        self.count = 0
        self.reset_raises = False
        self.leaked: list[bytes] = []

    def get_state(self) -> tuple[int, bool, dict[str, Any]]:
        return self.count, self.reset_raises, self.np_random.bit_generator.state

    def set_state(self, state: tuple[int, bool, dict[str, Any]]) -> None:
        self.count, self.reset_raises, self.np_random.bit_generator.state = state

    def _marked_fault(self) -> int | None:
        try:
            with open(self.marker) as file:  # type: ignore[arg-type]
                fault = file.read()
            os.remove(self.marker)  # type: ignore[arg-type]
        except (FileNotFoundError, TypeError):
            return None
        return self.EXITS if fault == "exits" else self.HANGS

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.reset_raises:
            raise RuntimeError(f"env {self.tag}: injected fault in reset")
        self.count = 0
        return np.array([self.tag, 0.0]), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = int(action) if self.marker is None else self._marked_fault() or int(action)
        if action == self.STEP_RAISES:
            raise RuntimeError(f"env {self.tag}: injected fault in step")
        if action == self.EXITS:
            os._exit(3)
        if action == self.HANGS:
            threading.Event().wait()  # until call_timeout has its worker killed
        if self.leak_bytes:
            self.leaked.append(b"x" * self.leak_bytes)  # written: resident, not just reserved
        self.count += 1
        # The episode ends now, so that the "restart" policy resets the env at once and the fault fires.
        self.reset_raises = action == self.NEXT_RESET_RAISES
        done = self.reset_raises or self.count >= self.episode_length
        return np.array([self.tag, float(self.count)]), 1.0, done, False, {}
