"""The subproc backend's counted steps (see parallelenv.backends.subproc.countdown).

A ``step()`` of every env, with a worker per core, sleeps until the last worker
counts down; a worker with no info to send answers through the countdown
alone and writes nothing to its pipe. ``step()`` says so with the step
(``Step.awaited``); ``send()`` does not, whatever the caller's recv waits for.
These tests look at the backend's countdown (``SubprocBackend.countdown``) and
at what it tells its workers on purpose: what they guard against is a parent
that sleeps on the wrong thing, which no result of a step shows.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import host_of, slowness
from envs import BagSpace, DelayEnv, EchoEnv, FaultyEnv, ReadOnlyHere, StallingEnv, counting

from parallelenv import EnvError, WorkerDiedError
from parallelenv.backends.base import available_cpus
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.counted import CountedSteps

pytestmark = [
    pytest.mark.parametrize("backend", ["subproc"]),
    pytest.mark.skipif(available_cpus() < 2, reason="steps are counted only with a core per worker"),
]


def test_steps_of_every_env_are_counted(make_penv):
    penv = make_penv([counting(tag, 9) for tag in range(4)])
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])  # the first one already: count 1, no infos, so both workers answer quietly
    countdown = penv.backend.countdown
    assert countdown.answered_quietly(0) and countdown.answered_quietly(1)


@pytest.mark.timeout(60)
def test_a_stray_wake_up_does_not_end_a_counted_step_early(make_penv):
    # A wake-up byte left over from an earlier step (its wait timed out just
    # as the last worker counted down) must not pass for this step's: worker 1
    # answers quietly, later, and nothing would tell a parent woken too early.
    penv = make_penv([lambda: DelayEnv(0, 0.0), lambda: DelayEnv(1, 0.3)])
    penv.reset(seed=0)
    penv.step([1, 1])
    stray = penv.backend.countdown.for_worker(0)
    stray.attach()
    stray.wake()  # as if worker 0 had been the last of an earlier step
    obs, *_ = penv.step([1, 1])
    np.testing.assert_array_equal(obs[:, :2], [[0, 2], [1, 2]])  # tag, count
    assert penv.get_env_attr("step_calls") == [2, 2]


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


@pytest.fixture
def counted_told(monkeypatch):
    """Per message the backend makes, whether it tells the worker the step is counted: the messages
    it encodes, and those of the counted steps it sends already framed (one per worker)."""
    told: list[bool] = []
    encode_call = wire.encode_call
    dispatch_counted_step = CountedSteps.dispatch

    def spy(call, group_ids, counted=False, *args):
        told.append(counted)
        return encode_call(call, group_ids, counted, *args)

    def spy_framed(counted, obs_slot):
        told.extend(True for _ in range(counted.countdown.num_workers))
        return dispatch_counted_step(counted, obs_slot)

    monkeypatch.setattr(wire, "encode_call", spy)
    monkeypatch.setattr(CountedSteps, "dispatch", spy_framed)
    return told


@pytest.mark.timeout(60)
def test_step_is_counted_and_send_is_not(make_penv, counted_told):
    penv = make_penv([counting(tag, 99) for tag in range(4)])
    penv.reset(seed=0)
    counted_told.clear()
    penv.step([1, 1, 1, 1])
    assert counted_told == [True, True]
    counted_told.clear()
    penv.send([1, 1, 1, 1])
    penv.recv()  # a recv of every env is no promise made when the step was sent
    assert counted_told == [False, False]
    counted_told.clear()
    penv.step([1, 1], id=[0, 1])  # awaited, but the countdown counts every worker
    assert counted_told == [False]
    counted_told.clear()
    penv.step([1, 1, 1, 1])
    assert counted_told == [True, True]


@pytest.mark.timeout(60)
def test_send_and_a_recv_of_some_hands_over_envs_as_they_answer(make_penv, counted_told):
    # Whatever steps came before: a whole step taken as it comes is not counted,
    # so a recv of the fast env returns without waiting for the slow one.
    penv = make_penv([lambda: DelayEnv(0, 0.0), lambda: DelayEnv(1, 0.0)])
    penv.reset(seed=0)
    for _ in range(3):
        penv.step([1, 1])
    penv.set_env_attr("delay", 1.0, id=[1])
    counted_told.clear()
    penv.send([1, 1])
    started = time.monotonic()
    *_, info = penv.recv(wait_num=1)
    assert info["env_id"].tolist() == [0]  # env 1 is still sleeping
    assert time.monotonic() - started < 0.8
    obs, *_ = penv.recv()
    assert obs[:, :2].tolist() == [[1, 4]]  # tag, count: 3 steps since the reset, then this one
    assert counted_told == [False, False]
    counted_told.clear()
    obs, *_ = penv.step([1, 1])  # counted: both come together, once the slow one has answered
    assert counted_told == [True, True]
    assert obs[:, :2].tolist() == [[0, 5], [1, 5]]


@pytest.mark.timeout(60)
def test_a_worker_that_dies_in_a_counted_step_fails_that_step(make_penv, counted_told):
    # The parent sleeps on the countdown, which the dead worker never counts
    # down: its sentinel, watched beside the countdown, ends the wait.
    penv = make_penv([counting(0, 99), counting(1, 99), lambda: FaultyEnv(2, at_step=2, how="exit"), counting(3, 99)])
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])
    counted_told.clear()
    with pytest.raises(WorkerDiedError) as caught:
        penv.step([1, 1, 1, 1])
    assert counted_told == [True, True]
    assert caught.value.env_indices == [2, 3]
    assert "exited with code 3" in caught.value.reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("last", [False, True], ids=["others still stepping", "the others done"])
def test_a_worker_killed_in_a_counted_step_is_healed_and_steps_stay_counted(make_penv, counted_told, last, tmp_path):
    # With healing on, the dead worker's envs answer the step with their new
    # episode's first obs, the live worker's with its step (awaited by its
    # finished mark, where the dead one would have been the last to count
    # down), and the steps after are counted again on fresh tokens.
    delay = 0.0 if last else 0.3
    penv = make_penv([functools.partial(StallingEnv, tag=i, delay=delay if i < 2 else 0.0) for i in range(4)],
                     asynchronous="restart", on_worker_failure="restart", max_restarts=3)
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])
    # Env 2 opens this pipe once its step has begun: the kill lands inside the counted step.
    began = tmp_path / "began"
    os.mkfifo(began)
    penv.set_env_attr("stall", str(began), id=[2])
    victim = host_of(penv.backend, 2)[0]
    killer = threading.Thread(target=lambda: (open(began).close(), os.kill(victim, signal.SIGKILL)))
    killer.start()
    counted_told.clear()
    obs, _, _, truncated, info = penv.step([1, 1, 1, 1])
    killer.join()
    assert counted_told == [True, True, False]  # the step, then the new worker's reset standing in for it
    assert obs[:, :2].tolist() == [[0, 2], [1, 2], [2, 0], [3, 0]]  # tag, count: 2 and 3 begin again
    assert truncated.tolist() == [False, False, True, True]
    assert info["_worker_restarted"].tolist() == [False, False, True, True]
    for count in range(1, 4):
        counted_told.clear()
        obs, *_ = penv.step([1, 1, 1, 1])
        assert counted_told == [True, True]
        assert obs[:, 1].tolist() == [2 + count, 2 + count, count, count]
    assert len(penv.failures) == 1 and penv.failures[0].env_ids == (2, 3)


@pytest.mark.timeout(120)
def test_a_leader_of_the_wake_up_tree_killed_in_a_step_leaves_no_worker_asleep(make_penv, tmp_path):
    # Past 8 workers the step reaches most workers through a few leaders
    # (here 0, 4 and 8 of 12); one killed in a step is replaced, and every
    # worker steps every step after.
    penv = make_penv([functools.partial(StallingEnv, tag=i) for i in range(12)], num_workers=12,
                     asynchronous="restart", on_worker_failure="restart", max_restarts=3)
    penv.reset(seed=0)
    penv.step([1] * 12)
    began = tmp_path / "began"
    os.mkfifo(began)
    penv.set_env_attr("stall", str(began), id=[4])
    victim = host_of(penv.backend, 4)[0]
    killer = threading.Thread(target=lambda: (open(began).close(), os.kill(victim, signal.SIGKILL)))
    killer.start()
    obs, _, _, truncated, _ = penv.step([1] * 12)
    killer.join()
    assert obs[:, 1].tolist() == [2] * 4 + [0] + [2] * 7
    assert truncated.tolist() == [False] * 4 + [True] + [False] * 7
    for count in range(1, 4):
        obs, *_ = penv.step([1] * 12)
        assert obs[:, 1].tolist() == [2 + count] * 4 + [count] + [2 + count] * 7


@pytest.mark.timeout(60)
def test_without_futexes_counted_steps_go_to_each_pipe(make_penv, counted_told, monkeypatch):
    # Where the futex call is not there (not Linux), a counted step is written
    # to every worker's pipe, and the workers sleep on their pipes.
    from parallelenv.backends.subproc import futex

    monkeypatch.setattr(futex, "AVAILABLE", False)
    penv = make_penv([counting(tag, 99) for tag in range(4)])
    assert not penv.backend.countdown.broadcasts
    penv.reset(seed=0)
    for count in range(1, 4):
        counted_told.clear()
        obs, *_ = penv.step([1, 1, 1, 1])
        assert counted_told == [True, True]
        assert obs[:, 1].tolist() == [count] * 4


@pytest.mark.timeout(120)
def test_workers_last_told_on_their_pipes_take_the_next_whole_step_there(make_penv):
    # A worker whose last call came on its pipe (a reset, a send of some envs) waits on its pipe, not on
    # the countdown's words, as the parent records: a futex wake-up of many workers cost a caller busy
    # with its policy more than writing to their pipes. The next step of every env is then written to
    # those pipes, and a leader of the wake-up tree (0, 4 and 8 of 12) that gets it there wakes the
    # workers after it, which wait on the words: each env steps once a call, none waits for a nap.
    penv = make_penv([counting(tag, 999) for tag in range(12)], num_workers=12)
    waits_on_pipe = lambda: [penv.backend.counted.waits_on_pipe(penv.backend.worker(i)) for i in range(12)]  # noqa: E731
    penv.reset(seed=0)
    assert waits_on_pipe() == [True] * 12
    obs, *_ = penv.step([1] * 12)  # written to every pipe
    assert waits_on_pipe() == [False] * 12
    counts = np.ones(12, dtype=int)
    for ids in ([0, 4, 8], [1, 2, 3, 5, 6, 7, 9, 10, 11], [4], list(range(12)), [11]):
        obs, *_ = penv.step([1] * len(ids), id=ids)  # awaited; of some envs, it goes on their workers' pipes
        counts[ids] += 1
        assert waits_on_pipe() == [i in ids and len(ids) < 12 for i in range(12)]  # all of them: counted
        began = time.monotonic()
        obs, *_ = penv.step([1] * 12)
        counts += 1
        # Nothing slept through it: a worker the step did not reach would look again only after a 1 s nap.
        assert time.monotonic() - began < 0.5 * slowness()
        assert obs[:, 1].tolist() == counts.tolist()
        assert waits_on_pipe() == [False] * 12


@pytest.mark.timeout(60)
def test_a_counted_step_a_worker_cannot_read_fails_its_envs_at_once(make_penv, counted_told):
    # Actions of no fixed shape travel in the step's messages; one the worker cannot unpickle fails its
    # group's envs. The parent waits on the countdown for a counted step, so that answer must come
    # there too, or it would wait for call_timeout (by default, for ever).
    penv = make_penv([functools.partial(EchoEnv, BagSpace(), tag) for tag in range(4)], num_workers=2)
    penv.reset(seed=0)
    counted_told.clear()
    began = time.monotonic()
    with pytest.raises(EnvError) as caught:
        penv.step([[1], [ReadOnlyHere(2)], [1], [3]])
    assert counted_told == [True, True]
    assert time.monotonic() - began < 5 * slowness()
    assert sorted(caught.value.failed_env_ids) == [0, 1]  # the unreadable message was env 0 and 1's worker's
    assert "the worker could not read the call" in str(caught.value) and "can be read only in" in str(caught.value)
    obs, *_ = penv.step([[1], [2], [1], [3]])  # the next step is counted again and answered by all
    assert counted_told[-2:] == [True, True] and obs[1] == [2]
