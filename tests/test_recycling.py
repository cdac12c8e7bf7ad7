"""Workers replaced on purpose (``ParallelEnv(recycle=Recycling(...))``), docs/design.rst, "Recycling".

A worker past a limit is replaced at a point where none of its envs has a
call under way; its envs answer their next step as rebuilt envs do, every
other env goes on untouched, and the replacement is logged.
"""

from __future__ import annotations

import functools

import numpy as np
import psutil
import pytest
from envs import LeakyEnv

from parallelenv import ParallelEnv, Recycling
from parallelenv.healing import WORKER_RECYCLED
from parallelenv.recycling import resident_mb

WORKER_BACKENDS = ("subproc", "ray", "ray-subproc")


@pytest.mark.timeout(300)
def test_a_leaking_worker_is_recycled_at_its_memory_limit_and_no_other_env_notices(no_leaks):
    """Env 0 leaks 5 MiB a step; its worker (envs 0 and 1) is replaced at its limit, again and again,
    through 1,500 steps, while the other worker's envs step exactly as in a run without recycling."""
    factories = [functools.partial(LeakyEnv, tag=i, leak_mb=5 if i == 0 else 0) for i in range(4)]
    actions = np.random.default_rng(0).integers(0, 5, size=(1500, 4))
    options = dict(para_mode="subproc", num_workers=2, asynchronous="restart")
    # The run without recycling leaks nothing: 1,500 steps of 5 MiB would take 7 GiB.
    with ParallelEnv([functools.partial(LeakyEnv, tag=i) for i in range(4)], **options) as plain:
        start_mb = resident_mb(plain.backend.workers()[0][1])
        limit_mb = start_mb + 250
        expected = [plain.reset(seed=3)[0][2:]]
        for step_actions in actions:
            obs, reward, terminated, truncated, _ = plain.step(step_actions)
            expected.append((obs[2:], reward[2:], terminated[2:], truncated[2:]))
    with ParallelEnv(factories, recycle=Recycling(memory_mb=limit_mb), **options) as penv:
        obs, _ = penv.reset(seed=3)
        np.testing.assert_array_equal(obs[2:], expected[0])
        most_mb = 0.0
        for t, step_actions in enumerate(actions, start=1):
            obs, reward, terminated, truncated, info = penv.step(step_actions)
            for got, want in zip((obs[2:], reward[2:], terminated[2:], truncated[2:]), expected[t], strict=True):
                np.testing.assert_array_equal(got, want)
            assert not info.get("_worker_restarted", np.zeros(4, bool))[2:].any()
            most_mb = max(most_mb, psutil.Process(penv.backend.workers()[0][1]).memory_info().rss / 2**20)
        recycled = [failure for failure in penv.failures if failure.kind == WORKER_RECYCLED]
        assert len(recycled) >= 1500 * 5 // 300, len(recycled)  # ~every 50 steps: 250 MiB of 5 MiB steps
        assert all(failure.env_ids == (0, 1) for failure in recycled)
        assert most_mb < limit_mb + 5  # read after every step: never a step past the limit
    assert start_mb is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", WORKER_BACKENDS, indirect=True)
def test_a_worker_past_its_steps_is_replaced_and_its_envs_answer_as_rebuilt(make_penv, backend):
    penv = make_penv([functools.partial(LeakyEnv, tag=i, episode_length=1000) for i in range(4)],
                     asynchronous="restart", recycle=Recycling(steps=3), max_restarts=0)
    penv.reset(seed=0)
    counts = []
    for _ in range(5):
        obs, _, _, truncated, info = penv.step([1, 1, 1, 1])
        counts.append(obs[:, 1].tolist())
        if len(counts) == 4:
            assert truncated.all() and info["_worker_restarted"].all()
            assert info["failure"][0].kind == WORKER_RECYCLED
    assert counts == [[1] * 4, [2] * 4, [3] * 4, [0] * 4, [1] * 4]  # replaced after step 3, cut at step 4
    assert {failure.kind for failure in penv.failures} == {WORKER_RECYCLED}  # no restart budget spent


@pytest.mark.timeout(120)
def test_a_worker_with_a_call_under_way_is_recycled_once_it_has_none(no_leaks):
    with ParallelEnv([functools.partial(LeakyEnv, tag=i, episode_length=1000) for i in range(2)],
                     para_mode="subproc", num_workers=1, recycle=Recycling(steps=2)) as penv:
        penv.reset(seed=0)
        penv.step([0, 0])
        penv.send([0], id=[0])
        penv.send([0], id=[1])
        obs, *_ = penv.recv(wait_num=2)  # env 0 reached 2 steps while env 1's step was under way, or both came
        penv.step([0, 0])
        assert [failure.kind for failure in penv.failures] == [WORKER_RECYCLED]
        assert obs[:, 1].tolist() == [2, 2]


@pytest.mark.parametrize("bad", [dict(), dict(steps=0), dict(steps=2.5), dict(seconds=-1), dict(memory_mb=True)])
def test_bad_recycling_limits_are_refused(bad):
    with pytest.raises(ValueError, match="Recycling"):
        Recycling(**bad)


@pytest.mark.parametrize("para_mode", ["dummy"])
def test_backends_without_workers_refuse_recycling(no_leaks, para_mode):
    with pytest.raises(ValueError, match="recycle=.*no worker"):
        ParallelEnv([functools.partial(LeakyEnv, tag=0)], para_mode=para_mode, recycle=Recycling(steps=10))
