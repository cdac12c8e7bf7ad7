"""send/recv: EnvPool-style asynchronous stepping, on every backend.

Delays are ~100x apart (fast envs answer at once, slow ones in seconds) and
the assertions are about *which* envs answered, never how fast. A backend
that runs its envs in the caller (it started no process) runs a call whole,
so every env of a send is ready at once; the assertions below hold for both
kinds of backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from envs import DelayEnv, counting

from parallelenv import AlreadyPendingError, NoPendingCallError

FAST, SLOW = 0.0, 1.5


def delay_envs(delays: list[float]) -> list:
    return [lambda tag=tag, delay=delay: DelayEnv(tag, delay) for tag, delay in enumerate(delays)]


def env_ids(info: dict) -> list[int]:
    return info["env_id"].tolist()


def in_caller(penv) -> bool:
    return not penv.backend.pids()


def test_send_then_recv_returns_every_env_in_send_order(make_penv):
    penv = make_penv([counting(tag, 9) for tag in range(4)])
    penv.reset(seed=0)
    penv.send([1, 2], id=[3, 1])
    penv.send([3], id=[0])
    obs, reward, terminated, truncated, info = penv.recv()
    assert env_ids(info) == [3, 1, 0]
    np.testing.assert_array_equal(obs[:, 0], [3, 1, 0])
    np.testing.assert_array_equal(obs[:, 2], [1, 2, 3])
    assert info["_env_id"].all() and reward.shape == (3,)
    with pytest.raises(NoPendingCallError):
        penv.recv()


@pytest.mark.timeout(60)
def test_recv_wait_num_returns_the_envs_that_are_ready(make_penv):
    # Two workers: envs 0-1 (fast) on one, envs 2-3 (slow) on the other.
    penv = make_penv(delay_envs([FAST, FAST, SLOW, SLOW]))
    penv.reset(seed=0)
    penv.send([1, 1, 1, 1])
    first = penv.recv(wait_num=2)
    first_ids = env_ids(first[4])
    assert len(first_ids) >= 2
    if not in_caller(penv):
        assert first_ids == [0, 1]
    rest = penv.recv() if len(first_ids) < 4 else None
    answered = first_ids + (env_ids(rest[4]) if rest else [])
    assert sorted(answered) == [0, 1, 2, 3]  # each env exactly once: nothing lost, nothing twice
    assert penv.get_env_attr("step_calls") == [1, 1, 1, 1]


@pytest.mark.timeout(60)
def test_recv_timeout_returns_what_is_ready_and_keeps_the_rest(make_penv):
    penv = make_penv(delay_envs([FAST, FAST, SLOW, SLOW]))
    penv.reset(seed=0)
    penv.send([1, 2], id=[2, 3])
    obs, reward, terminated, truncated, info = penv.recv(wait_num=2, timeout=0.01)
    if not in_caller(penv):
        assert obs.shape == (0, 4) and reward.shape == (0,) and env_ids(info) == []
    later = penv.recv(align="batch") if not in_caller(penv) else []
    answered = env_ids(info) + [result[4]["env_id"] for result in later]
    assert sorted(answered) == [2, 3]
    assert penv.get_env_attr("step_calls") == [0, 0, 1, 1]


def test_k_of_n_loop_loses_no_result(make_penv):
    penv = make_penv(delay_envs([FAST, 0.01, FAST, 0.01, FAST, 0.01]))
    penv.reset(seed=0)
    received = np.zeros(6, dtype=int)
    penv.send(np.ones(6, dtype=int))
    for _ in range(30):
        *_, info = penv.recv(wait_num=3)
        ids = info["env_id"]
        received[ids] += 1
        penv.send(np.ones(len(ids), dtype=int), id=ids)
    *_, info = penv.recv()
    received[info["env_id"]] += 1
    assert penv.get_env_attr("step_calls") == received.tolist()


@pytest.mark.timeout(60)
def test_lockstep_steps_after_a_partial_recv_get_every_result(make_penv):
    # On subproc a step of every env sleeps until its last worker answers; a
    # recv of only some of them in between must not leave it waiting for a
    # wake-up that was already taken, nor take a stale one for the answer.
    penv = make_penv(delay_envs([FAST, FAST, 0.05, 0.05]))
    penv.reset(seed=0)
    penv.send([1, 1, 1, 1])
    *_, info = penv.recv(wait_num=2)
    early = env_ids(info)
    penv.send(np.ones(len(early), dtype=int), id=early)
    *_, info = penv.recv()
    assert sorted(early + env_ids(info)) == sorted([0, 1, 2, 3] + early)
    for _ in range(3):
        obs, *_ = penv.step([1, 1, 1, 1])
        np.testing.assert_array_equal(obs[:, 0], [0, 1, 2, 3])
    expected = [5 if i in early else 4 for i in range(4)]
    assert penv.get_env_attr("step_calls") == expected


def test_misuse_raises_typed_errors(make_penv):
    penv = make_penv([counting(tag, 9) for tag in range(3)])
    penv.reset(seed=0)
    with pytest.raises(NoPendingCallError):
        penv.recv()
    penv.send([1], id=[1])
    with pytest.raises(AlreadyPendingError, match=r"\[1\]"):
        penv.send([1, 1], id=[0, 1])
    with pytest.raises(AlreadyPendingError):
        penv.step([1, 1, 1])
    with pytest.raises(AlreadyPendingError):
        penv.reset(id=[1])
    with pytest.raises(ValueError, match="wait_num"):
        penv.recv(wait_num=2)
    penv.step([1, 1], id=[0, 2])  # envs not pending can still be stepped
    *_, info = penv.recv()
    assert env_ids(info) == [1]


def test_idle_policy_answers_finished_envs_at_once(make_penv):
    penv = make_penv([counting(0, 1), counting(1, 9)], asynchronous="idle")
    penv.reset(seed=0)
    penv.step([1, 1])
    penv.send([1, 1])
    obs, reward, terminated, truncated, info = penv.recv()
    assert info["idle"].tolist() == [True, False] and terminated[0] and reward[0] == 0
    assert penv.get_env_attr("step_calls") == [1, 2]


def test_step_results_carry_no_env_id(make_penv):
    penv = make_penv([counting(tag, 9) for tag in range(2)])
    penv.reset(seed=0)
    *_, info = penv.step([1, 1])
    assert "env_id" not in info
