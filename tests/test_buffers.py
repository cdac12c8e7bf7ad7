"""Which buffers a backend gets: the rows of ended episodes only where they pay."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from parallelenv.backends.buffers import ENDED_ROW_MAX_BYTES, Buffers
from parallelenv.batching import BufferLayout

ACTIONS = spaces.Discrete(2)


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.zeros(shape, dtype)


@pytest.mark.parametrize("obs_space", [spaces.Box(0, 1, (4,), np.float32), spaces.Discrete(3),
                                       spaces.MultiBinary(5)])
def test_a_restarting_env_of_array_observations_gets_a_row_per_env_for_its_ended_episode(obs_space):
    buffers = Buffers.allocate(obs_space, ACTIONS, 3, zeros, restarts=True)
    assert buffers.ended is not None and buffers.ended.shape == (3,) and not buffers.ended.any()
    assert buffers.ended_obs.shape == buffers.obs.shape and buffers.ended_obs.dtype == buffers.obs.dtype
    assert not np.shares_memory(buffers.ended_obs, buffers.obs)


@pytest.mark.parametrize("obs_space, restarts", [
    (spaces.Box(0, 1, (4,), np.float32), False),  # nothing restarts
    (spaces.Dict({"a": spaces.Discrete(2)}), True),  # not one array: ended obs travel in the infos
    (spaces.Text(5), True),  # no fixed shape
    (spaces.Box(0, 255, (ENDED_ROW_MAX_BYTES + 1,), np.uint8), True),  # rows past the cap
])
def test_other_envs_get_no_rows_for_ended_episodes(obs_space, restarts):
    buffers = Buffers.allocate(obs_space, ACTIONS, 2, zeros, restarts=restarts)
    assert buffers.ended is None and buffers.ended_obs is None


def test_whether_a_host_keeps_ended_rows_does_not_depend_on_its_number_of_envs():
    """A Ray actor lays out buffers for its own envs, the caller for all: they must agree."""
    obs_space = spaces.Box(0, 255, (ENDED_ROW_MAX_BYTES,), np.uint8)
    for num_envs in (1, 256):  # 16 MiB of rows in all: no cap on the total either
        assert Buffers.allocate(obs_space, ACTIONS, num_envs, zeros, restarts=True).ended is not None


def test_the_layout_sizing_pass_and_the_laid_out_buffers_agree():
    """Parent and workers lay the shared segment out from the spaces alone: the sizing pass sees no rows."""
    obs_space = spaces.Box(0, 1, (4,), np.float32)
    sizing = BufferLayout(None)
    Buffers.allocate(obs_space, ACTIONS, 3, sizing, restarts=True)
    laid_out = BufferLayout(bytearray(sizing.size))
    buffers = Buffers.allocate(obs_space, ACTIONS, 3, laid_out, restarts=True)
    assert laid_out.size == sizing.size and buffers.ended_obs is not None
