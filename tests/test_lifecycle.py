"""Building, closing and tearing down a ParallelEnv: nothing may outlive close().

The contract (docs/design.rst, "Errors"): ``close()`` always leaves no child process
behind, also when called twice, from ``__del__``, or after Ctrl-C; calls after
``close()`` raise ``ClosedError``. Scripts without the ``__main__`` guard work.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from conftest import RAY_BACKENDS, alive, assert_gone, our_segments
from envs import CountingEnv, DelayEnv, DictObsEnv, StallingEnv, counting
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from parallelenv import ClosedError, ParallelEnv
from parallelenv.backends.subproc.shm import NAME_PREFIX

SUBPROC_ONLY = pytest.mark.parametrize("backend", ["subproc"])
TESTS_DIR = Path(__file__).resolve().parent

# Every env's close() call, for the in-process (dummy) backend to show it ran.
CLOSED_TAGS: list[int] = []


class ClosingEnv(CountingEnv):
    def close(self) -> None:
        CLOSED_TAGS.append(self.tag)


# ---------------------------------------------------------------- helpers

segments = our_segments


def worker_processes(penv: ParallelEnv) -> list[psutil.Process]:
    """The live processes a ParallelEnv's backend started: workers, Ray actors (none in the caller)."""
    processes = [psutil.Process(pid) for pid in penv.backend.pids()]
    children = psutil.Process().children(recursive=True)
    assert penv.para_mode in RAY_BACKENDS or all(p in children for p in processes)
    return processes


def pid_alive(pid: int) -> bool:
    try:
        return alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def scripted_run(penv: ParallelEnv) -> list[Any]:
    """A fixed sequence of calls; its results must not depend on how envs are spread."""
    n = len(penv)
    results: list[Any] = list(penv.reset(seed=7))
    for t in range(5):
        results.extend(penv.step([(t + i) % 5 for i in range(n)]))
    results.extend(penv.step([1] * (n - 1), id=list(range(n - 1, 0, -1)), align="batch"))
    results.append(penv.get_env_attr("count"))
    results.append(penv.customized_method("double", data=list(range(n))))
    return results


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


def run_script(path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, cwd=path.parent, env=env
    )


# ---------------------------------------------------------------- close


def test_close_twice_is_fine(make_penv):
    penv = make_penv([counting(i) for i in range(3)])
    penv.reset(seed=0)
    penv.close()
    penv.close()


CALLS_AFTER_CLOSE: dict[str, Callable[[ParallelEnv], Any]] = {
    "reset": lambda penv: penv.reset(seed=0),
    "reset(id)": lambda penv: penv.reset(id=[1]),
    "step": lambda penv: penv.step([0, 0, 0]),
    "step(id)": lambda penv: penv.step([0], id=[2]),
    "send": lambda penv: penv.send([0, 0, 0]),
    "recv": lambda penv: penv.recv(),
    "get_env_attr": lambda penv: penv.get_env_attr("tag"),
    "set_env_attr": lambda penv: penv.set_env_attr("gravity", 1.0),
    "customized_method": lambda penv: penv.customized_method("describe"),
}


def test_every_call_after_close_raises_closed_error(make_penv, subtests):
    penv = make_penv([counting(i) for i in range(3)])
    penv.reset(seed=0)
    penv.close()
    # One closed ParallelEnv for every call (a ParallelEnv each cost a Ray backend seconds of actor
    # starts): a call refused after close must leave the next one refused too.
    for call, make_call in CALLS_AFTER_CLOSE.items():
        with subtests.test(call=call), pytest.raises(ClosedError):
            make_call(penv)


def test_recv_after_close_with_a_step_in_flight_raises_closed_error(make_penv):
    penv = make_penv([lambda i=i: DelayEnv(i, delay=0.2) for i in range(3)])
    penv.reset(seed=0)
    processes = worker_processes(penv)
    penv.send([0, 0, 0])
    penv.close()  # does not wait for the step's results
    with pytest.raises(ClosedError):
        penv.recv()
    assert_gone(processes)


def test_context_manager_closes(make_penv, backend):
    before = segments()
    with make_penv([counting(i) for i in range(3)]) as penv:
        penv.reset(seed=0)
        penv.step([0, 1, 2])
        processes = worker_processes(penv)
        # subproc: 2 workers; ray: an actor per env; ray-subproc: 2 actors over 2 + 1 workers
        assert len(processes) == {"subproc": 2, "ray": 3, "ray-subproc": 5}.get(backend, 0)
    assert "closed" in repr(penv)
    with pytest.raises(ClosedError):
        penv.reset(seed=0)
    assert_gone(processes)
    assert segments() == before


def test_context_manager_closes_on_an_exception(make_penv):
    with pytest.raises(KeyError, match="raised in the with block"):
        with make_penv([counting(i) for i in range(3)]) as penv:
            processes = worker_processes(penv)
            raise KeyError("raised in the with block")
    with pytest.raises(ClosedError):
        penv.step([0, 0, 0])
    assert_gone(processes)


def test_dropping_the_last_reference_closes(no_leaks, backend):
    before = segments()
    CLOSED_TAGS.clear()
    penv = ParallelEnv([lambda i=i: ClosingEnv(i) for i in range(3)], para_mode=backend)
    penv.reset(seed=0)
    penv.step([0, 1, 2])
    processes = worker_processes(penv)
    del penv
    gc.collect()
    assert_gone(processes)
    assert segments() == before
    if backend == "dummy":
        assert sorted(CLOSED_TAGS) == [0, 1, 2]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["subproc", "ray", "ray-subproc"], indirect=True)
@pytest.mark.parametrize("call", ["step", "recv"])
def test_close_from_another_thread_ends_a_call_that_would_wait_forever(make_penv, backend, call, tmp_path):
    """A watchdog's close(): the call under way, with no call_timeout and an env that never answers,
    raises ClosedError in its thread; close() returns, and nothing is left behind."""
    penv = make_penv([functools.partial(StallingEnv, tag=i) for i in range(4)], call_timeout=None)
    penv.reset(seed=0)
    stalled = tmp_path / "stalled"
    penv.set_env_attr("stall", str(stalled), id=[3])
    raised: list[BaseException] = []

    def run() -> None:
        try:
            if call == "step":
                penv.step([0] * 4)
            else:
                penv.send([0] * 4)
                penv.recv()
        except BaseException as exc:  # noqa: BLE001  (whatever it is, the test names it)
            raised.append(exc)

    caller = threading.Thread(target=run)
    caller.start()
    deadline = time.monotonic() + 30
    while not stalled.exists():  # the env's step has begun to wait forever
        assert time.monotonic() < deadline, "the step never reached the stalling env"
        time.sleep(0.01)
    penv.close()
    caller.join(timeout=30)
    assert not caller.is_alive(), "the call under way did not end"
    assert len(raised) == 1 and isinstance(raised[0], ClosedError), raised
    with pytest.raises(ClosedError):
        penv.step([0] * 4)


@SUBPROC_ONLY
@pytest.mark.parametrize("env", [CountingEnv, DictObsEnv], ids=["box", "dict"])
def test_closed_subproc_penv_leaves_no_process_or_shared_memory(make_penv, env):
    before = segments()
    penv = make_penv([env for _ in range(3)])
    # The segment has no name in /dev/shm from its creation on (Linux; elsewhere once every worker has mapped it).
    assert segments() == before
    processes = worker_processes(penv)
    assert len(processes) == 2 and all(alive(p) for p in processes)
    penv.reset(seed=0)
    penv.step(penv.action_space.sample())
    penv.close()
    assert_gone(processes)
    assert segments() == before
    assert not list(Path("/dev/shm").glob(f"{NAME_PREFIX}{os.getpid()}_*"))


@SUBPROC_ONLY
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_a_stepping_subproc_penv_has_no_name_in_dev_shm(make_penv):
    # Nothing named, so nothing a killer of the whole job (a Ray actor killed
    # after close(), with the resource tracker that would unlink names; a
    # process group SIGKILLed) could leave behind: see test_group_kill.py.
    penv = make_penv([CountingEnv for _ in range(4)])
    penv.reset(seed=0)
    penv.step([1] * 4)
    for pid in [os.getpid(), *penv.backend.pids()]:
        with open(f"/proc/{pid}/maps") as maps:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in maps if " /dev/shm/" in line}
        assert all(path.endswith("(deleted)") for path in mapped), (pid, mapped)


@pytest.mark.parametrize("env", [CountingEnv, DictObsEnv], ids=["box", "dict"])
def test_len_spaces_and_repr_before_and_after_close(make_penv, backend, env):
    penv = make_penv([env for _ in range(3)], asynchronous="idle")
    single_obs, single_action = env.observation_space, env.action_space

    def check() -> None:
        assert len(penv) == 3
        assert penv.single_observation_space == single_obs
        assert penv.single_action_space == single_action
        assert penv.observation_space == batch_space(single_obs, 3)
        assert penv.action_space == batch_space(single_action, 3)

    check()
    if env is CountingEnv:
        assert penv.action_space == spaces.MultiDiscrete([5, 5, 5])
    obs, _ = penv.reset(seed=0)
    assert penv.observation_space.contains(obs)
    assert repr(penv) == f"ParallelEnv(3 envs, para_mode={backend!r}, asynchronous='idle')"
    penv.close()
    check()
    assert repr(penv) == f"ParallelEnv(closed, para_mode={backend!r}, asynchronous='idle')"


# ---------------------------------------------------------------- subproc options


def five_envs() -> list[Callable[[], CountingEnv]]:
    # Different episode lengths, so that envs restart at different steps.
    return [counting(i, episode_length=2 + i % 3, terminate=i % 2 == 0) for i in range(5)]


@SUBPROC_ONLY
def test_num_workers_do_not_change_the_results(make_penv):
    with ParallelEnv(five_envs(), para_mode="dummy", asynchronous="restart") as reference:
        expected = scripted_run(reference)
    for num_workers in (1, 2, 5):
        penv = make_penv(five_envs(), num_workers=num_workers, asynchronous="restart")
        assert len({p.pid for p in worker_processes(penv)}) == num_workers
        assert_same(scripted_run(penv), expected)
        penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(120)
def test_spawn_start_method_works(make_penv):
    envs = [counting(i, episode_length=2) for i in range(2)]
    with ParallelEnv(envs, para_mode="dummy", asynchronous="restart") as reference:
        expected = scripted_run(reference)
    penv = make_penv(envs, num_workers=1, start_method="spawn", asynchronous="restart")
    assert_same(scripted_run(penv), expected)


@SUBPROC_ONLY
@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux's")
@pytest.mark.parametrize("num_workers", [2, 5])
def test_workers_are_scheduled_as_batch_jobs(make_penv, num_workers):
    # A worker woken by the parent must not preempt it while it sends to the
    # next worker (see worker._schedule_as_batch_job); the parent keeps its policy.
    penv = make_penv(five_envs(), num_workers=num_workers)
    policies = {os.sched_getscheduler(p.pid) for p in worker_processes(penv)}
    assert policies == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.parametrize("num_workers", [0, -1, 5, 2.0, "2"])
def test_bad_num_workers_is_refused(no_leaks, num_workers):
    with pytest.raises(ValueError, match="num_workers") as caught:
        ParallelEnv([counting(i) for i in range(4)], para_mode="subproc", num_workers=num_workers)
    assert repr(num_workers) in str(caught.value)


def test_subproc_options_are_refused_by_dummy():
    with pytest.raises(TypeError, match="num_workers"):
        ParallelEnv([counting(0)], para_mode="dummy", num_workers=1)


# ---------------------------------------------------------------- scripts run as programs

UNGUARDED_SCRIPT = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from parallelenv import ParallelEnv


class ScriptEnv(gym.Env):
    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = spaces.Discrete(3)

    def __init__(self, tag):
        self.tag = tag

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.tag], np.float64), {{}}

    def step(self, action):
        return np.array([self.tag * 10 + action], np.float64), 1.0, False, False, {{}}


print("BUILDING", flush=True)
penv = ParallelEnv([lambda i=i: ScriptEnv(i) for i in range(3)], para_mode="subproc", num_workers=2{options})
penv.reset(seed=0)
obs, *_ = penv.step([1, 2, 0])
print("RESULT", obs[:, 0].tolist(), flush=True)
penv.close()
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", [None, "spawn", "fork"])
def test_script_without_main_guard_runs(tmp_path, no_leaks, start_method):
    options = "" if start_method is None else f", start_method={start_method!r}"
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.format(options=options))
    done = run_script(script, timeout=150)
    assert done.returncode == 0, done.stderr
    # Workers that re-ran the script would have printed, or failed to bootstrap.
    assert done.stdout.splitlines() == ["BUILDING", "RESULT [1.0, 12.0, 20.0]"], done.stderr
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr


CTRL_C_SCRIPT = """
import signal

from envs import DelayEnv
from parallelenv import ParallelEnv

if __name__ == "__main__":
    # Ctrl-C as in a terminal: a suite started in the background by a shell
    # without job control hands its children SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    penv = ParallelEnv([lambda i=i: DelayEnv(i, delay=0.3) for i in range(4)], para_mode="subproc", num_workers=2)
    try:
        penv.reset(seed=0)
        print("WORKERS", *penv.backend.pids(), flush=True)
        while True:
            penv.step([0, 0, 0, 0])
            print("STEPPED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    finally:
        penv.close()
        print("CLOSED", flush=True)
"""


@pytest.mark.timeout(90)
def test_ctrl_c_while_stepping_then_close_leaves_no_worker(tmp_path, no_leaks):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        first = child.stdout.readline().split()
        assert first and first[0] == "WORKERS", child.stderr.read() if child.poll() is not None else first
        workers = [psutil.Process(int(pid)) for pid in first[1:]]
        assert len(workers) == 2 and all(alive(w) for w in workers)
        assert child.stdout.readline().strip() == "STEPPED"  # now inside the stepping loop
        child.send_signal(signal.SIGINT)
        try:
            out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the script went on stepping after SIGINT; its signal state: {signal_state(child.pid)}")
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()  # closes the pipes too: a later test would see them leak
    lines = out.split()
    assert child.returncode == 0, err
    assert lines[-2:] == ["INTERRUPTED", "CLOSED"], (out, err)
    assert "Traceback" not in err and "leaked" not in err, err
    assert_gone(workers)


def signal_state(pid: int) -> str:
    """The kernel's view of a process's pending, blocked, ignored and caught signals (Linux)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return ", ".join(line.strip() for line in status if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
    except OSError as exc:
        return f"unknown ({exc})"


UNCLOSED_SCRIPT = """
from envs import counting
from parallelenv import ParallelEnv

penv = ParallelEnv([counting(tag) for tag in range(4)], para_mode="subproc", num_workers=2)
penv.reset(seed=0)
print("WORKERS", *penv.backend.pids(), flush=True)
# The script ends without close(): the interpreter's exit must not leave the workers running.
"""


@pytest.mark.timeout(90)
def test_script_exiting_without_close_leaves_no_worker(tmp_path, no_leaks):
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED_SCRIPT)
    done = run_script(script, timeout=60)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[0] == "WORKERS" and len(words) == 3, done.stdout
    deadline = time.monotonic() + 10
    left = [int(pid) for pid in words[1:]]
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if pid_alive(pid)]
        time.sleep(0.05)
    assert not left, f"workers {left} outlived the script that started them"
