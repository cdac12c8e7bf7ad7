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
        # owner[i] is the group hosting env i. A list, not an array: calls
        # name a handful of envs, and indexing NumPy per env costs more.
        self._owner: list[int] = np.repeat(np.arange(num_groups), [len(block) for block in blocks]).tolist()

    def split(self, call: Call) -> list[tuple[int, Call]]:
        """``(group, the call restricted to that group's envs)`` for every group the call names."""
        owner = self._owner
        positions: dict[int, list[int]] = {}
        for position, env_id in enumerate(call.env_ids):
            positions.setdefault(owner[env_id], []).append(position)
        if len(positions) == 1:
            return [(owner[call.env_ids[0]], call)]
        return [(group, split_call(call, group_positions)) for group, group_positions in positions.items()]

    def hosting(self, env_ids: Sequence[int]) -> list[int]:
        """The groups that host any of ``env_ids``."""
        return sorted({self._owner[i] for i in env_ids})
