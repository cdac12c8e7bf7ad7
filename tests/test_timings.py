"""Where the time goes: ParallelEnv(stats=True), penv.stats(), and a collection's policy, envs and transport.

Every backend: a straggler named and its step time measured where it runs,
the caller's parts adding up to its wall time, windows, and stats off
measuring nothing. The rollout worker and the pool say whether a
collection is policy-bound or env-bound.
"""

from __future__ import annotations

import io
import os
import signal
import time

import numpy as np
import pytest
from conftest import HAS_TORCH
from envs import DelayEnv

from parallelenv import ParallelEnv
from parallelenv.rollout import VecWorker
from parallelenv.timing import Histogram
from parallelenv.timing.live import LiveLine

pytestmark = pytest.mark.timeout(180)

NUM_ENVS = 8
SLOW_ENV = 5
SLEEP_S = 0.005
SLOW_SLEEP_S = 10 * SLEEP_S


def sleepy_envs() -> list:
    return [lambda tag=tag: DelayEnv(tag, SLOW_SLEEP_S if tag == SLOW_ENV else SLEEP_S) for tag in range(NUM_ENVS)]


def stepped(penv, steps: int) -> None:
    penv.reset(seed=0)
    for _ in range(steps):
        penv.step(np.zeros(NUM_ENVS, dtype=np.int64))


def test_the_straggler_is_named_with_its_step_time_where_it_runs(backend, make_penv):
    if backend == "tensor":
        pytest.skip("the tensor backend's envs are rows of one batch: none is slower than another")
    penv = make_penv(sleepy_envs(), stats=True)
    stepped(penv, 12)
    stats = penv.stats()
    assert stats.stragglers == (SLOW_ENV,)
    slow = stats.envs[SLOW_ENV]
    assert slow.step["count"] == 12 and slow.reset["count"] == 1
    # A sleep never wakes early; within 10% above it (a busy machine wakes a process late).
    assert SLOW_SLEEP_S * 0.98 <= slow.step["p50"] <= SLOW_SLEEP_S * 1.1, slow.step
    assert all(env.step["p50"] < slow.step["p50"] / 3 for env in stats.envs if env.env_id != SLOW_ENV)
    assert stats.env_steps == NUM_ENVS * 12 and stats.caller.batch_steps == 12


def test_the_callers_parts_add_up_to_its_wall_time(backend, make_penv):
    penv = make_penv(sleepy_envs(), stats=True)  # the tensor twin is a batch of counting envs: no sleep
    stepped(penv, 10)
    caller = penv.stats().caller
    parts = caller.per_batch_step()
    assert caller.batch_steps == 10
    assert min(parts.values()) >= 0, parts
    total = parts["own"] + parts["send"] + parts["wait"] + parts["merge"]
    assert total == pytest.approx(parts["wall"], rel=0.1), parts
    if backend != "tensor":  # the envs' sleeps are the wait
        assert parts["wait"] >= SLOW_SLEEP_S and caller.share < 0.5


def test_a_recent_window_counts_only_what_came_after_the_previous_one(make_penv):
    penv = make_penv(sleepy_envs()[:2], stats=True)
    penv.reset(seed=0)
    for _ in range(3):
        penv.step(np.zeros(2, dtype=np.int64))
    assert penv.stats(recent=True).env_steps == 6
    for _ in range(2):
        penv.step(np.zeros(2, dtype=np.int64))
    recent, run = penv.stats(recent=True), penv.stats()
    assert (recent.env_steps, recent.caller.batch_steps) == (4, 2)
    assert (run.env_steps, run.caller.batch_steps) == (10, 5)
    penv.reset_stats()
    assert penv.stats().env_steps == 0 and penv.stats(recent=True).caller.batch_steps == 0


def test_stats_off_measure_nothing_and_say_how_to_turn_them_on(make_penv):
    penv = make_penv(sleepy_envs()[:2])
    penv.reset(seed=0)
    assert penv._caller_clock is None and penv.get_env_attr("__parallelenv_times__") == [None, None]
    with pytest.raises(RuntimeError, match="stats=True"):
        penv.stats()


def test_a_bad_stats_option_is_refused_before_anything_starts(no_leaks):
    with pytest.raises(ValueError, match="stats='yes'; use False"):
        ParallelEnv(sleepy_envs()[:2], para_mode="subproc", stats="yes")


def test_to_dict_is_flat_names_and_numbers(backend, make_penv):
    penv = make_penv(sleepy_envs()[:2], stats=True)
    stepped_steps = 3
    penv.reset(seed=0)
    for _ in range(stepped_steps):
        penv.step(np.zeros(2, dtype=np.int64))
    flat = penv.stats().to_dict()
    assert all(isinstance(key, str) and isinstance(value, (int, float)) for key, value in flat.items())
    assert flat["env/1/step_count"] == stepped_steps and flat["caller/batch_steps"] == stepped_steps
    assert flat["env/1/step_p50_ms"] >= (SLEEP_S * 1e3 * 0.98 if backend != "tensor" else 0)  # a twin never sleeps
    assert "stragglers" in flat and "worker/0/busy" in flat


@pytest.mark.timeout(120)
def test_a_restarted_workers_envs_start_a_history_of_their_own_and_stats_survive(no_leaks):
    with ParallelEnv(sleepy_envs()[:4], para_mode="subproc", num_workers=2, stats=True,
                     on_worker_failure="restart", asynchronous="restart") as penv:
        stepped_actions = np.zeros(4, dtype=np.int64)
        penv.reset(seed=0)
        for _ in range(3):
            penv.step(stepped_actions)
        os.kill(penv.backend.pids()[1], signal.SIGKILL)
        for _ in range(4):
            penv.step(stepped_actions)  # the kill is seen, the worker replaced, the step goes on
        stats = penv.stats()
    lost, kept = stats.envs[2], stats.envs[0]
    assert lost.restarts == 1 and "since its host started" in lost.history and lost.step["count"] < 7
    assert kept.restarts == 0 and kept.history == "whole window" and kept.step["count"] == 7


def test_the_live_line_writes_on_a_terminal_only(make_penv):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    penv = make_penv(sleepy_envs()[:2], stats=True)
    penv.reset(seed=0)
    terminal, log = Terminal(), io.StringIO()
    lines = [LiveLine(penv, every_s=0.0, stream=terminal), LiveLine(penv, every_s=0.0, stream=log)]
    penv._caller_clock.after_step = lambda: [line.after_step() for line in lines]
    for _ in range(3):
        penv.step(np.zeros(2, dtype=np.int64))
    assert terminal.getvalue().count("\r") == 3 and "env-steps/s" in terminal.getvalue()
    assert log.getvalue() == ""
    assert penv.stats(recent=True).caller.batch_steps == 3  # the live line reads a window of its own


def test_a_live_line_that_fails_turns_itself_off_and_the_step_goes_on(make_penv):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            raise OSError("the terminal went away")

    penv = make_penv(sleepy_envs()[:2], stats=True)
    penv.reset(seed=0)
    line = LiveLine(penv, every_s=0.0, stream=Terminal())
    penv._caller_clock.after_step = line.after_step
    with pytest.warns(RuntimeWarning, match="the live line is off: OSError"):
        penv.step(np.zeros(2, dtype=np.int64))
    penv.step(np.zeros(2, dtype=np.int64))
    assert not line.on


def test_a_histograms_percentiles_are_within_a_bin():
    histogram = Histogram()
    for value in np.linspace(0.001, 0.100, 1000):
        histogram.add(float(value))
    assert histogram.percentile(50) == pytest.approx(0.0505, rel=0.02)
    assert histogram.percentile(99) == pytest.approx(0.099, rel=0.02)
    assert histogram.largest == pytest.approx(0.1) and histogram.count == 1000
    earlier = histogram.copy()
    histogram.add(1.0)
    window = histogram.since(earlier)
    assert window.count == 1 and window.percentile(50) == pytest.approx(1.0, rel=0.02)


# ------------------------------------------------------------------ policy-bound or env-bound


def sleeping_policy(seconds: float):
    def act(obs):
        time.sleep(seconds)
        return np.zeros(len(obs), dtype=np.int64)

    return act


@pytest.mark.parametrize(("policy_s", "env_s", "bound"), [(0.005, 0.001, "policy"), (0.001, 0.005, "envs")])
def test_a_vecworker_says_whether_its_collection_is_policy_bound_or_env_bound(policy_s, env_s, bound, no_leaks):
    envs = [lambda tag=tag: DelayEnv(tag, env_s) for tag in range(2)]
    with VecWorker(ParallelEnv(envs, para_mode="subproc", asynchronous="restart", stats=True),
                   sleeping_policy(policy_s), seed=0) as worker:
        worker.collect(20)
        times = worker.timings()
    assert times.bound == bound and times.verdict().startswith(f"{bound}-bound")
    assert times.batch_steps == 20 and times.policy_s >= 20 * policy_s
    assert times.speedup_if_faster(bound) > times.speedup_if_faster("envs" if bound == "policy" else "policy")


@pytest.mark.skipif(not HAS_TORCH, reason="the pool's workers load torch policies")
@pytest.mark.parametrize(("policy_s", "env_s", "bound"), [(0.005, 0.001, "policy"), (0.001, 0.005, "envs")])
def test_a_pool_says_whether_its_collections_are_policy_bound_or_env_bound(policy_s, env_s, bound, no_leaks):
    from parallelenv.pool import RolloutPool

    envs = [lambda tag=tag: DelayEnv(tag, env_s) for tag in range(2)]  # an env per worker
    with RolloutPool(envs, sleeping_policy(policy_s), num_workers=2, stats=True) as pool:
        pool.obtain_samples(0, num_samples=2 * 15)
        times = pool.timings()
        assert pool.timings(recent=True).batch_steps == 30
        assert pool.timings(recent=True).batch_steps == 0
    assert times.bound == bound and times.batch_steps == 30 and "-bound" in times.verdict(), times.verdict()


def test_a_vecworker_without_stats_says_how_to_measure(no_leaks):
    with VecWorker(ParallelEnv(sleepy_envs()[:2], asynchronous="restart"), sleeping_policy(0.0)) as worker:
        worker.collect(2)
        with pytest.raises(RuntimeError, match="stats=True"):
            worker.timings()


@pytest.mark.skipif(not HAS_TORCH, reason="the tensor backend needs torch")
def test_the_tensor_backend_times_each_batch_step_on_its_device(no_leaks):
    with ParallelEnv.make("CartPole-v1", num_envs=64, para_mode="tensor", device="cpu", stats=True) as penv:
        penv.reset(seed=0)
        for _ in range(5):
            penv.step(penv.action_space.sample())
        stats = penv.stats()
    assert [env.step["count"] for env in stats.envs] == [5] * 64 and stats.stragglers == ()
    assert stats.envs[0].host == "the caller's cpu" and stats.envs[0].step["p50"] > 0
    [device] = stats.workers
    assert device.env_ids == tuple(range(64)) and 0 < device.busy <= 1


@pytest.mark.timeout(120)
def test_a_recycled_workers_envs_start_a_history_of_their_own(no_leaks):
    from parallelenv import Recycling

    with ParallelEnv(sleepy_envs()[:4], para_mode="subproc", num_workers=2, stats=True, asynchronous="restart",
                     recycle=Recycling(steps=5)) as penv:
        penv.reset(seed=0)
        for _ in range(8):
            penv.step(np.zeros(4, dtype=np.int64))
        stats = penv.stats()
    for env in stats.envs:
        assert env.restarts >= 1 and env.history.startswith("since its host started"), env
        assert 0 < env.step["count"] < 8
