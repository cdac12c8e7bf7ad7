"""Healing that loses no episode: ParallelEnv(snapshots=...) with on_worker_failure="restart".

A worker killed, or hung past call_timeout, mid-episode: its envs are rebuilt,
put back into their last snapshot and replay the steps since, the step under
way last. Every env's whole trajectory equals a run without the fault, with
the same seeds and actions, and nothing says ``worker_restarted``; the
failure log names the envs restored.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_env_state import Walker, assert_same

from parallelenv import ParallelEnv, check_state
from parallelenv.infos.keys import WORKER_RESTARTED
from parallelenv.state import capture

pytestmark = pytest.mark.timeout(180)

NUM_ENVS = 4
FAULT_AT = (37, 64)  # batch steps at which env 2's worker is hit, then env 0's
GROUPS = {"subproc": {"num_workers": 2}, "ray": {}, "ray-subproc": {"num_actors": 2, "num_workers_per_actor": 1}}


class FragileWalker(Walker):
    """A Walker whose step kills or hangs its own process once, when ``marker`` names its tag."""

    def __init__(self, tag: int, marker: str) -> None:
        super().__init__()
        self.tag, self.marker = tag, marker

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        try:
            with open(self.marker) as file:
                tag, fault = file.read().split()
        except (FileNotFoundError, ValueError):  # none, or removed (or being written) by another env's step
            tag, fault = "-1", ""
        if int(tag) == self.tag:
            os.remove(self.marker)  # once: the replay steps on
            if fault == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Event().wait()  # hangs until its worker is killed
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {"position": self.position} if self.elapsed % 3 == 0 else info


def fragile(tag: int, marker: str) -> gym.Env:
    return gym.wrappers.TimeLimit(FragileWalker(tag, marker), max_episode_steps=25)


def trajectory(penv: ParallelEnv, actions: list[np.ndarray], marker: str | None, fault: str) -> list[tuple]:
    penv.reset(seed=0)
    steps = []
    for t, action in enumerate(actions):
        if marker is not None and t in FAULT_AT:
            with open(marker + ".new", "w") as file:
                file.write(f"{2 if t == FAULT_AT[0] else 0} {fault}")
            os.replace(marker + ".new", marker)  # whole: a step never reads half of it
        obs, reward, terminated, truncated, info = penv.step(action)
        assert WORKER_RESTARTED not in info, f"step {t}: an episode was cut"
        position = np.where(info.get("_position", np.zeros(NUM_ENVS, bool)), info.get("position", 0.0), np.nan)
        steps.append((obs, reward, terminated, truncated, position))
    return steps


@pytest.mark.parametrize("fault", ["killed", "hangs"])
@pytest.mark.parametrize("para_mode", ["subproc", "ray", "ray-subproc"])
def test_a_worker_lost_mid_episode_cuts_no_episode(tmp_path, request, para_mode, fault):
    if para_mode.startswith("ray"):
        request.getfixturevalue("ray_session")
    marker = str(tmp_path / "fault")
    envs = [functools.partial(fragile, tag, marker) for tag in range(NUM_ENVS)]
    assert check_state(envs[0], steps=40)  # the pickle of a Walker continues exactly: trusted
    actions = [np.random.default_rng(t).integers(0, 3, NUM_ENVS) for t in range(100)]
    with ParallelEnv(envs, asynchronous="restart") as reference:
        unfaulted = trajectory(reference, actions, None, fault)
    with ParallelEnv(envs, para_mode=para_mode, asynchronous="restart", on_worker_failure="restart", snapshots=10,
                     call_timeout=3.0 if fault == "hangs" else 60.0, **GROUPS[para_mode]) as penv:
        healed = trajectory(penv, actions, marker, fault)
        failures = penv.failures
    for (a, b) in zip(unfaulted, healed, strict=True):
        np.testing.assert_array_equal(a[4], b[4])  # the infos too
    assert_same([step[:4] for step in unfaulted], [step[:4] for step in healed])
    assert len(failures) == 2, failures
    assert 2 in failures[0].restored and 0 in failures[1].restored
    assert all(set(f.restored) == set(f.env_ids) for f in failures)


@pytest.mark.parametrize("para_mode", ["subproc", "ray", "ray-subproc"])
def test_an_env_that_cannot_be_snapshotted_is_reset_and_the_log_says_why(tmp_path, monkeypatch, request, para_mode):
    """Walkers whose pickle no check_state has verified are refused at every snapshot step (on subproc,
    their reason written to the state slots once, then "again"); a lost worker's are rebuilt and reset,
    said in their info, and the failure log gives each one's reason."""
    if para_mode.startswith("ray"):
        request.getfixturevalue("ray_session")
    monkeypatch.setattr(capture, "_TRUSTED_PICKLES", set())
    marker = str(tmp_path / "fault")
    envs = [functools.partial(fragile, tag, marker) for tag in range(NUM_ENVS)]
    lost = [2] if para_mode == "ray" else [2, 3]  # a Ray actor hosts one env; the others' workers two
    with ParallelEnv(envs, para_mode=para_mode, asynchronous="restart", on_worker_failure="restart",
                     snapshots=5, **GROUPS[para_mode]) as penv:
        penv.reset(seed=0)
        for t in range(30):
            if t == 23:
                with open(marker, "w") as file:
                    file.write("2 killed")
            info = penv.step(np.ones(NUM_ENVS, dtype=np.int64))[4]
            cut = info.get("_" + WORKER_RESTARTED, np.zeros(NUM_ENVS, bool))
            assert np.flatnonzero(cut).tolist() == (lost if t == 23 else []), t
        [failure] = penv.failures
    assert failure.restored == () and sorted(failure.not_restored) == lost
    for why in failure.not_restored.values():
        assert why.startswith("its state could not be taken") and "FragileWalker" in why and "check_state" in why


def test_snapshots_need_a_restart_and_a_cadence():
    with pytest.raises(ValueError, match="snapshots= serves healing"):
        ParallelEnv([lambda: Walker()], snapshots=True)
    for bad in (0, -3, 2.5, "often"):
        with pytest.raises(ValueError, match="snapshots="):
            ParallelEnv([lambda: Walker()], para_mode="subproc", on_worker_failure="restart", snapshots=bad)


def test_the_record_stays_within_a_few_cadences_whatever_the_envs_do():
    """Env 1 is never stepped (finished and idle, say): it loses its snapshot rather than have the
    record grow; env 0, snapshotted every 10 steps, keeps its own."""
    from parallelenv.state.journal import KEPT_CADENCES, Journal

    journal = Journal(2, every=10)
    assert journal.stepped(np.array([0, 1]), np.array([-1, -1])) is not None  # the first step snapshots both
    journal.took({0: ("state at", -1), 1: ("state at", -1)})
    assert journal.can_replay(1)
    for step in range(1000):
        snapshot = journal.stepped(np.array([0]), np.array([step]))
        if snapshot is not None:
            journal.took({0: ("state at", step)})  # the reply of that step (a str would be a refusal)
    assert len(journal._entries) <= (KEPT_CADENCES + 1) * 10
    assert journal.can_replay(0) and not journal.can_replay(1)
    replay = journal.replay([0])
    assert replay.states == (("state at", 999),) and [e[1] for e in replay.entries[0]] == [999]
