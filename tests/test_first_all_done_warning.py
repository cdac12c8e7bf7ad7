"""Under ``asynchronous=None``, the first step past the end of the envs' episodes warns, on every backend."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from envs import counting

from parallelenv.errors import AllEnvsFinishedWarning, ParallelEnvWarning


def stepped_past(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, AllEnvsFinishedWarning)]


@pytest.mark.timeout(120)
def test_the_first_step_past_the_end_warns_once_naming_the_env(make_penv):
    penv = make_penv([counting(0, 5), counting(1, 5), counting(2, 2)])
    penv.reset(seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        penv.step([1, 1, 1])
        penv.step([1, 1, 1])  # env 2 ends its episode: real results, no warning yet
        assert stepped_past(record) == []
        _, reward, terminated, *_ = penv.step([1, 1, 1])  # None results only
        assert terminated.all() and (reward == 0).all()
        (message,) = stepped_past(record)
        penv.step([1, 1, 1])
        penv.step([1, 1, 1])
    assert len(stepped_past(record)) == 1  # not again in later steps
    assert message.startswith("every env is finished: env 2 finished")
    assert "asynchronous='restart'" in message and "'idle'" in message and "until reset()" in message


@pytest.mark.timeout(120)
def test_it_warns_again_past_the_next_ending_after_a_reset(make_penv):
    penv = make_penv([counting(0, 1), counting(1, 1), counting(2, 9)])
    for _ in range(2):
        penv.reset(seed=0)
        penv.step([1, 1, 1])  # envs 0 and 1 end together
        with pytest.warns(AllEnvsFinishedWarning, match=r"envs \[0, 1\] finished") as record:
            penv.step([1, 1, 1])
        assert len(record) == 1


@pytest.mark.timeout(120)
def test_a_loop_that_resets_when_an_env_finishes_never_sees_it(make_penv):
    penv = make_penv([counting(0, 2), counting(1, 3)])
    penv.reset(seed=0)
    for _ in range(12):  # warnings are errors in this suite
        *_, terminated, truncated, _ = penv.step([1, 1])
        if np.any(terminated | truncated):
            penv.reset()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", ["idle", "restart", "continue"])
def test_no_other_policy_warns(make_penv, asynchronous):
    penv = make_penv([counting(0, 1), counting(1, 1)], asynchronous=asynchronous)
    penv.reset(seed=0)
    for _ in range(4):  # warnings are errors in this suite
        penv.step([1, 1])


def test_it_names_the_users_line_and_can_be_filtered_as_ours(make_penv, backend):
    if backend == "tensor":
        pytest.skip("the suite's tensor ParallelEnv is called through a NumPy view of the tests' own")
    penv = make_penv([counting(0, 1), counting(1, 3)])
    penv.reset(seed=0)
    penv.step([1, 1])
    with pytest.warns(ParallelEnvWarning) as record:
        penv.send([1, 1])  # send is a step's first half: it finds the envs finished
    assert record[0].filename == __file__
    assert issubclass(record[0].category, UserWarning)
    penv.recv()
