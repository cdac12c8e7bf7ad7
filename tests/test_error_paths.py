"""Every error path is safe: no failure hangs, wedges, kills or leaks a ParallelEnv.

Each test injects one fault the way it happens in a user's program and
checks what the caller gets and what is left behind. A hang fails through
the test's timeout (the faults below hung before their fixes); processes
and shared memory are checked by the ``make_penv``/``no_leaks`` fixtures,
or here where the process under test is a script run as ``__main__``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import RAY_BACKENDS, TESTS_DIR, assert_gone, host_of
from envs import CountingEnv, FaultyEnv, counting
from gymnasium import spaces

from parallelenv import EnvError, WorkerTimeoutError
from parallelenv.backends.shm import NAME_PREFIX

# ---------------------------------------------------------------- test envs


class BlobInfoEnv(CountingEnv):
    """Every step's info carries a megabyte: more than a pipe's buffer holds."""

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"blob": np.full(1_000_000, self.tag, np.uint8)}


class BigObsEnv(gym.Env):
    """A 400 KB observation and one-step episodes: under "restart" each step's
    last observation travels back as ``info["ended_state"]``."""

    observation_space = spaces.Box(0, 255, (400, 1000), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, tag: int = 0) -> None:
        self.tag = tag

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.full((400, 1000), self.tag, np.uint8), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.full((400, 1000), self.tag + 1, np.uint8), 1.0, True, False, {}


def inverse_tag(env: gym.Env) -> float:
    return 1 / env.unwrapped.tag


def hanging_after(tag: int, steps: int) -> Any:
    return lambda: FaultyEnv(tag, at_step=steps + 1, how="hang")


def raising_at(tag: int, step: int) -> Any:
    return lambda: FaultyEnv(tag, at_step=step, how="raise")


def blob_info(tag: int) -> Any:
    return lambda: BlobInfoEnv(tag, episode_length=1000)


def big_obs(tag: int) -> Any:
    return lambda: BigObsEnv(tag)


# ---------------------------------------------------------------- 1. replies larger than a pipe's buffer


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_infos_larger_than_a_pipe_buffer_do_not_stall_a_step(make_penv):
    # call_timeout=None: before the fix the last worker blocked writing its
    # reply before waking the parent, and this step never returned.
    penv = make_penv([blob_info(i) for i in range(4)], call_timeout=None)
    penv.reset(seed=0)
    for _ in range(3):
        _, _, _, _, info = penv.step([0, 1, 2, 3])
        assert [int(blob[0]) for blob in info["blob"]] == [0, 1, 2, 3]


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_large_observations_under_restart_do_not_stall_a_step(make_penv):
    penv = make_penv([big_obs(i) for i in range(4)], call_timeout=None, asynchronous="restart")
    penv.reset(seed=0)
    for _ in range(3):
        obs, _, terminated, _, info = penv.step([0, 1, 0, 1])
        assert terminated.all() and info["reset"].all()
        assert [int(o[0, 0]) for o in obs] == [0, 1, 2, 3]
        assert [int(ended[0, 0]) for ended in info["ended_state"]] == [1, 2, 3, 4]


# ---------------------------------------------------------------- 2 and 8. one env raising costs no other env its step


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_an_env_raising_in_step_leaves_every_other_env_stepped_and_its_results_on_the_error(make_penv):
    # Env 0 raises; env 1, after it in the same worker or actor, is stepped all the same.
    # call_timeout=None: on ray-subproc the replies of the other workers were dropped, and this hung.
    penv = make_penv([raising_at(0, 2), counting(1, 100), counting(2, 100), counting(3, 100)], call_timeout=None)
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])
    with pytest.raises(EnvError) as caught:
        penv.step([0, 2, 3, 4])
    error = caught.value
    assert (error.env_index, error.method, error.failed_env_ids) == (0, "step", [0])
    obs, reward, terminated, truncated, info = error.results
    assert info["env_id"].tolist() == [1, 2, 3]
    assert obs[:, 1].tolist() == [2, 2, 2] and obs[:, 2].tolist() == [2, 3, 4]  # the second step, its actions
    assert reward.tolist() == [12.0, 22.0, 32.0] and not terminated.any() and not truncated.any()
    assert penv.get_env_attr("step_calls") == [1, 2, 2, 2]
    # Nothing is left pending: the other envs step on from where they were.
    obs, *_ = penv.step([1, 1, 1], id=[1, 2, 3])
    assert obs[:, 1].tolist() == [3, 3, 3]


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_envs_raising_together_are_all_named_and_batch_results_carry_the_rest(make_penv):
    penv = make_penv([raising_at(0, 1), counting(1, 100), raising_at(2, 1), counting(3, 100)], call_timeout=None)
    penv.reset(seed=0)
    with pytest.raises(EnvError) as caught:
        penv.step([0, 1, 2, 3], align="batch")
    error = caught.value
    assert error.failed_env_ids == [0, 2] and "[2] raised too" in str(error)
    assert [(r[0][0], r[4]["env_id"]) for r in error.results] == [(1.0, 1), (3.0, 3)]


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_recv_raises_with_the_results_of_the_envs_that_answered(make_penv):
    penv = make_penv([counting(0, 100), raising_at(1, 1), counting(2, 100)], call_timeout=None)
    penv.reset(seed=0)
    penv.send([0, 1, 2])
    received: list[int] = []
    errors: list[EnvError] = []
    while len(received) + len(errors) < 3:  # each recv hands over at least one env, or its failure
        try:
            received += penv.recv(wait_num=1)[4]["env_id"].tolist()
        except EnvError as error:
            errors.append(error)
            received += [] if error.results is None else error.results[4]["env_id"].tolist()
    assert sorted(received) == [0, 2]
    assert [error.env_index for error in errors] == [1]
    obs, *_ = penv.step([0, 0], id=[0, 2])  # nothing is left pending
    assert obs[:, 1].tolist() == [2, 2]


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_a_reset_failing_in_one_env_resets_the_others_and_hands_over_their_results(make_penv):
    from envs import FailingResetEnv

    penv = make_penv([counting(0, 100), lambda: FailingResetEnv(1), counting(2, 100)], call_timeout=None)
    with pytest.raises(EnvError) as caught:
        penv.reset(seed=0)
    obs, info = caught.value.results
    assert info["env_id"].tolist() == [0, 2] and obs[:, 0].tolist() == [0, 2]
    obs, *_ = penv.step([1, 1], id=[0, 2])
    assert obs[:, 1].tolist() == [1, 1]


@pytest.mark.every_backend
def test_a_method_failing_in_one_env_still_runs_on_the_others_and_hands_over_their_values(make_penv):
    penv = make_penv([counting(i, 100) for i in range(4)])
    with pytest.raises(EnvError) as caught:
        penv.customized_method(inverse_tag)
    error = caught.value
    assert (error.env_index, error.exc_type, error.method) == (0, "ZeroDivisionError", "inverse_tag")
    assert error.results == {1: 1.0, 2: 0.5, 3: 1 / 3}
    assert penv.customized_method(inverse_tag, id=[2, 1]) == [0.5, 1.0]


# ---------------------------------------------------------------- 3. what the user passes arrives, or is refused before it is sent


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


@pytest.mark.every_backend
def test_something_that_cannot_travel_is_a_type_error_and_the_penv_goes_on(make_penv):
    penv = make_penv([counting(i, 100) for i in range(3)])
    penv.reset(seed=0)
    if not penv.backend.pids():
        pytest.skip("the envs run in the caller: nothing crosses a process")
    with pytest.raises(TypeError, match="cannot be sent to where the envs run"):
        penv.set_env_attr("thing", Unpicklable())
    with pytest.raises(TypeError, match="cannot be sent"):
        penv.customized_method(lambda env, x: x, data=[{"x": Unpicklable()}, {"x": 1}, {"x": 2}])
    assert penv.get_env_attr("tag") == [0, 1, 2]
    obs, *_ = penv.step([1, 1, 1])
    assert obs[:, 1].tolist() == [1, 1, 1]


MAIN_SCRIPT = """
import sys
import numpy as np
from envs import counting
from parallelenv import ParallelEnv, ParallelEnvError


class Marker:
    def __init__(self, value):
        self.value = value


def scaled(env, factor):
    return env.unwrapped.tag * factor


def marker_value(env):
    return env.unwrapped.marker.value


for mode in sys.argv[1:]:
    penv = ParallelEnv([counting(i, 100) for i in range(3)], para_mode=mode)
    penv.reset(seed=0)
    print(mode, "METHOD", penv.customized_method(scaled, data=[{"factor": 2}, {"factor": 3}], id=[0, 2]), flush=True)
    penv.set_env_attr("marker", Marker(7), id=[1])
    print(mode, "ATTR", penv.customized_method(marker_value, id=[1]), flush=True)
    back = penv.get_env_attr("marker", id=[1])[0]
    print(mode, "BACK", type(back).__name__, back.value, flush=True)
    penv.step([0, 0, 0])
    print(mode, "STEPPED", flush=True)
    penv.close()
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("modes", [("dummy", "subproc"), RAY_BACKENDS])
def test_functions_and_classes_of_the_users_script_reach_the_envs(tmp_path, no_leaks, modes):
    if modes == RAY_BACKENDS:
        pytest.importorskip("ray")
    out = run_script(tmp_path, MAIN_SCRIPT, *modes, timeout=220)
    for mode in modes:
        assert f"{mode} METHOD [0, 6]" in out
        assert f"{mode} ATTR [7]" in out
        assert f"{mode} BACK Marker 7" in out
        assert f"{mode} STEPPED" in out


# ---------------------------------------------------------------- 4. Ctrl-C under Ray


CTRL_C_RAY_SCRIPT = """
import signal
from envs import DelayEnv
from parallelenv import ParallelEnv

# Ctrl-C as in a terminal (see test_lifecycle's Ctrl-C test).
signal.signal(signal.SIGINT, signal.default_int_handler)
penv = ParallelEnv([lambda i=i: DelayEnv(i, delay=0.05) for i in range(4)], para_mode="ray-subproc",
                   num_actors=2, num_workers_per_actor=2)
penv.reset(seed=0)
print("STEPPING", flush=True)
while True:
    penv.step([0, 0, 0, 0])
"""


@pytest.mark.timeout(240)
def test_ctrl_c_under_ray_subproc_leaves_no_ray_process_and_no_shared_memory(tmp_path, no_leaks):
    pytest.importorskip("ray")
    marker = uuid.uuid4().hex
    segments_before = penv_segments()
    child = start_script(tmp_path, CTRL_C_RAY_SCRIPT, marker=marker)
    try:
        line = child.stdout.readline()
        assert line.strip() == "STEPPING", child_failure(child, line)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        stop(child)
    assert err.count("Started a local Ray instance") <= 1, err
    assert_no_process_carries(marker)
    assert not orphaned(penv_segments() - segments_before), err


# ---------------------------------------------------------------- 5. a call_timeout kill on ray-subproc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["ray-subproc"])
def test_a_timeout_kill_on_ray_subproc_takes_the_hung_worker_and_the_actors_segment(make_penv):
    penv = make_penv([counting(0, 100), hanging_after(1, 1), counting(2, 100), counting(3, 100)], call_timeout=3)
    penv.reset(seed=0)
    penv.step([0, 0, 0, 0])
    lost_actor, _ = host_of(penv.backend, 1)
    lost = {pid for env_id in (0, 1) for pid in host_of(penv.backend, env_id)}  # envs 0-1: an actor, two workers
    assert len(lost) == 3
    with pytest.raises(WorkerTimeoutError):
        penv.step([0, 0, 0, 0])
    assert_gone(sorted(lost))
    wait_for(lambda: not any(name.startswith(f"{NAME_PREFIX}{lost_actor}_") for name in penv_segments()),
             "the killed actor's shared memory to be unlinked")


# ---------------------------------------------------------------- 6. a parent killed while its worker hangs


SIGKILL_SCRIPT = """
import os, signal, sys, time
from test_error_paths import hanging_after
from parallelenv import ParallelEnv

penv = ParallelEnv([hanging_after(i, 1) for i in range(2)], para_mode="subproc", num_workers=2,
                   start_method=sys.argv[1] if len(sys.argv) > 1 else None)
penv.reset(seed=0)
penv.step([0, 0])
print("WORKERS", *penv.backend.pids(), flush=True)
penv.send([0, 0])  # both envs now hang forever inside step
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_a_worker_hanging_in_its_env_dies_with_its_killed_parent(tmp_path, no_leaks, start_method):
    child = start_script(tmp_path, SIGKILL_SCRIPT + "print('SENT', flush=True)\ntime.sleep(600)\n", start_method)
    try:
        words = child.stdout.readline().split()
        assert words[:1] == ["WORKERS"], child_failure(child, " ".join(words))
        workers = [psutil.Process(int(pid)) for pid in words[1:]]
        assert child.stdout.readline().strip() == "SENT"
        child.kill()
        child.wait(timeout=30)
    finally:
        stop(child)
    assert_gone([w.pid for w in workers])
    wait_for(lambda: not any(name.startswith(f"{NAME_PREFIX}{child.pid}_") for name in penv_segments()),
             "the dead parent's shared memory to be unlinked")


# ---------------------------------------------------------------- 7. two threads on one ParallelEnv


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_two_threads_stepping_one_penv_each_get_their_own_results(make_penv, backend):
    # The tensor backend's results are buffers that the next step rewrites, whichever thread calls it.
    fresh_results = {"copy": True} if backend == "tensor" else {}
    penv = make_penv([counting(i, 10_000) for i in range(4)], asynchronous="continue", **fresh_results)
    penv.reset(seed=0)
    errors: list[str] = []

    def step_with(action: int) -> None:
        for _ in range(100):
            obs, reward, *_ = penv.step([action] * 4)
            if obs[:, 2].tolist() != [action] * 4:
                errors.append(f"thread acting {action} got the results of actions {obs[:, 2].tolist()}")
                return

    threads = [threading.Thread(target=step_with, args=(action,)) for action in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck in step"
    assert not errors, errors
    assert penv.get_env_attr("step_calls") == [200] * 4


# ---------------------------------------------------------------- helpers


def orphaned(segments: set[str]) -> set[str]:
    """The segments whose creator (named in them) is gone: a test running beside this one holds its own."""
    return {name for name in segments if not psutil.pid_exists(int(name[len(NAME_PREFIX):].split("_")[0]))}


def penv_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(NAME_PREFIX)}
    except FileNotFoundError:
        return set()


def wait_for(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.05)


def script_env(marker: str = "") -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PENV_TEST_MARKER": marker}


def start_script(tmp_path: Path, source: str, *args: str | None, marker: str = "") -> subprocess.Popen[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    argv = [sys.executable, str(script), *filter(None, args)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=script_env(marker), cwd=tmp_path)


def run_script(tmp_path: Path, source: str, *args: str, timeout: float) -> str:
    child = start_script(tmp_path, source, *args)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        stop(child)
    assert child.returncode == 0, err
    assert "Traceback" not in err, err
    return out


def stop(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.communicate()


def child_failure(child: subprocess.Popen[str], line: str) -> str:
    if child.poll() is None:
        return f"unexpected output {line!r}"
    return f"the script ended ({child.returncode}): {child.stderr.read()}"


def assert_no_process_carries(marker: str, timeout: float = 30.0) -> None:
    """No process started under the script (Ray's daemons and agents included) outlives it."""

    def carriers() -> list[str]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("PENV_TEST_MARKER") == marker and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    deadline = time.monotonic() + timeout
    while (left := carriers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes outlived the script: {left}"
