"""Whether an env's state continues exactly: verified on the env, never assumed.

:func:`check_state` builds the env, plays it for a while, takes its state,
plays on with random actions (resetting, unseeded, where an episode ends),
then puts the state back, into the same env and into a fresh one built the
same way, and plays the same actions again. The continuation is exact when
every observation, reward and flag is bit for bit the same; an env class
whose pickle passes is trusted for its state from then on, in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv.backends.env_sources import make_env
from parallelenv.state.capture import PICKLE, StateError, capture_env, restore_env, trust, way_of

__all__ = ["StateCheck", "check_state"]


@dataclass(frozen=True)
class StateCheck:
    """What :func:`check_state` found: ``exact`` is the answer; ``difference`` says where it first failed."""

    env_class: str
    way: str  # how the state was taken ("protocol", "mujoco", "ale", "pickle"), or "none"
    exact: bool
    steps: int
    nbytes: int  # the state's size
    capture_s: float  # the time to take it
    restore_s: float  # the time to put it back
    difference: str | None = None

    def __bool__(self) -> bool:
        return self.exact


def check_state(env_fn: Callable[[], gym.Env] | str, steps: int = 100, warmup: int = 50, seed: int = 0) -> StateCheck:
    """Take the state of a new env from ``env_fn`` (a factory or a registered env id) after ``warmup``
    random steps, play ``steps`` more, put the state back and play them again: the same env, then a
    fresh one. Exact when all three agree bit for bit; a pickled env class that passes is trusted.

    Example:
        >>> import gymnasium as gym
        >>> from parallelenv import check_state
        >>> result = check_state(lambda: gym.make("CartPole-v1"), steps=50)
        >>> result.exact, result.way
        (True, 'pickle')
    """
    if not isinstance(steps, int) or steps < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"steps={steps!r}, warmup={warmup!r}; use steps >= 1 and warmup >= 0")
    if isinstance(env_fn, gym.Env):
        raise TypeError("check_state needs a way to build the env (a factory or an env id), not an env: it builds "
                        "a second one to put the state into")
    source = (lambda: gym.make(env_fn)) if isinstance(env_fn, str) else env_fn
    env = make_env(source)
    fresh = None
    try:
        cls = f"{type(env.unwrapped).__module__}.{type(env.unwrapped).__qualname__}"
        try:
            way = way_of(env, trusted=(cls,))  # a pickle is what is being checked here: not yet trusted
        except StateError as refused:
            return StateCheck(cls, "none", False, steps, 0, 0.0, 0.0, str(refused))
        env.reset(seed=seed)
        env.action_space.seed(seed)
        _play(env, [env.action_space.sample() for _ in range(warmup)])
        start = time.perf_counter()
        state = capture_env(env, trusted=(cls,))
        capture_s = time.perf_counter() - start
        actions = [env.action_space.sample() for _ in range(steps)]
        first = _play(env, actions)
        start = time.perf_counter()
        restore_env(env, state)
        restore_s = time.perf_counter() - start
        difference = _first_difference(first, _play(env, actions), "put back into the same env")
        if difference is None:
            fresh = make_env(source)
            fresh.reset(seed=seed + 1)  # another episode, which the state must replace whole
            restore_env(fresh, state)
            difference = _first_difference(first, _play(fresh, actions), "put into a fresh env")
        if difference is None and way == PICKLE:
            trust(cls)
        return StateCheck(cls, way, difference is None, steps, state.nbytes, capture_s, restore_s, difference)
    finally:
        env.close()
        if fresh is not None:
            fresh.close()


def _play(env: gym.Env, actions: list[Any]) -> list[tuple[Any, ...]]:
    """Each step's (obs, reward, terminated, truncated); a finished episode is reset without a seed."""
    record = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        record.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            record.append((obs, None, None, None))
    return record


def _first_difference(expected: list[tuple[Any, ...]], got: list[tuple[Any, ...]], how: str) -> str | None:
    for step, (want, have) in enumerate(zip(expected, got, strict=False)):
        for name, a, b in zip(("obs", "reward", "terminated", "truncated"), want, have, strict=True):
            if not _same(a, b):
                return f"{how}: step {step} after the state was taken gave another {name}"
    if len(expected) != len(got):
        return f"{how}: the episodes ended at other steps"
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
