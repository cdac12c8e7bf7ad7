"""Contiguous groups of envs, one per worker process or actor, and calls split among them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from parallelenv.calls import Call, split_call


class Groups:
    """Envs ``0 .. num_envs-1`` in ``num_groups`` contiguous blocks of near-equal size."""

    def __init__(self, num_envs: int, num_groups: int) -> None:
        blocks = np.array_split(np.arange(num_envs), num_groups)
        self.members: list[list[int]] = [block.tolist() for block in blocks]
        # owner[i] is the group hosting env i.
        self._owner = np.repeat(np.arange(num_groups), [len(block) for block in blocks])

    def split(self, call: Call) -> list[tuple[int, Call]]:
        """``(group, the call restricted to that group's envs)`` for every group the call names."""
        owners = self._owner[list(call.env_ids)]
        if owners[0] == owners[-1] and (owners == owners[0]).all():
            return [(int(owners[0]), call)]
        return [
            (int(group), split_call(call, np.flatnonzero(owners == group).tolist()))
            for group in np.unique(owners)
        ]

    def hosting(self, env_ids: Sequence[int]) -> list[int]:
        """The groups that host any of ``env_ids``."""
        return [int(group) for group in np.unique(self._owner[list(env_ids)])]
