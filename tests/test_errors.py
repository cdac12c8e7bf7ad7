"""How failures reach the caller, and that none of them hangs, wedges or leaks a ParallelEnv.

The contract (docs/design.rst, "Errors"): an env's exception becomes an ``EnvError``
naming the env, the method, the original type and message and the remote
traceback; a dead worker becomes a ``WorkerDiedError`` naming the envs it
hosted, within bounded time; the ParallelEnv stays closable and leaks nothing.
Bad arguments are refused with a message naming the culprit before anything
is sent to an env. Tests assert on the exceptions' fields, never on log text.

Each fault is injected the way it happens in a user's program. A hang fails
through the test's timeout (several faults below hung before their fixes,
hence ``call_timeout=None`` there); processes and shared memory are checked
by the ``make_penv``/``no_leaks`` fixtures, or here where the process under
test is a script run as ``__main__``.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import RAY_BACKENDS, TESTS_DIR, assert_gone, host_of
from envs import CountingEnv, DelayEnv, DictObsEnv, FailingResetEnv, FaultyEnv, OtherSpaceEnv, WarningEnv, counting
from gymnasium import spaces

import parallelenv
from parallelenv import EnvError, ParallelEnv, ParallelEnvError, WorkerDiedError, WorkerTimeoutError
from parallelenv.backends.subproc.shm import NAME_PREFIX
from parallelenv.errors import RemoteTraceback, SharedEnvError

SUBPROC_ONLY = pytest.mark.parametrize("backend", ["subproc"])


# ---------------------------------------------------------------- test envs
# At module level so that worker processes can unpickle them by reference.


class MethodEnv(CountingEnv):
    """A CountingEnv with methods and attributes that misbehave on demand."""

    def __init__(self, tag: int = 0, delay: float = 0.0) -> None:
        super().__init__(tag, episode_length=100)
        self.delay = delay
        self.bumps = 0

    def divide(self, x: float) -> float:
        if self.delay:
            time.sleep(self.delay)  # the env's own cost, so that its worker answers late
        return 1 / x

    def bump(self, by: int) -> int:
        self.bumps += by
        return self.bumps

    def hang(self) -> None:
        threading.Event().wait()  # forever; only a kill ends it

    @property
    def broken(self) -> int:
        raise RuntimeError(f"env {self.tag} cannot compute 'broken'")


class LockedEnv(CountingEnv):
    """Holds a lock, so it cannot be pickled to a worker process."""

    def __init__(self, tag: int = 0, lock: Any = None) -> None:
        super().__init__(tag, episode_length=100)
        self.lock = lock if lock is not None else threading.Lock()


def broken_factory() -> gym.Env:
    raise OSError("no display to build this env on")


def method_env(tag: int, delay: float = 0.0) -> Callable[[], MethodEnv]:
    return lambda: MethodEnv(tag, delay)


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


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


# ---------------------------------------------------------------- helpers


def worker_process(penv: ParallelEnv, env_index: int) -> tuple[psutil.Process, list[int]]:
    """The worker process hosting ``env_index``, and every env it hosts."""
    env_pids = penv.backend.env_pids()
    process = psutil.Process(env_pids[env_index])
    assert process in psutil.Process().children(recursive=True)
    return process, [i for i, pid in enumerate(env_pids) if pid == process.pid]


def gone(process: psutil.Process) -> bool:
    """Dead or a zombie; never reap it, that is multiprocessing's job."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(process: psutil.Process, timeout: float = 10.0) -> None:
    wait_for(lambda: gone(process), f"process {process.pid} to end after it was killed", timeout)


def assert_every_call_raises(penv: ParallelEnv, error: type[Exception], env_indices: list[int]) -> None:
    """Every call but close() raises ``error`` naming the lost envs again."""
    n = len(penv)
    calls: dict[str, Callable[[], Any]] = {
        "step": lambda: penv.step([0] * n),
        "step(id)": lambda: penv.step([0], id=[0]),
        "reset": lambda: penv.reset(seed=0),
        "get_env_attr": lambda: penv.get_env_attr("tag"),
        "set_env_attr": lambda: penv.set_env_attr("gravity", 1.0),
        "customized_method": lambda: penv.customized_method("describe"),
        "send": lambda: penv.send([0] * n),
        "recv": lambda: penv.recv(),
    }
    for name, call in calls.items():
        with pytest.raises(error) as caught:
            call()
        assert type(caught.value) is error, name
        assert caught.value.env_indices == env_indices, name


# ---------------------------------------------------------------- exceptions inside envs


def assert_caused_by_the_envs_exception(error: EnvError) -> None:
    """An env run in the caller chains its own exception, frames and all (a debugger's post-mortem lands
    in the env); one run in another process chains its traceback's text."""
    cause = error.__cause__
    if isinstance(cause, RemoteTraceback):
        assert cause.traceback_text == error.remote_traceback
    else:
        assert type(cause).__name__ == error.exc_type.rsplit(".", 1)[-1] and str(cause) == error.message
        assert cause.__traceback__ is not None


@pytest.mark.every_backend
def test_env_raising_in_step_gives_env_error_with_its_fields(make_penv):
    penv = make_penv([counting(0, 100), counting(1, 100), lambda: FaultyEnv(2, at_step=2), counting(3, 100)])
    penv.reset(seed=0)
    penv.step([0, 1, 2, 3])
    with pytest.raises(EnvError) as caught:
        penv.step([0, 1, 2, 3])
    error = caught.value
    assert isinstance(error, ParallelEnvError)
    assert error.env_index == 2
    assert error.method == "step"
    assert error.exc_type == "RuntimeError"
    assert error.message == "env 2 broke on purpose"
    assert 'raise RuntimeError(f"env {self.tag} broke on purpose")' in error.remote_traceback
    assert "envs.py" in error.remote_traceback and "in step" in error.remote_traceback
    assert_caused_by_the_envs_exception(error)
    assert "env 2" in str(error) and "RuntimeError" in str(error) and "step" in str(error)


@pytest.mark.every_backend
@pytest.mark.parametrize("asynchronous", [None, "continue"])  # "continue": a step the caller's backend answers at once
def test_env_error_in_step_leaves_the_penv_usable(make_penv, backend, asynchronous):
    # Env 0's worker answers well after env 2's failure: its reply must not be
    # mistaken for the answer to a later call.
    penv = make_penv(
        [lambda: DelayEnv(0, delay=0.2), counting(1, 100), lambda: FaultyEnv(2, at_step=2), counting(3, 100)],
        asynchronous=asynchronous,
    )
    penv.reset(seed=0)
    penv.step([1, 1, 1, 1])
    with pytest.raises(EnvError) as caught:
        penv.step([1, 1, 1, 1])
    assert caught.value.env_index == 2
    if backend != "tensor":  # its batched env's exception is the whole batch's: no other results
        assert caught.value.results[4]["env_id"].tolist() == [0, 1, 3]  # the others' results of that step
    penv.set_env_attr("at_step", -1, id=[2])  # disarm the faulty env
    obs, info = penv.reset(seed=1)
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(obs[:, 1], [0, 0, 0, 0])
    obs, reward, terminated, truncated, info = penv.step([4, 3, 2, 1])
    np.testing.assert_array_equal(obs[:, 1], [1, 1, 1, 1])
    np.testing.assert_array_equal(obs[:, 2], [4, 3, 2, 1])
    np.testing.assert_array_equal(reward, [1, 11, 21, 31])
    obs, *_ = penv.step([0, 0, 0, 0])
    np.testing.assert_array_equal(obs[:, 1], [2, 2, 2, 2])


@pytest.mark.timeout(120)
@pytest.mark.every_backend
def test_env_raising_in_reset_gives_env_error_for_reset(make_penv, backend):
    penv = make_penv([counting(0, 100), lambda: FailingResetEnv(1), counting(2, 100)], call_timeout=None)
    with pytest.raises(EnvError) as caught:
        penv.reset(seed=0)
    error = caught.value
    assert (error.env_index, error.method, error.exc_type) == (1, "reset", "ValueError")
    assert error.message == "env 1 cannot reset"
    assert "cannot reset" in error.remote_traceback and "in reset" in error.remote_traceback
    assert_caused_by_the_envs_exception(error)
    if backend != "tensor":  # its batched env's exception is the whole batch's: no other results
        # The other envs were reset all the same, and the error hands their results over.
        obs, info = error.results
        assert info["env_id"].tolist() == [0, 2] and obs[:, 0].tolist() == [0, 2]
        obs, *_ = penv.step([1, 1], id=[0, 2])
        assert obs[:, 1].tolist() == [1, 1]


@pytest.mark.every_backend
def test_env_raising_in_the_reset_of_a_restart_names_reset(make_penv):
    penv = make_penv([counting(0, 1), lambda: FailingResetEnv(1, episode_length=1)], asynchronous="restart")
    with pytest.raises(EnvError) as caught:
        penv.step([0, 0])  # both episodes end; env 1 fails to start the next one
    assert (caught.value.env_index, caught.value.method, caught.value.exc_type) == (1, "reset", "ValueError")


@pytest.mark.every_backend
def test_factory_raising_gives_env_error_for_make(make_penv):
    with pytest.raises(EnvError) as caught:
        make_penv([counting(0), broken_factory, counting(2)])
    error = caught.value
    assert (error.env_index, error.method, error.exc_type) == (1, "make", "OSError")
    assert error.message == "no display to build this env on"
    assert "broken_factory" in error.remote_traceback
    assert_caused_by_the_envs_exception(error)
    # make_penv's teardown checks that no worker or shared memory outlived the failure


@pytest.mark.every_backend
def test_factory_returning_a_non_env_gives_env_error_for_make(make_penv):
    with pytest.raises(EnvError) as caught:
        make_penv([counting(0), counting(1), lambda: "not an env"])
    assert (caught.value.env_index, caught.value.method, caught.value.exc_type) == (2, "make", "TypeError")
    assert "not a gymnasium.Env" in caught.value.message and "env 2" in str(caught.value)


# ---------------------------------------------------------------- one env raising costs no other env its call


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


# ---------------------------------------------------------------- attributes and methods


@pytest.mark.every_backend
def test_customized_method_raising_gives_env_error(make_penv, backend):
    penv = make_penv([method_env(i) for i in range(4)])
    with pytest.raises(EnvError) as caught:
        penv.customized_method("divide", data=[1, 2, 0, 4])
    error = caught.value
    assert (error.env_index, error.method, error.exc_type) == (2, "divide", "ZeroDivisionError")
    assert error.message == "division by zero"
    assert "return 1 / x" in error.remote_traceback
    if backend != "tensor":  # its batched env's exception is the whole batch's: no other values
        # The method still ran on the other envs, and the error hands their values over.
        assert error.results == {0: 1.0, 1: 0.5, 3: 0.25}
        assert penv.customized_method(inverse_tag, id=[2, 1]) == [0.5, 1.0]


def test_penv_is_usable_after_a_customized_method_error(make_penv):
    # Env 1 fails at once; the other worker's envs answer 0.3 s later.
    penv = make_penv([method_env(0), method_env(1), method_env(2, 0.15), method_env(3, 0.15)])
    with pytest.raises(EnvError) as caught:
        penv.customized_method("divide", data=[1, 0, 1, 1])
    assert caught.value.env_index == 1
    assert penv.get_env_attr("tag") == [0, 1, 2, 3]
    assert penv.customized_method("divide", data=[1, 2, 4, 8]) == [1, 0.5, 0.25, 0.125]
    penv.reset(seed=0)
    obs, *_ = penv.step([1, 1, 1, 1])
    np.testing.assert_array_equal(obs[:, 1], [1, 1, 1, 1])


@pytest.mark.every_backend
def test_unknown_method_names_the_env_and_attribute_error(make_penv):
    penv = make_penv([method_env(i) for i in range(4)])
    with pytest.raises(EnvError) as caught:
        penv.customized_method("no_such_method", id=[3, 1])
    error = caught.value
    assert error.env_index in (1, 3)  # both fail; the contract does not say which is reported
    assert (error.method, error.exc_type) == ("no_such_method", "AttributeError")
    assert "no_such_method" in error.message


def test_get_env_attr_of_a_missing_attribute_is_none_in_that_slot(make_penv):
    penv = make_penv([method_env(i) for i in range(4)])
    assert penv.get_env_attr("no_such_attribute") == [None] * 4
    penv.set_env_attr("extra", 5, id=[2])
    assert penv.get_env_attr("extra") == [None, None, 5, None]
    assert penv.get_env_attr("extra", id=[2, 0]) == [5, None]


def test_get_env_attr_raising_gives_env_error(make_penv):
    penv = make_penv([method_env(i) for i in range(4)])
    with pytest.raises(EnvError) as caught:
        penv.get_env_attr("broken", id=[1, 3])
    error = caught.value
    assert error.env_index in (1, 3)  # both fail; the contract does not say which is reported
    assert (error.method, error.exc_type) == ("broken", "RuntimeError")
    assert error.message == f"env {error.env_index} cannot compute 'broken'"


# ---------------------------------------------------------------- dead workers


@SUBPROC_ONLY
@pytest.mark.timeout(60)
def test_worker_killed_during_a_step_raises_worker_died(make_penv):
    penv = make_penv([counting(0, 100), counting(1, 100), lambda: DelayEnv(2, delay=30.0), counting(3, 100)])
    penv.reset(seed=0)
    process, hosted = worker_process(penv, 2)
    assert hosted == [2, 3]
    penv.send([0, 0, 0, 0])
    process.kill()
    with pytest.raises(WorkerDiedError) as caught:
        penv.recv()
    assert type(caught.value) is WorkerDiedError
    assert caught.value.env_indices == [2, 3]
    assert "SIGKILL" in caught.value.reason
    assert_every_call_raises(penv, WorkerDiedError, [2, 3])
    penv.close()
    penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("how", "reason"), [("exit", "3"), ("kill", "SIGKILL")])
def test_env_ending_its_worker_during_step_raises_worker_died(make_penv, how, reason):
    penv = make_penv([counting(0, 100), counting(1, 100), counting(2, 100), lambda: FaultyEnv(3, at_step=2, how=how)])
    penv.reset(seed=0)
    penv.step([0, 0, 0, 0])
    process, hosted = worker_process(penv, 3)
    with pytest.raises(WorkerDiedError) as caught:
        penv.step([0, 0, 0, 0])
    assert type(caught.value) is WorkerDiedError
    assert caught.value.env_indices == hosted == [2, 3]
    assert reason in caught.value.reason
    wait_gone(process)
    assert_every_call_raises(penv, WorkerDiedError, [2, 3])
    penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(60)
def test_worker_killed_while_idle_raises_worker_died_on_the_next_call(make_penv):
    penv = make_penv([counting(i, 100) for i in range(5)])
    penv.reset(seed=0)
    penv.step([0] * 5)
    process, hosted = worker_process(penv, 0)
    assert hosted == [0, 1, 2]
    process.kill()
    wait_gone(process)
    with pytest.raises(WorkerDiedError) as caught:
        penv.step([0] * 5)
    assert caught.value.env_indices == [0, 1, 2]
    assert "SIGKILL" in caught.value.reason
    assert_every_call_raises(penv, WorkerDiedError, [0, 1, 2])
    penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(60)
def test_worker_killed_while_idle_is_reported_by_a_call_on_other_envs_too(make_penv):
    penv = make_penv([counting(i, 100) for i in range(4)])
    penv.reset(seed=0)
    process, _ = worker_process(penv, 3)
    process.kill()
    wait_gone(process)
    # The call names only envs of the dead worker's group.
    with pytest.raises(WorkerDiedError) as caught:
        penv.get_env_attr("tag", id=[3])
    assert caught.value.env_indices == [2, 3]
    penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(30)
def test_hanging_env_raises_worker_timeout(make_penv):
    penv = make_penv(
        [counting(0, 100), counting(1, 100), counting(2, 100), lambda: FaultyEnv(3, at_step=1, how="hang")],
        call_timeout=2,
    )
    penv.reset(seed=0)
    process, _ = worker_process(penv, 3)
    with pytest.raises(WorkerTimeoutError) as caught:
        penv.step([0, 0, 0, 0])
    assert isinstance(caught.value, WorkerDiedError)
    assert caught.value.env_indices == [2, 3]
    wait_gone(process)  # the hung worker was killed
    assert_every_call_raises(penv, WorkerTimeoutError, [2, 3])
    penv.close()


@SUBPROC_ONLY
@pytest.mark.timeout(30)
def test_call_timeout_counts_from_each_envs_own_send(make_penv):
    # Env 1 is sent to 1.5 s after env 0 and answers 2 s after that: past
    # call_timeout from env 0's send, well within it from its own.
    penv = make_penv([lambda tag=tag: DelayEnv(tag, delay=2.0) for tag in range(2)], num_workers=2, call_timeout=3.0)
    penv.reset(seed=0)
    penv.send([1], id=[0])
    *_, info = penv.recv(timeout=1.5)
    assert info["env_id"].tolist() == []
    penv.send([1], id=[1])
    *_, info = penv.recv(wait_num=1)
    assert info["env_id"].tolist() == [0]
    *_, info = penv.recv()
    assert info["env_id"].tolist() == [1]
    assert penv.get_env_attr("step_calls") == [1, 1]


@SUBPROC_ONLY
@pytest.mark.timeout(30)
def test_hanging_customized_method_raises_worker_timeout(make_penv):
    penv = make_penv([method_env(i) for i in range(4)], call_timeout=1)
    with pytest.raises(WorkerTimeoutError) as caught:
        penv.customized_method("hang", id=[1])
    assert caught.value.env_indices == [0, 1]
    penv.close()


# ---------------------------------------------------------------- a call_timeout kill on ray-subproc


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


# ---------------------------------------------------------------- a parent killed while its worker hangs


SIGKILL_SCRIPT = """
import os, signal, sys, time
from test_errors import hanging_after
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


# ---------------------------------------------------------------- Ctrl-C under Ray


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


# ---------------------------------------------------------------- replies larger than a pipe's buffer


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


# ---------------------------------------------------------------- two threads on one ParallelEnv


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


# ---------------------------------------------------------------- what the user passes arrives, or is refused before it is sent


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


# ---------------------------------------------------------------- envs that cannot cross a process


UNPICKLABLE = {
    "instance": lambda: LockedEnv(2),
    "closure": lambda: (lambda lock: lambda: LockedEnv(2, lock))(threading.Lock()),
}


@pytest.mark.parametrize("kind", sorted(UNPICKLABLE))
def test_unpicklable_env_is_refused_by_subproc_and_runs_in_dummy(make_penv, kind):
    envs = [CountingEnv(0), CountingEnv(1), UNPICKLABLE[kind](), CountingEnv(3)]
    try:
        penv = make_penv(envs)
    except TypeError as refused:  # it would have to cross a process
        assert re.search(r"\benv 2\b", str(refused)) and "lock" in str(refused), refused
        return  # make_penv's teardown checks that no worker was left behind
    assert not penv.backend.pids(), "a backend with processes of its own took an env that cannot reach them"
    penv.reset(seed=0)
    obs, *_ = penv.step([1, 1, 1, 1])
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2, 3])


# ---------------------------------------------------------------- bad arguments


BAD_STEPS = {
    "too few actions": ({"actions": [0, 1, 2]}, ValueError, r"actions.*\(3,\)"),
    "too many actions": ({"actions": [0, 1, 2, 3, 4]}, ValueError, r"actions.*\(5,\)"),
    "actions for one id": ({"actions": [0, 1], "id": [2]}, ValueError, r"actions.*\(2,\)"),
    "2-D actions for Discrete": ({"actions": [[0], [1], [2], [3]]}, ValueError, r"actions.*\(4, 1\)"),
    "float actions for Discrete": ({"actions": [0.0, 1.0, 2.0, 3.0]}, TypeError, r"actions.*float"),
    "action above Discrete(5)": ({"actions": [0, 1, 5, 3]}, ValueError, r"actions\[2\] = 5"),
    "negative action": ({"actions": [0, -1, 2, 3]}, ValueError, r"actions\[1\] = -1"),
    # As arrays too: a batch already in the space's form takes a shorter path.
    "float array for Discrete": ({"actions": np.zeros(4)}, TypeError, r"actions.*float"),
    "array above Discrete(5)": ({"actions": np.array([0, 1, 5, 3])}, ValueError, r"actions\[2\] = 5"),
    "negative int8 array": ({"actions": np.array([0, -1, 2, 3], np.int8)}, ValueError, r"actions\[1\] = -1"),
    "2-D array for Discrete": ({"actions": np.zeros((4, 1), np.int64)}, ValueError, r"actions.*\(4, 1\)"),
    "short array": ({"actions": np.zeros(3, np.int64)}, ValueError, r"actions.*\(3,\)"),
    "id out of range": ({"actions": [0, 1], "id": [0, 4]}, ValueError, r"\b4\b"),
    "align": ({"actions": [0, 1, 2, 3], "align": "bogus"}, ValueError, "bogus"),
}


# The bad-argument tests go through their cases on one ParallelEnv per
# backend: each case must leave it as it was, and a Ray one takes seconds to start.


def test_bad_step_arguments_are_refused_before_sending(make_penv):
    penv = make_penv([counting(i, 100) for i in range(4)])
    penv.reset(seed=0)
    for steps, (case, (kwargs, error, match)) in enumerate(BAD_STEPS.items(), start=1):
        penv.step([0, 0, 0, 0])
        with pytest.raises(error, match=match):
            penv.step(**kwargs)
        if "align" not in kwargs:  # send() takes no align
            with pytest.raises(error, match=match):
                penv.send(**kwargs)
        assert penv.get_env_attr("step_calls") == [2 * steps - 1] * 4, case
        obs, *_ = penv.step([1, 2, 3, 4])  # nothing was left half-sent
        np.testing.assert_array_equal(obs[:, 2], [1, 2, 3, 4], err_msg=case)


BAD_BOX_ACTIONS = {
    "too few": (np.zeros((2, 2), np.float32), r"actions.*\(2, 2\)"),
    "wrong shape": (np.zeros((3, 3), np.float32), r"actions.*\(3, 3\)"),
    "flat": (np.zeros(3, np.float32), r"actions.*\(3,\)"),
}


def test_bad_box_actions_are_refused_before_sending(make_penv):
    penv = make_penv([DictObsEnv for _ in range(3)])
    penv.reset(seed=0)
    for steps, (case, (actions, match)) in enumerate(BAD_BOX_ACTIONS.items()):
        with pytest.raises(ValueError, match=match):
            penv.step(actions)
        assert penv.get_env_attr("t") == [steps] * 3, case
        penv.step(np.zeros((3, 2), np.float32))


BAD_RESETS = {
    "seed list too short": ({"seed": [1, 2, 3]}, ValueError, r"seed.*3"),
    "seed list too long": ({"seed": [1, 2, 3, 4, 5]}, ValueError, r"seed.*5"),
    "seeds for id": ({"seed": [1, 2, 3], "id": [0, 1]}, ValueError, r"seed.*3"),
    "negative seed": ({"seed": -1}, ValueError, r"seed.*-1"),
    "negative seed in list": ({"seed": [0, -5, 1, 2]}, ValueError, r"seed\[1\].*-5"),
    "float seed": ({"seed": 1.5}, TypeError, r"seed.*1\.5|seed.*float"),
    "options not dicts": ({"options": [1, 2, 3, 4]}, TypeError, r"options\[0\]"),
    "options too short": ({"options": [{}, {}]}, ValueError, r"options.*2"),
    "align": ({"align": "bogus"}, ValueError, "bogus"),
    "duplicated id": ({"id": [1, 1]}, ValueError, r"\b1\b"),
}


def test_bad_reset_arguments_are_refused_before_sending(make_penv):
    penv = make_penv([counting(i, 100) for i in range(4)])
    penv.reset(seed=0)
    draws = penv.get_env_attr("draw")
    for steps, (case, (kwargs, error, match)) in enumerate(BAD_RESETS.items(), start=1):
        penv.step([0, 0, 0, 0])
        with pytest.raises(error, match=match):
            penv.reset(**kwargs)
        assert penv.get_env_attr("count") == [steps] * 4, case  # no env was reset
        assert penv.get_env_attr("draw") == draws, case


BAD_METHOD_ARGUMENTS = {
    "too short": ({"data": [1, 2]}, ValueError, r"data.*2"),
    "too long for id": ({"data": [1, 2, 3], "id": [0, 1]}, ValueError, r"data.*3"),
    "not a list": ({"data": 5}, TypeError, r"data"),
    "duplicated id": ({"data": [1, 2], "id": [0, 0]}, ValueError, r"\b0\b"),
}


def test_bad_customized_method_arguments_are_refused_before_sending(make_penv):
    penv = make_penv([method_env(i) for i in range(4)])
    for calls, (case, (kwargs, error, match)) in enumerate(BAD_METHOD_ARGUMENTS.items()):
        with pytest.raises(error, match=match):
            penv.customized_method("bump", **kwargs)
        assert penv.get_env_attr("bumps") == [2 * calls, 0, 0, calls], case
        assert penv.customized_method("bump", data=[1, 2], id=[3, 0]) == [calls + 1, 2 * calls + 2], case


def test_bad_attribute_names_are_refused(make_penv):
    penv = make_penv([counting(i) for i in range(2)])
    for name in ("", None, 3):
        with pytest.raises(TypeError, match="name"):
            penv.get_env_attr(name)
        with pytest.raises(TypeError, match="name"):
            penv.set_env_attr(name, 1)
        with pytest.raises(TypeError, match="name"):
            penv.customized_method(name)


def test_unknown_para_mode_lists_the_valid_ones(no_leaks):
    with pytest.raises(ValueError, match="bogus") as caught:
        ParallelEnv([counting(0)], para_mode="bogus")
    assert "'dummy'" in str(caught.value) and "'subproc'" in str(caught.value)


@pytest.mark.parametrize("asynchronous", ["sometimes", "Restart", 1, ["idle"]])
def test_unknown_asynchronous_policy_lists_the_valid_ones(no_leaks, backend, asynchronous):
    with pytest.raises(ValueError) as caught:
        ParallelEnv([counting(0)], para_mode=backend, asynchronous=asynchronous)
    message = str(caught.value)
    assert repr(asynchronous) in message
    for valid in ("None", "'idle'", "'restart'", "'continue'"):
        assert valid in message


@pytest.mark.parametrize("envs", [[], (), "CartPole-v1", CountingEnv(0), None],
                         ids=["empty list", "empty tuple", "a str", "one env", "None"])
def test_no_env_list_is_refused(no_leaks, backend, envs):
    with pytest.raises((TypeError, ValueError), match="non-empty list"):
        ParallelEnv(envs, para_mode=backend)


@pytest.mark.parametrize(("num_envs", "other_at"), [(3, 2), (4, 1), (4, 2), (4, 3)])
def test_mixed_action_spaces_name_the_env(make_penv, num_envs, other_at):
    # With subproc's two workers, the odd env is alone in its worker for (3, 2),
    # and shares a worker with an ordinary env otherwise.
    envs = [counting(i) for i in range(num_envs)]
    envs[other_at] = lambda: OtherSpaceEnv(other_at)
    # A group compares its envs with its first one: a Ray actor whose first
    # env is the odd one names it as the reference ("but env 2 has ...").
    with pytest.raises(ValueError, match=rf"action_space.*\benv {other_at}\b|\benv {other_at}\b.*action_space"):
        make_penv(envs)


def test_envs_of_different_spaces_are_also_gymnasiums_runtime_error(no_leaks):
    """Gymnasium's vector envs raise RuntimeError for them: code written for those still catches ours."""
    with pytest.raises(RuntimeError, match=r"env 1 has action_space"):
        ParallelEnv([counting(0), lambda: OtherSpaceEnv(1)], para_mode="dummy")


def test_one_action_where_a_batch_is_due_is_a_type_error(make_penv):
    penv = make_penv([counting(i) for i in range(2)])
    penv.reset(seed=0)
    with pytest.raises(TypeError, match=r"actions is the single value .*expected a batch of shape \(2,\)"):
        penv.step(np.int64(1))
    penv.step(np.ones(2, dtype=np.int64))  # nothing was sent: the envs still step


def test_a_busy_error_names_a_few_envs_not_all_of_them(no_leaks):
    with ParallelEnv([counting(i) for i in range(20)], para_mode="dummy") as penv:
        penv.reset(seed=0)
        penv.send(np.ones(20, dtype=np.int64))
        with pytest.raises(parallelenv.AlreadyPendingError, match=r"send to 20 envs \(\[0, 1, 2, 3, 4, 5, 6, 7, \.\.\.\]\)"):
            penv.send(np.ones(20, dtype=np.int64))
        penv.recv()


@pytest.mark.parametrize(
    ("option", "value"), [("num_cpus", 0), ("num_cpus", "4"), ("call_timeout", 0), ("call_timeout", -1.0)]
)
def test_bad_numeric_options_are_refused(no_leaks, backend, option, value):
    with pytest.raises(ValueError, match=option):
        ParallelEnv([counting(0)], para_mode=backend, **{option: value})


# ---------------------------------------------------------------- warnings from inside envs


def test_env_warnings_are_silenced_by_default(make_penv):
    penv = make_penv([lambda i=i: WarningEnv(i) for i in range(2)])
    penv.reset(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        penv.step([0, 0])
    assert not [w for w in caught if "inside the env" in str(w.message)]


def test_env_warnings_reach_the_caller_with_no_warning_false_in_dummy(no_leaks):
    with ParallelEnv([lambda i=i: WarningEnv(i) for i in range(2)], para_mode="dummy", no_warning=False) as penv:
        penv.reset(seed=0)
        with pytest.warns(UserWarning, match="a warning from inside the env"):
            penv.step([0, 0])


def test_silencing_env_warnings_leaves_the_callers_filters_as_they_were(no_leaks):
    with ParallelEnv([lambda i=i: WarningEnv(i) for i in range(2)], para_mode="dummy") as penv:
        penv.reset(seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            before = list(warnings.filters)
            penv.step([0, 0])
            penv.step([0, 0])
            assert warnings.filters == before
            warnings.warn("the caller's own", UserWarning, stacklevel=1)
        assert [str(w.message) for w in caught] == ["the caller's own"]


def test_public_error_classes_form_one_hierarchy():
    # ClosedError and the other misuse errors: test_misuse_errors_are_also_gymnasiums_own
    for name in ("EnvError", "WorkerDiedError", "WorkerTimeoutError", "WorkerStartError"):
        assert issubclass(getattr(parallelenv, name), ParallelEnvError)
    assert issubclass(WorkerTimeoutError, WorkerDiedError)
    assert issubclass(parallelenv.WorkerStartError, WorkerDiedError)  # handlers of a death catch a failed start


# ---------------------------------------------------------------- one env given as several


SHARED_ENV = CountingEnv(9)


def shared_env() -> gym.Env:
    """The same env on every call: a module global, so one per process that imports this module."""
    return SHARED_ENV


@pytest.mark.parametrize("backend", ["dummy", "subproc"])
def test_factories_returning_the_same_env_are_refused(make_penv):
    # subproc: envs 0 and 1 share a worker (two workers for four envs), where the factory returns one env twice.
    with pytest.raises(ValueError) as caught:
        make_penv([shared_env, shared_env, counting(2), counting(3)])
    error = caught.value
    if isinstance(error, EnvError):  # refused in a worker: reported as that env's, of our own check's type
        assert (error.env_index, error.method, error.exc_type) == (1, "make", "parallelenv.errors.SharedEnvError")
        message = error.message
    else:  # refused in the caller
        assert isinstance(error, SharedEnvError)
        message = str(error)
    assert "env 1 is the same env instance as env 0" in message
    assert "each entry of envs needs its own env" in message
    # make_penv's teardown checks that no worker or shared memory outlived the refusal


@pytest.mark.parametrize("shape", ["instance twice", "factories of one instance", "one env under a wrapper"])
def test_one_env_instance_given_twice_is_refused_in_dummy(no_leaks, shape):
    env = CountingEnv(0)
    envs = {
        "instance twice": [CountingEnv(1), env, env],
        "factories of one instance": [CountingEnv(1), lambda: env, lambda: env],
        "one env under a wrapper": [CountingEnv(1), env, lambda: gym.wrappers.TimeLimit(env, 5)],
    }[shape]
    with pytest.raises(SharedEnvError, match="env 2 is the same env instance as env 1") as caught:
        ParallelEnv(envs, para_mode="dummy")
    assert isinstance(caught.value, ValueError)  # as SB3's DummyVecEnv refuses it


# ---------------------------------------------------------------- what except clauses written for Gymnasium catch


def refuse(env: gym.Env, *ids: Any) -> None:  # the tensor backend passes the ids of its batch too
    raise ValueError("refused on purpose")


def look_up(env: gym.Env, *ids: Any) -> None:
    raise KeyError("missing")


def test_env_error_is_also_the_built_in_exception_the_env_raised(make_penv):
    penv = make_penv([method_env(0), method_env(1)])
    penv.reset(seed=0)
    with pytest.raises(ValueError, match="refused on purpose") as caught:  # Gymnasium re-raises the env's own type
        penv.customized_method(refuse)
    assert isinstance(caught.value, EnvError) and caught.value.exc_type == "ValueError"
    with pytest.raises(ZeroDivisionError):
        penv.customized_method("divide", data=[0, 0])
    with pytest.raises(KeyError) as caught:
        penv.customized_method(look_up, id=[1])
    assert str(caught.value) == "env 1 raised KeyError in look_up(): 'missing'"  # not quoted, as KeyError's own str is


def test_env_errors_for_other_exception_types_are_plain_env_errors():
    assert type(EnvError.of(1, "make", "OSError", "no display", "Traceback ...")) is EnvError
    assert type(EnvError.of(1, "step", "gymnasium.error.InvalidAction", "no", "Traceback ...")) is EnvError
    error = EnvError.of(2, "step", "IndexError", "out", "Traceback ...")
    error.results = {0: 5}
    assert type(error) is parallelenv.errors.EnvIndexError and isinstance(error, IndexError)
    copied = pickle.loads(pickle.dumps(error))
    assert type(copied) is type(error) and str(copied) == str(error)
    assert (copied.env_index, copied.method, copied.exc_type, copied.results) == (2, "step", "IndexError", {0: 5})


def test_misuse_errors_are_also_gymnasiums_own(no_leaks):
    penv = ParallelEnv([counting(0), counting(1)], para_mode="dummy", asynchronous="restart")
    penv.reset(seed=0)
    with pytest.raises(gym.error.NoAsyncCallError):
        penv.recv()
    penv.send([0, 0])
    with pytest.raises(gym.error.AlreadyPendingCallError) as caught:
        penv.send([1, 1])
    assert caught.value.name == "step"
    penv.recv()
    penv.close()
    with pytest.raises(gym.error.ClosedEnvironmentError):
        penv.reset()
    for ours, theirs in [(parallelenv.ClosedError, gym.error.ClosedEnvironmentError),
                         (parallelenv.AlreadyPendingError, gym.error.AlreadyPendingCallError),
                         (parallelenv.NoPendingCallError, gym.error.NoAsyncCallError)]:
        assert issubclass(ours, ParallelEnvError) and issubclass(ours, theirs)


# ---------------------------------------------------------------- helpers for scripts run as __main__


def orphaned(segments: set[str]) -> set[str]:
    """The segments whose creator (named in them) is gone: a test running beside this one holds its own."""
    return {name for name in segments if not psutil.pid_exists(int(name[len(NAME_PREFIX):].split("_")[0]))}


def penv_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(NAME_PREFIX)}
    except FileNotFoundError:
        return set()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
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


# ---------------------------------------------------------------- every exception of ours crosses a process whole


# Constructor arguments of the classes whose __init__ takes more than a message. A new class of
# that kind fails test_every_exception_of_ours_pickles_with_every_field until it has an entry here.
EXAMPLE_ARGS: dict[str, tuple[Any, ...]] = {
    "RemoteTraceback": ("Traceback (most recent call last): ...",),
    "WorkerDiedError": ([0, 1, 2, 5], "exit code -9 (SIGKILL)"),
    "WorkerTimeoutError": ([3], "it did not answer within call_timeout and was killed"),
    "WorkerStartError": ([0, 1], "they ask 8 CPUs", {"CPU": 8.0}, {"CPU": 2.0}, {"CPU": 0.0}),
    "PoolWorkerError": (1, [2, 3], "collecting 8 steps", "ValueError", "bad", "Traceback ..."),
    "SpaceMismatch": (1, "observation space", spaces.Discrete(3), 0, spaces.Discrete(2)),
    "AlreadyPendingError": ("envs [0] have a call pending", "reset"),
    "NoPendingCallError": ("no call pending", "reset"),
}
for _kind in parallelenv.errors.BUILT_IN_KINDS.values():
    EXAMPLE_ARGS[_kind.__name__] = (3, "step", "ValueError", "bad action", "Traceback ...")
EXAMPLE_ARGS["EnvError"] = (3, "step", "OSError", "no display", "Traceback ...")


def our_exception_classes() -> list[type[BaseException]]:
    """Every exception and warning class defined in the package, found by walking its modules."""
    import importlib
    import inspect
    import pkgutil

    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(parallelenv.__path__, "parallelenv."):
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:  # an optional extra (torch, a framework) is missing: its classes are not ours to run
            continue
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def test_every_exception_of_ours_pickles_with_every_field():
    classes = our_exception_classes()
    names = {kind.__name__ for kind in classes}
    assert {"WorkerDiedError", "WorkerTimeoutError", "WorkerStartError", "PoolWorkerError", "EnvKeyError"} <= names
    for kind in classes:
        args = EXAMPLE_ARGS.get(kind.__name__, ("what went wrong",))
        try:
            error = kind(*args)
        except TypeError as refused:
            pytest.fail(f"{kind.__qualname__} needs other arguments ({refused}): add an entry to EXAMPLE_ARGS")
        error.__dict__["added_after_init"] = [1, 2]  # a field set after __init__ (EnvError.results) travels too
        copied = pickle.loads(pickle.dumps(error))
        assert type(copied) is kind
        assert str(copied) == str(error) and copied.args == error.args, kind
        assert copied.__dict__ == error.__dict__, kind
        if isinstance(error.__cause__, RemoteTraceback):  # the remote traceback still prints as the cause
            assert copied.__cause__.traceback_text == error.__cause__.traceback_text


def test_worker_died_and_timeout_errors_cross_a_process_whole():
    # The errors Ray failed to deserialize inside a framework's runner: raised in a child, read here.
    script = (
        "import pickle, sys\n"
        "from parallelenv import WorkerStartError\n"
        "sys.stdout.buffer.write(pickle.dumps(WorkerStartError([0, 1], 'they ask 8 CPUs', {'CPU': 8.0})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True)
    error = pickle.loads(done.stdout)
    assert isinstance(error, WorkerDiedError) and type(error) is parallelenv.WorkerStartError
    assert (error.env_indices, error.reason, error.asked) == ([0, 1], "they ask 8 CPUs", {"CPU": 8.0})
    assert "did not start" in str(error) and "died" not in str(error)
