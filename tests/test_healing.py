"""Surviving failures: on_worker_failure / on_env_error = "restart".

The soak drives :class:`envs.SoakEnv`, whose actions inject faults, and
checks every step against a fault-free run of the same envs with the same
seeds and actions (an env is compared until its first rebuild, after which
its new episodes are checked to count on without a gap), the failure log
against the faults injected, and processes, threads, descriptors and
shared memory against what there was before.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_ready

import numpy as np
import pytest
from conftest import HAS_RAY, TESTS_DIR, host_of, live_children, our_segments
from envs import DelayEnv, FaultyEnv, SoakEnv, StallingEnv, counting

from parallelenv import ParallelEnv, WorkerDiedError
from parallelenv.healing import ENV_ERROR, WORKER_DIED, WORKER_HUNG

FAULTS = ("step raises", "reset raises", "exits", "killed", "hangs")
ACTION_OF = {"step raises": SoakEnv.STEP_RAISES, "reset raises": SoakEnv.NEXT_RESET_RAISES,
             "exits": SoakEnv.EXITS, "hangs": SoakEnv.HANGS}
KIND_OF = {"step raises": ENV_ERROR, "reset raises": ENV_ERROR, "exits": WORKER_DIED, "killed": WORKER_DIED,
           "hangs": WORKER_HUNG}


@dataclass(frozen=True)
class Fault:
    step: int
    env_id: int
    what: str


def fault_plan(num_steps: int, num_faults: int, num_envs: int, seed: int) -> dict[int, Fault]:
    """``num_faults`` faults at distinct random steps, every kind equally often, from a seeded RNG."""
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.choice(np.arange(5, num_steps), size=num_faults, replace=False))
    kinds = [FAULTS[i % len(FAULTS)] for i in range(num_faults)]
    rng.shuffle(kinds)
    return {int(t): Fault(int(t), int(rng.integers(num_envs)), what) for t, what in zip(steps, kinds, strict=True)}


def resources() -> tuple[set[int], int, int, set[str]]:
    return {p.pid for p in live_children()}, threading.active_count(), len(os.listdir("/proc/self/fd")), our_segments()


def soak(para_mode: str, num_steps: int, num_faults: int, call_timeout: float, **options) -> list:
    num_envs = 8
    plan = fault_plan(num_steps, num_faults, num_envs, seed=num_steps)
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 5, size=(num_steps, num_envs))
    factories = [functools.partial(SoakEnv, tag=i) for i in range(num_envs)]
    reference = ParallelEnv(factories, asynchronous="restart")
    penv = ParallelEnv(factories, para_mode=para_mode, asynchronous="restart", on_worker_failure="restart",
                       on_env_error="restart", max_restarts=10 * num_faults, call_timeout=call_timeout, **options)
    try:
        hosts = [host_of(penv.backend, e)[0] for e in range(num_envs)]  # a worker, or an actor
        workmates = {e: [i for i in range(num_envs) if hosts[i] == hosts[e]] for e in range(num_envs)}
        expected_log = []
        ref_obs, _ = reference.reset(seed=7)
        obs, _ = penv.reset(seed=7)
        np.testing.assert_array_equal(obs, ref_obs)
        rebuilt_ever = np.zeros(num_envs, dtype=bool)
        for t in range(num_steps):
            step_actions = actions[t].copy()
            fault = plan.get(t)
            restarted = set()
            if fault is not None:
                if fault.what == "killed":
                    os.kill(host_of(penv.backend, fault.env_id)[0], signal.SIGKILL)
                else:
                    step_actions[fault.env_id] = ACTION_OF[fault.what]
                on_worker = KIND_OF[fault.what] != ENV_ERROR
                restarted = set(workmates[fault.env_id]) if on_worker else {fault.env_id}
                expected_log.append((KIND_OF[fault.what], tuple(sorted(restarted))))
            previous = obs
            obs, reward, terminated, truncated, info = penv.step(step_actions)
            ref = reference.step(actions[t])
            flags = info.get("_worker_restarted", np.zeros(num_envs, bool)) | info.get("_env_restarted",
                                                                                     np.zeros(num_envs, bool))
            assert set(np.flatnonzero(flags).tolist()) == restarted, (t, fault)
            # A rebuilt env's step ended no episode of its own: no last obs, whatever its row held before.
            ended = info.get("_ended_state", np.zeros(num_envs, bool))
            ref_ended = ref[4].get("_ended_state", np.zeros(num_envs, bool))
            for e in range(num_envs):
                assert ended[e] == (terminated[e] if rebuilt_ever[e] or e in restarted else ref_ended[e]), (t, e)
                if e in restarted:
                    assert truncated[e] and not terminated[e] and reward[e] == 0, (t, e)
                    assert obs[e][0] == e and obs[e][1] == 0, (t, e, obs[e])
                    rebuilt_ever[e] = True
                elif not rebuilt_ever[e]:  # as if nothing had happened
                    for got, want in zip((obs, reward, terminated, truncated), ref[:4], strict=True):
                        assert np.array_equal(got[e], want[e]), (t, e, got[e], want[e])
                else:  # a rebuilt env's episodes count on, one step at a time
                    count = previous[e][1]
                    assert obs[e][1] == (0 if terminated[e] else count + 1) and obs[e][0] == e, (t, e)
                    assert terminated[e] == (count + 1 == 3), (t, e)
        log = [(failure.kind, failure.env_ids) for failure in penv.failures]
        assert log == expected_log
        return penv.failures
    finally:
        penv.close()
        reference.close()


def check_soak(para_mode: str, num_steps: int, num_faults: int, call_timeout: float, **options) -> None:
    # A ParallelEnv first, so that what lives for the whole session (the
    # forkserver, the resource tracker) is running before the count.
    ParallelEnv([counting(0)], para_mode=para_mode).close()
    children, threads, fds, segments = resources()
    soak(para_mode, num_steps, num_faults, call_timeout, **options)
    leaked = [p for p in live_children() if p.pid not in children]
    assert not leaked, leaked
    assert our_segments() == segments
    assert threading.active_count() <= threads
    assert len(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.timeout(120)
def test_a_short_soak_on_subproc_survives_every_kind_of_fault():
    check_soak("subproc", num_steps=1_500, num_faults=10, call_timeout=2.0, num_workers=4)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_the_soak_on_subproc_survives_sixty_faults_in_twenty_thousand_steps():
    check_soak("subproc", num_steps=20_000, num_faults=60, call_timeout=2.0, num_workers=4)


needs_ray = pytest.mark.skipif(not HAS_RAY, reason="needs ray (pip install -e '.[ray]')")


@needs_ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("para_mode, options", [("ray", {}), ("ray-subproc", {"num_actors": 2, "num_workers_per_actor": 2})])
def test_a_soak_on_ray_survives_every_kind_of_fault(ray_session, para_mode, options):
    failures = soak(para_mode, num_steps=120, num_faults=5, call_timeout=5.0, **options)
    assert {failure.kind for failure in failures} == {ENV_ERROR, WORKER_DIED, WORKER_HUNG}


@needs_ray
@pytest.mark.timeout(120)
def test_a_killed_ray_actor_is_replaced(ray_session):
    with ParallelEnv([counting(i, 1000) for i in range(4)], para_mode="ray-subproc", num_actors=2,
                     num_workers_per_actor=1, on_worker_failure="restart") as penv:
        penv.reset(seed=0)
        actor_pid = penv.backend.pids()[0]  # the first actor, hosting envs 0 and 1
        os.kill(actor_pid, signal.SIGKILL)
        obs, _, _, truncated, info = penv.step([0, 0, 0, 0])
        assert info["_worker_restarted"].tolist() == [True, True, False, False]
        assert truncated.tolist() == [True, True, False, False]
        assert obs[:, 1].tolist() == [0, 0, 1, 1]
        assert actor_pid not in penv.backend.pids()
        assert penv.failures[0].env_ids == (0, 1)


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_envs_of_a_lost_ray_node_are_rebuilt_on_the_surviving_nodes():
    """A head and two worker nodes (ray.cluster_utils.Cluster), in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)])}
    done = subprocess.run([sys.executable, str(TESTS_DIR / "ray_multinode.py"), "ray-subproc", "restart"], env=env,
                          capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-4000:]
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["expected"] and seen["restarted"] == seen["expected"], seen
    assert seen["raised"] is None, seen
    assert seen["doomed"] not in seen["nodes_after"], seen
    assert seen["closed"], seen


# ----------------------------------------------------------------- deaths at awkward moments

WORKER_BACKENDS = ("subproc", "ray", "ray-subproc")


def answered_once(previous: list[int], obs: np.ndarray, truncated: np.ndarray, info: dict,
                  action: int | None = None) -> list[int]:
    """Check one step's results against the counts before it: each env either counted on by one with
    this step's ``action`` (an answer to an earlier step would carry that step's), or was rebuilt (a
    new episode's first obs, cut, flagged), and is itself (its tag); the counts after it."""
    restarted = info.get("_worker_restarted", np.zeros(len(previous), dtype=bool))
    for j, count in enumerate(obs[:, 1].astype(int).tolist()):
        assert obs[j, 0] == j, (j, obs[j])
        if restarted[j]:
            assert count == 0 and truncated[j], (j, count, previous[j])
        else:
            assert count == previous[j] + 1 and not truncated[j], (j, count, previous[j])
            assert action is None or obs[j, 2] == action, (j, obs[j], action)
    return obs[:, 1].astype(int).tolist()


@pytest.mark.timeout(60)
def test_an_answer_written_before_its_worker_is_killed_answers_its_step_once(no_leaks):
    """The answer is in the pipe when the worker dies: recv reads it and the death in one poll."""
    with ParallelEnv([counting(i, 1000) for i in range(4)], para_mode="subproc", num_workers=2,
                     asynchronous="restart", on_worker_failure="restart") as penv:
        penv.reset(seed=0)
        counts = [0] * 4
        penv.send([1] * 4)
        worker = penv.backend.worker(1)  # hosting envs 2 and 3
        assert worker.conn.poll(30), "the worker never answered"  # written, not read
        os.kill(worker.pid, signal.SIGKILL)
        assert wait_for_ready([worker.process.sentinel], 30), "the killed worker did not end"
        for action in range(2, 7):
            obs, _, _, truncated, info = penv.recv()
            counts = answered_once(counts, obs[np.argsort(info["env_id"])], truncated[np.argsort(info["env_id"])],
                                   {key: value[np.argsort(info["env_id"])] for key, value in info.items()},
                                   (action - 1) % 5)
            penv.send([action % 5] * 4)
        penv.recv()
        assert penv.get_env_attr("count") == [count + 1 for count in counts]
        assert len(penv.failures) == 1 and penv.failures[0].env_ids == (2, 3)


@needs_ray
@pytest.mark.timeout(120)
@pytest.mark.parametrize("killed", ["before its answer", "after its answer"])
@pytest.mark.parametrize("backend", ["ray", "ray-subproc"], indirect=True)
def test_answers_read_with_an_actors_death_answer_their_step_once(make_penv, backend, killed):
    """Env 3's actor dies before its answer (one collect then reads the others' answers and the
    death together) or just after it (the answer is ready, the death seen a step later): each
    env's step is answered once, then every later step in turn."""
    penv = make_penv([functools.partial(StallingEnv, tag=i) for i in range(4)], asynchronous="restart",
                     on_worker_failure="restart")
    penv.reset(seed=0)
    host = host_of(penv.backend, 3)[0]
    if killed == "before its answer":
        penv.set_env_attr("stall", True, id=[3])
    penv.send([1] * 4)
    import ray

    under_way = penv.backend.calls_under_way()
    doomed = {ref for ref, env_ids in under_way if 3 in env_ids}
    awaited = [ref for ref, _ in under_way if (ref in doomed) == (killed == "after its answer")]
    ready, _ = ray.wait(awaited, num_returns=len(awaited), timeout=30)
    assert len(ready) == len(awaited), "the actors never answered"
    os.kill(host, signal.SIGKILL)
    counts = [0] * 4
    for action in range(2, 7):
        obs, _, _, truncated, info = penv.recv()
        order = np.argsort(info["env_id"])
        assert info["env_id"][order].tolist() == [0, 1, 2, 3]
        counts = answered_once(counts, obs[order], truncated[order],
                               {key: value[order] for key, value in info.items()}, (action - 1) % 5)
        penv.send([action % 5] * 4)
    penv.recv()
    assert penv.get_env_attr("count") == [count + 1 for count in counts]
    assert len(penv.failures) == 1 and 3 in penv.failures[0].env_ids


# Runs of the randomised kill below: each builds a ParallelEnv, which on Ray starts six actors (~5 s
# quiet, 10 s and more at a load of 14 on 2 cores). make test runs a few; make test-long the twenty.
KILL_RUNS = [pytest.param(4, marks=pytest.mark.timeout(60 + 4 * 30), id="4 runs"),
             pytest.param(20, marks=[pytest.mark.long, pytest.mark.timeout(60 + 20 * 30)], id="20 runs")]


@pytest.mark.parametrize("runs", KILL_RUNS)
@pytest.mark.parametrize("backend", WORKER_BACKENDS, indirect=True)
def test_a_worker_killed_at_any_moment_of_a_step_answers_each_step_once(make_penv, backend, runs):
    """A thread kills a worker at a random moment of a random step; every step is answered once per env."""
    rng = np.random.default_rng(5)
    options = {"num_workers": 3} if backend == "subproc" else {}
    for run in range(runs):
        penv = make_penv([functools.partial(DelayEnv, tag=i, delay=0.002) for i in range(6)],
                         asynchronous="restart", on_worker_failure="restart", max_restarts=100, **options)
        counts = answered_once([-1] * 6, *_as_step(penv.reset(seed=run)))
        kill_at = int(rng.integers(2, 10))
        victim = host_of(penv.backend, int(rng.integers(6)))[0]
        killer = None
        for t in range(14):
            if t == kill_at:
                killer = threading.Timer(float(rng.uniform(0.0, 0.004)), os.kill, (victim, signal.SIGKILL))
                killer.start()
            obs, _, _, truncated, info = penv.step([t % 5] * 6)
            counts = answered_once(counts, obs, truncated, info, t % 5)
        killer.join()
        obs, _, _, truncated, info = penv.step([4] * 6)  # a death seen only now is answered now
        counts = answered_once(counts, obs, truncated, info, 4)
        assert penv.get_env_attr("count") == counts, run
        penv.close()


def _as_step(reset: tuple) -> tuple:
    """A reset's ``(obs, info)`` as a step's counts would read it: every count one on from -1."""
    obs, info = reset
    return obs, np.zeros(len(obs), dtype=bool), {}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("other_call", ["reset", "get_env_attr"])
@pytest.mark.parametrize("backend", WORKER_BACKENDS, indirect=True)
def test_a_death_noticed_by_another_call_leaves_the_step_under_way_answered(make_penv, backend, other_call):
    """A step sent to envs 2 and 3 is under way when their worker dies; a call on healthy idle env 0
    notices the death: it succeeds, and the step is answered (with the rebuilt envs' first obs)."""
    options = {"num_workers": 2} if backend == "subproc" else {}
    penv = make_penv([functools.partial(StallingEnv, tag=i) for i in range(4)], asynchronous="restart",
                     on_worker_failure="restart", **options)
    penv.reset(seed=0)
    host = host_of(penv.backend, 3)[0]  # asked before env 3 stalls: an actor answers one call at a time
    penv.set_env_attr("stall", True, id=[3])
    penv.send([0] * 4)
    obs, _, _, _, info = penv.recv(wait_num=2)
    answered = info["env_id"].tolist()
    assert 3 not in answered
    os.kill(host, signal.SIGKILL)
    if other_call == "reset":
        obs, _ = penv.reset(seed=[5], id=[answered[0]])
        assert obs[0, 1] == 0
    else:
        assert penv.get_env_attr("count", id=[answered[0]]) == [1]
    obs, _, _, truncated, info = penv.recv()  # nothing sent is lost
    pending = [i for i in range(4) if i not in answered]
    assert sorted(info["env_id"].tolist()) == pending
    dead = set(penv.failures[0].env_ids)
    for j, env_id in enumerate(info["env_id"].tolist()):
        assert bool(truncated[j]) == (env_id in dead) == bool(info.get("_worker_restarted", [False] * 4)[j])


# ----------------------------------------------------------------- the budget and the choices


@pytest.mark.timeout(60)
def test_past_the_budget_the_failure_raises_naming_it(no_leaks):
    factories = [functools.partial(FaultyEnv, tag=i, at_step=2 if i == 0 else 10**9, how="exit") for i in range(2)]
    penv = ParallelEnv(factories, para_mode="subproc", num_workers=2, asynchronous="restart",
                       on_worker_failure="restart", max_restarts=2)
    penv.reset(seed=0)
    with pytest.raises(WorkerDiedError) as caught:
        for _ in range(20):  # env 0 dies on its second step, every life
            penv.step([0, 0])
    assert "max_restarts=2" in str(caught.value) and caught.value.env_indices == [0]
    assert len(penv.failures) == 2
    with pytest.raises(WorkerDiedError):
        penv.step([0, 0])  # broken for good, as without healing
    penv.close()


@pytest.mark.timeout(60)
def test_an_env_error_past_the_budget_raises_as_without_healing(no_leaks):
    from parallelenv import EnvError

    factories = [functools.partial(FaultyEnv, tag=i, at_step=1 if i == 1 else 10**9) for i in range(2)]
    with ParallelEnv(factories, asynchronous="restart", on_env_error="restart", max_restarts=1) as penv:
        penv.reset(seed=0)
        _, _, _, truncated, info = penv.step([0, 0])  # env 1 raises on every first step: rebuilt once
        assert truncated.tolist() == [False, True] and info["_env_restarted"].tolist() == [False, True]
        with pytest.raises(EnvError) as caught:
            penv.step([0, 0])
        assert caught.value.env_index == 1


@pytest.mark.timeout(60)
def test_a_reset_under_way_when_its_worker_dies_is_done_again(no_leaks):
    factories = [functools.partial(FaultyEnv, tag=i, at_step=10**9) for i in range(4)]
    with ParallelEnv(factories, para_mode="subproc", num_workers=2, on_worker_failure="restart") as penv:
        first, _ = penv.reset(seed=3)
        os.kill(penv.backend.env_pids()[3], signal.SIGKILL)
        again, _ = penv.reset(seed=3)
        np.testing.assert_array_equal(again, first)  # the same seeds, on rebuilt envs
        assert penv.failures[0].env_ids == (2, 3)


@pytest.mark.timeout(60)
def test_an_env_rebuilt_while_idle_answers_its_next_step(no_leaks):
    factories = [functools.partial(FaultyEnv, tag=i, at_step=10**9) for i in range(4)]
    with ParallelEnv(factories, para_mode="subproc", num_workers=2, on_worker_failure="restart") as penv:
        penv.reset(seed=0)
        penv.send([0, 0], id=[0, 1])
        penv.recv()  # the worker of envs 2 and 3 had nothing to do
        os.kill(penv.backend.env_pids()[2], signal.SIGKILL)
        penv.send([0, 0], id=[0, 1])
        obs, _, _, truncated, _ = penv.recv()
        assert obs[:, 1].tolist() == [2, 2] and not truncated.any()  # the healthy worker, untouched
        # Nothing was under way on envs 2 and 3 when they died: the next call finds their worker gone.
        obs, _, _, truncated, info = penv.step([0, 0, 0, 0])
        assert truncated.tolist() == [False, False, True, True]
        assert info["_worker_restarted"].tolist() == [False, False, True, True]
        assert obs[:, 1].tolist() == [3, 3, 0, 0]


@pytest.mark.parametrize("para_mode, option", [("dummy", "on_worker_failure"), ("tensor", "on_worker_failure"),
                                               ("tensor", "on_env_error")])
def test_backends_without_workers_refuse_restarts(para_mode, option):
    if para_mode == "tensor":
        pytest.importorskip("torch")
        from parallelenv.envs import CartPole

        envs = CartPole(num_envs=2, device="cpu")
    else:
        envs = [counting(0), counting(1)]
    with pytest.raises(ValueError, match="restart"):
        ParallelEnv(envs, para_mode=para_mode, **{option: "restart"})


@pytest.mark.parametrize("bad", [{"on_worker_failure": "retry"}, {"on_env_error": True}, {"max_restarts": -1},
                                 {"restart_window": 0}])
def test_bad_healing_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        ParallelEnv([counting(0)], **bad)


def test_dummy_refuses_to_rebuild_env_instances():
    from envs import CountingEnv

    with pytest.raises(ValueError, match="factories"):
        ParallelEnv([CountingEnv(0), CountingEnv(1)], on_env_error="restart")


@pytest.mark.timeout(60)
def test_env_instances_are_rebuilt_from_the_copies_the_backend_holds(no_leaks):
    envs = [FaultyEnv(tag=i, at_step=2 if i == 1 else 10**9) for i in range(2)]
    with ParallelEnv(envs, para_mode="subproc", asynchronous="restart", on_env_error="restart",
                     on_worker_failure="restart") as penv:
        penv.reset(seed=0)
        penv.step([0, 0])
        obs, _, _, truncated, info = penv.step([0, 0])  # env 1 raises: rebuilt from its pickled copy
        assert truncated.tolist() == [False, True] and info["_env_restarted"].tolist() == [False, True]
        assert obs[:, 1].tolist() == [2, 0]
        assert penv.get_env_attr("step_calls", id=1) == [0]  # a new env, as the caller's instance was
        assert envs[1].step_calls == 0  # the caller's own instance never stepped
