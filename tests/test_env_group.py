"""EnvGroup's same-step restart ("restart"): where the ended episode's last obs goes, and when it is flagged."""

from __future__ import annotations

from typing import Any

import numpy as np
from envs import CountingEnv

from parallelenv.backends.buffers import Buffers
from parallelenv.backends.env_group import EnvGroup
from parallelenv.batching import zeros
from parallelenv.calls import Reset, Step


class SecondResetFails(CountingEnv):
    """Starts its first episode, then cannot start another."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if self.draw:  # set by the first reset
            raise ValueError(f"env {self.tag} cannot start another episode")
        return super().reset(seed=seed, options=options)


def restarting_group(envs: list[CountingEnv], ended_rows: bool) -> tuple[EnvGroup, Buffers]:
    """A group under "restart", reset; ``ended_rows``: its buffers hold the rows of ended episodes."""
    group = EnvGroup(envs, first_id=0, restart=True)
    buffers = Buffers.allocate(CountingEnv.observation_space, CountingEnv.action_space, len(envs), zeros, ended_rows)
    group.attach(buffers)
    ids = tuple(range(len(envs)))
    assert not group.run(Reset(ids, (1,) * len(envs), (None,) * len(envs))).failures
    return group, buffers


def test_an_ended_episode_is_flagged_in_its_row_only_once_its_reset_succeeded():
    group, buffers = restarting_group([CountingEnv(0, 1), SecondResetFails(1, 1), CountingEnv(2, 2)], ended_rows=True)
    done = group.run(Step((0, 1, 2)))
    assert [(failure.env_index, failure.method) for failure in done.failures] == [(1, "reset")]
    assert buffers.ended.tolist() == [True, False, False]
    assert buffers.ended_obs[0, :2].tolist() == [0, 1]  # env 0's last obs: tag 0, step 1
    assert buffers.obs[0, :2].tolist() == [0, 0]  # and the first of its next episode
    assert set(done.values[0]) == {"reset_info"} and "ended_state" not in done.values[0]


def test_without_ended_rows_the_last_obs_is_a_copy_in_the_info():
    group, buffers = restarting_group([CountingEnv(0, 1), CountingEnv(1, 2)], ended_rows=False)
    assert buffers.ended is None
    done = group.run(Step((0, 1)))
    info = done.values[0]
    assert list(info) == ["reset_info", "ended_state", "reset"] and info["reset"] is True
    assert info["ended_state"][:2].tolist() == [0, 1] and buffers.obs[0, 1] == 0
    assert info["reset_info"] == {"seed_draw": group.envs[0].draw}
    assert 1 not in done.values  # env 1 goes on, with no info at its first step
