"""The subproc backend's counted steps (see parallelenv.backends.countdown).

A ``step()`` of every env, with a worker per core, sleeps until the last worker
counts down; a worker with no info to send answers through the countdown
alone and writes nothing to its pipe. These tests look at the backend's
countdown (``SubprocBackend.countdown``) on purpose: what they guard against is
a parent that sleeps on the wrong thing, which no result of a step shows.
"""

from __future__ import annotations

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
    penv.step([1, 1, 1, 1])  # the backend learns that its caller waits for whole steps
    penv.step([1, 1, 1, 1])
    penv.step([1, 1, 1, 1])  # odd counts: no infos, so both workers answer quietly
    countdown = penv.backend.countdown
    assert countdown.answered_quietly(0) and countdown.answered_quietly(1)


@pytest.mark.timeout(60)
def test_a_stray_wake_up_does_not_end_a_counted_step_early(make_penv):
    # A wake-up byte left over from an earlier step (its wait timed out just
    # as the last worker counted down) must not pass for this step's: worker 1
    # answers quietly, later, and nothing would tell a parent woken too early.
    penv = make_penv([lambda: DelayEnv(0, 0.0), lambda: DelayEnv(1, 0.3)])
    penv.reset(seed=0)
    penv.step([1, 1])  # the next whole step is counted
    penv.backend.countdown.for_worker(0).wake()  # as if worker 0 had been the last of an earlier step
    obs, *_ = penv.step([1, 1])
    np.testing.assert_array_equal(obs[:, :2], [[0, 2], [1, 2]])  # tag, count
    assert penv.get_env_attr("step_calls") == [2, 2]


def test_quiet_and_talking_workers_in_one_step(make_penv):
    # Env 1 reaches an even count (an info) a step before env 0 does; the
    # worker with an info answers on its pipe, the other through the countdown alone.
    penv = make_penv([counting(0, 9), counting(1, 9)])
    penv.reset(seed=0)
    penv.step([1, 1])  # the next whole step is counted
    penv.reset(seed=0)
    penv.reset(id=[1], options={"start": 1})
    *_, info = penv.step([1, 1])
    np.testing.assert_array_equal(info["_count"], [False, True])
    assert info["count"][1] == 2
    *_, info = penv.step([1, 1])
    np.testing.assert_array_equal(info["_count"], [True, False])
    assert info["count"][0] == 2


@pytest.mark.timeout(60)
def test_after_steps_a_send_and_recv_of_some_hands_over_envs_as_they_answer(make_penv):
    # Whole steps awaited together are counted; once the caller takes a whole
    # step's results as they come, the next whole step is not, so a recv of
    # the fast envs returns without waiting for the slow one.
    penv = make_penv([lambda: DelayEnv(0, 0.0), lambda: DelayEnv(1, 0.0)])
    penv.reset(seed=0)
    for _ in range(3):
        penv.step([1, 1])
    penv.send([1, 1])
    *_, info = penv.recv(wait_num=1)  # this whole step was counted: both come at once
    if len(info["env_id"]) < 2:
        penv.recv()
    penv.set_env_attr("delay", 0.5, id=[1])
    penv.send([1, 1])
    *_, info = penv.recv(wait_num=1)
    assert info["env_id"].tolist() == [0]  # env 1 is still sleeping: this step was not counted
    penv.recv()
