"""Which buffers a backend gets: the rows of ended episodes and spare obs slots only where they pay."""

from __future__ import annotations

import functools
import os
import signal
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import WideCountingEnv
from gymnasium import spaces

from parallelenv import ParallelEnv, Recycling, check_state
from parallelenv.backends.buffers import (
    ENDED_ROW_MAX_BYTES,
    OBS_SLOT_MAX_BYTES,
    SPARE_OBS_SLOTS,
    Buffers,
    spare_obs_slots,
)
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


# ---------------------------------------------------------------- spare obs slots of shared buffers


@pytest.mark.parametrize("obs_space, num_envs, copies, spares", [
    (spaces.Box(0, 255, (84, 84, 4), np.uint8), 8, True, SPARE_OBS_SLOTS),  # an Atari frame stack each
    (spaces.Box(0, 255, (84, 84, 4), np.uint8), 8, False, 0),  # copy=False: results are the buffers
    (spaces.Box(0, 1, (4,), np.float32), 8, True, 0),  # small: a copy costs what an allocation does
    (spaces.Box(0, 255, (OBS_SLOT_MAX_BYTES // 2 + 1,), np.uint8), 2, True, 0),  # the /dev/shm bound
    (spaces.Dict({"a": spaces.Box(0, 255, (2**17,), np.uint8)}), 1, True, 0),  # not one array
])
def test_shared_buffers_get_spare_obs_slots_only_for_large_arrays_of_copied_results(obs_space, num_envs,
                                                                                   copies, spares):
    assert spare_obs_slots(obs_space, num_envs, copies) == spares


def test_steps_of_every_env_take_turns_in_the_spare_obs_slots_the_caller_does_not_hold():
    buffers = Buffers.allocate(spaces.Box(0, 1, (2**14,), np.float32), ACTIONS, 2, zeros,
                               spare_obs_slots=SPARE_OBS_SLOTS)
    home = buffers.obs
    assert len(buffers.obs_slots) == 1 + SPARE_OBS_SLOTS and buffers.obs_slots[0] is home
    assert buffers.handover.kind == "slot"
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 1 and buffers.obs is buffers.obs_slots[1]
    buffers.obs[:] = 1.0
    handed = buffers.handover.whole_step_obs(buffers)
    assert np.shares_memory(handed, buffers.obs_slots[1]) and handed.shape == home.shape and (handed == 1.0).all()
    assert buffers.obs is home and buffers.obs_slot == 0
    row = handed[1]
    del handed
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 2  # a row of slot 1's lease holds it
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 2  # written into, never handed over
    buffers.obs[:] = 2.0
    handed = buffers.handover.whole_step_obs(buffers)
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 0  # both held: the next step is copied out of slot 0
    assert buffers.handover.whole_step_obs(buffers) is None
    del row
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 1
    buffers.obs[:] = 3.0
    assert (handed == 2.0).all()
    buffers.handover.before_whole_call(buffers, step_of_every_env=False)
    assert buffers.obs_slot == 0  # other calls write into obs as allocated, and are copied out


def test_subproc_hands_a_step_of_large_observations_over_without_copying_it(no_leaks):
    envs = [lambda tag=tag: WideCountingEnv(tag, episode_length=1000) for tag in range(2)]
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, asynchronous="continue") as penv:
        spares = [slot.ctypes.data for slot in penv.backend.buffers.obs_slots[1:]]  # no reference kept
        penv.reset(seed=0)
        addresses = []
        for _ in range(3):
            obs, *_ = penv.step([1, 1])
            addresses.append(obs.ctypes.data)
            del obs
        kept, *_ = penv.step([1, 1])
        obs, *_ = penv.step([1, 1])
        assert addresses == [spares[0]] * 3
        assert [kept.ctypes.data, obs.ctypes.data] == spares
        assert kept[:, 1].tolist() == [4, 4] and obs[:, 1].tolist() == [5, 5]


def test_subproc_gives_no_spare_obs_slots_where_results_are_not_copied(no_leaks):
    envs = [lambda tag=tag: WideCountingEnv(tag) for tag in range(2)]
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, copy=False) as penv:
        assert penv.backend.buffers.obs_slots == []


class FragileWide(WideCountingEnv):
    """A WideCountingEnv whose step kills or hangs its own process once, when ``marker`` names its tag."""

    def __init__(self, tag: int, marker: str) -> None:
        super().__init__(tag, episode_length=7)
        self.marker = marker

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        try:
            with open(self.marker) as file:
                tag, fault = file.read().split()
        except (FileNotFoundError, ValueError):
            tag, fault = "-1", ""
        if int(tag) == self.tag:
            os.remove(self.marker)
            if fault == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "raises":
                raise RuntimeError("a fragile env's step")
            threading.Event().wait()  # hangs until its worker is killed
        return super().step(action)


def fragile_wide(tag: int, marker: str) -> gym.Env:
    return FragileWide(tag, marker)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault, snapshots", [("killed", False), ("killed", 5), ("hangs", False), ("hangs", 5),
                                             ("raises", False),  # an env whose step raised is reset all the same
                                             ("recycled", 5)])
def test_healing_hands_large_observations_over_in_spare_slots_and_heals_them_right(no_leaks, tmp_path, fault,
                                                                                   snapshots):
    """With healing on, steps of every env still go into spare slots. A worker lost mid-step (or an env
    whose step raised): the rebuilt envs' rows in the step handed over are their new episode's first obs
    (or, for a lost worker with snapshots, what a run without the fault gives), the other rows as without
    the fault, and the step the caller still holds is untouched."""
    marker = str(tmp_path / "fault")
    envs = [functools.partial(fragile_wide, tag, marker) for tag in range(4)]
    assert check_state(envs[0], steps=10)  # its pickle continues exactly: trusted for the snapshots
    actions = [np.full(4, t % 5) for t in range(40)]
    with ParallelEnv(envs, asynchronous="restart") as reference:
        reference.reset(seed=0)
        expected = [reference.step(action)[0].copy() for action in actions]
    healing = {"on_env_error": "restart"} if fault == "raises" else {
        "on_worker_failure": "restart", "snapshots": snapshots, "call_timeout": 2.0 if fault == "hangs" else 60.0}
    if fault == "recycled":  # every worker replaced on purpose every 17 steps, its envs going on from snapshots
        healing = {"recycle": Recycling(steps=17), "snapshots": snapshots}
    rebuilt = [2] if fault == "raises" else [2, 3]
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, asynchronous="restart", **healing) as penv:
        spares = [slot.ctypes.data for slot in penv.backend.buffers.obs_slots[1:]]
        assert len(spares) == SPARE_OBS_SLOTS
        penv.reset(seed=0)
        held = held_copy = None
        in_spares = 0
        for t, action in enumerate(actions):
            if t == 23 and fault != "recycled":
                with open(marker, "w") as file:
                    file.write(f"2 {fault}")
            obs, _, _, _, info = penv.step(action)
            in_spares += obs.ctypes.data in spares
            if held is not None:
                np.testing.assert_array_equal(held, held_copy, err_msg=f"step {t}: a step the caller holds changed")
            cut = info.get("_worker_restarted" if fault != "raises" else "_env_restarted", np.zeros(4, bool))
            if snapshots or not cut.any():
                np.testing.assert_array_equal(obs, expected[t], err_msg=f"step {t}")
            else:
                assert t == 23 and np.flatnonzero(cut).tolist() == rebuilt
                kept = [i for i in range(4) if i not in rebuilt]
                np.testing.assert_array_equal(obs[kept], expected[t][kept])
                assert (obs[rebuilt, 1] == 0).all() and (obs[rebuilt, 0] == rebuilt).all()
                assert (obs[rebuilt, 4:].T == rebuilt).all()  # the whole row of the new episode's first obs
                break
            held, held_copy = obs, obs.copy()  # one spare held, the other free: the next step goes there
        assert len(penv.failures) == (4 if fault == "recycled" else 1) and in_spares >= 20
