"""The subproc backend's counted steps (see parallelenv.backends.countdown).

A ``step()`` of every env, with a worker per core, sleeps until the last worker
counts down; a worker with no info to send answers through the countdown
alone and writes nothing to its pipe. These tests look inside the backend on
purpose: what they guard against is a parent that sleeps on the wrong thing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from envs import DelayEnv, counting

from parallelenv.backends.base import available_cpus

pytestmark = [
    pytest.mark.parametrize("backend", ["subproc"]),
    pytest.mark.skipif(available_cpus() < 2, reason="steps are counted only with a core per worker"),
]


def test_steps_of_every_env_are_counted(make_penv):
    penv = make_penv([counting(tag, 9) for tag in range(4)])
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])  # odd counts: no infos, so both workers answer quietly
    countdown = penv._backend._countdown
    assert countdown.answered_quietly(0) and countdown.answered_quietly(1)


@pytest.mark.timeout(60)
def test_a_stray_wake_up_does_not_end_a_counted_step_early(make_penv):
    # A wake-up byte left over from an earlier step (its wait timed out just
    # as the last worker counted down) must not pass for this step's: worker 1
    # answers quietly, later, and nothing would tell a parent woken too early.
    penv = make_penv([lambda: DelayEnv(0, 0.0), lambda: DelayEnv(1, 0.3)])
    penv.reset(seed=0)
    os.write(penv._backend._countdown._wake_writer.fileno(), b"w")
    obs, *_ = penv.step([1, 1])
    np.testing.assert_array_equal(obs[:, :2], [[0, 1], [1, 1]])  # tag, count
    assert penv.get_env_attr("step_calls") == [1, 1]


def test_quiet_and_talking_workers_in_one_step(make_penv):
    # Env 1 reaches an even count (an info) a step before env 0 does; the
    # worker with an info answers on its pipe, the other through the countdown alone.
    penv = make_penv([counting(0, 9), counting(1, 9)])
    penv.reset(seed=0)
    penv.reset(id=[1], options={"start": 1})
    *_, info = penv.step([1, 1])
    np.testing.assert_array_equal(info["_count"], [False, True])
    assert info["count"][1] == 2
    *_, info = penv.step([1, 1])
    np.testing.assert_array_equal(info["_count"], [True, False])
    assert info["count"][0] == 2
