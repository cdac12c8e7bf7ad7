"""The real workloads' envs: MuJoCo HalfCheetah and Atari Pong as users make them, and EnvPool's twins.

The factories are module-level functions, so that subprocess and Ray workers
unpickle them by import path. Their simulators (``mujoco``, ``ale_py`` with
OpenCV) come with the ``bench`` extra and are imported only when an env is
made, so that the harness imports this module, and skips the workloads
whose simulator is missing, without them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

HALF_CHEETAH = "HalfCheetah-v5"
PONG = "ALE/Pong-v5"
PONG_FRAME_STACK = 4


def make_half_cheetah() -> gym.Env:
    """Gymnasium's ``HalfCheetah-v5``: ~45 us a step, four float infos every step."""
    import mujoco

    mujoco.set_mju_user_warning(_mujoco_warning)
    return gym.make(HALF_CHEETAH)


def _mujoco_warning(message: str) -> None:
    """MuJoCo's warnings to stderr, less the one HalfCheetah's model draws on every make.

    Unhandled, MuJoCo appends each to MUJOCO_LOG.TXT in the working folder
    (the checkout, when the tests run), and MuJoCo 4 warns on every make that
    the model's ``settotalmass`` is deprecated, which is Gymnasium's to change.
    """
    if "settotalmass" not in message:
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def make_pong() -> gym.Env:
    """``ALE/Pong-v5`` with Gymnasium's ``AtariPreprocessing`` and a 4-frame stack, as Atari agents see it."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    # frameskip=1: AtariPreprocessing skips the frames itself (4, max-pooling
    # the last two), then 30 no-op starts, 84x84 grayscale by INTER_AREA.
    return FrameStackObservation(AtariPreprocessing(gym.make(PONG, frameskip=1)), PONG_FRAME_STACK)


@dataclass(frozen=True)
class EnvPoolTwin:
    """The EnvPool task and options closest to one of our factories' envs."""

    task: str
    options: dict[str, Any] = field(default_factory=dict)


# EnvPool 1.2.5 has HalfCheetah-v5 itself, with v5's defaults (frame_skip 5,
# ctrl_cost_weight 0.1, reset_noise_scale 0.1, 1000-step episodes). What
# differs: its own MuJoCo build, float64 actions, and infos reward_run (for
# reward_forward) plus env_id, players and elapsed_step.
# Its Pong-v5 preprocesses as make_pong does (frame skip 4 with max-pooling,
# 30 no-ops, 84x84 grayscale by INTER_AREA, 4-frame stack, 27,000 steps =
# 108,000 frames an episode), but by default it presses FIRE on reset and has
# no sticky actions: both set here as ALE/Pong-v5 has them. What differs: its
# infos (lives, reward, terminated, elapsed_step, env_id, players and the
# 128-byte RAM, where Gymnasium's are lives and frame numbers).
ENVPOOL_TWINS: dict[Callable[[], gym.Env], EnvPoolTwin] = {
    make_half_cheetah: EnvPoolTwin(HALF_CHEETAH),
    make_pong: EnvPoolTwin("Pong-v5", {"repeat_action_probability": 0.25, "use_fire_reset": False}),
}
