"""The autoreset mode a known consumer of the Gymnasium view assumes, told from who builds the view.

RLlib's env runner (new API stack) builds its vector env with
``gym.make_vec`` and steps it as Gymnasium's default, next-step autoreset,
without reading ``metadata["autoreset_mode"]``: under another mode it
records episodes that do not start from a reset observation, silently. A
view built from inside that runner in another mode is refused instead.

The runner is told by the module of a frame on the stack, so nothing here
imports the framework.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from gymnasium.vector import AutoresetMode


@dataclass(frozen=True)
class Consumer:
    """A framework whose code builds vector envs in ``module`` and steps them as ``mode`` resets."""

    name: str
    module: str
    mode: AutoresetMode
    how: str  # how to get that mode from us


CONSUMERS = (
    Consumer(
        "RLlib's SingleAgentEnvRunner",
        "ray.rllib.env.single_agent_env_runner",
        AutoresetMode.NEXT_STEP,
        "leave autoreset_mode to its default in env_config (parallelenv's vector entry point), "
        "or build the ParallelEnv with asynchronous='idle'",
    ),
)


def calling_consumer() -> Consumer | None:
    """The known consumer whose code is on the caller's stack, if any."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        for consumer in CONSUMERS:
            if module == consumer.module:
                return consumer
        frame = frame.f_back
    return None


def check_consumer(mode: AutoresetMode, penv: Any = None) -> None:
    """Refuse a view in ``mode`` built for a consumer that assumes another; ``penv`` is closed first."""
    consumer = calling_consumer()
    if consumer is None or mode is consumer.mode:
        return
    if penv is not None:
        penv.close()
    raise ValueError(
        f"{consumer.name} steps its vector env as {consumer.mode} resets it, without asking; a view in "
        f"{mode} would have it record wrong episodes. To run under it, {consumer.how}"
    )
