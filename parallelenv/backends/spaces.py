"""The spaces of a backend's envs: one observation and one action space that every env shares.

The buffers hold a row per env shaped by them, so envs of other spaces are
refused, at start and when an env is replaced.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

from parallelenv.errors import PicklesWhole

SpacePair = tuple[gym.Space, gym.Space]


class SpaceMismatch(PicklesWhole, ValueError, RuntimeError):
    """Env ``env_id`` has other spaces than env ``reference_id``: all envs must share theirs.

    Also a RuntimeError, which Gymnasium's vector envs raise for envs of different spaces.
    """

    def __init__(self, env_id: int, kind: str, mine: gym.Space, reference_id: int, reference: gym.Space) -> None:
        super().__init__(
            f"env {env_id} has {kind} {mine}, but env {reference_id} has {reference}; all envs must share their spaces"
        )
        self.fields = (env_id, kind, mine, reference_id, reference)

    def shifted(self, offset: int) -> SpaceMismatch:
        """The same mismatch for envs numbered ``offset`` higher (a group's envs, in global ids)."""
        env_id, kind, mine, reference_id, reference = self.fields
        return SpaceMismatch(env_id + offset, kind, mine, reference_id + offset, reference)


def common_spaces(per_env: Sequence[SpacePair]) -> SpacePair:
    """The spaces every env shares; a :class:`SpaceMismatch` names the first env that differs from env 0."""
    first = per_env[0]
    for env_id, pair in enumerate(per_env):
        for kind, mine, reference in zip(("observation_space", "action_space"), pair, first, strict=True):
            if mine != reference:
                raise SpaceMismatch(env_id, kind, mine, 0, reference)
    return first


def check_replacement(new: gym.Env, old: gym.Env, env_id: int) -> None:
    """A ValueError if ``new`` has other spaces than ``old``, env ``env_id``, whose buffer rows it takes over."""
    for kind in ("observation_space", "action_space"):
        mine, theirs = getattr(new, kind), getattr(old, kind)
        if mine != theirs:
            raise ValueError(f"the new env has {kind} {mine}, but env {env_id} has {theirs}")
