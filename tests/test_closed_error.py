"""A call after ``close()`` raises ClosedError, whose message says how to go on: a new one, and ``with``."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest

from parallelenv import ClosedError, ParallelEnv


@pytest.mark.timeout(60)
def test_closed_error_says_to_make_a_new_one_and_that_with_closes_it(no_leaks):
    penv = ParallelEnv([lambda: gym.make("CartPole-v1")] * 2)
    penv.close()
    with pytest.raises(ClosedError) as raised:
        penv.reset()
    message = str(raised.value)
    assert "make a new one" in message and "with ParallelEnv(...) as penv:" in message
    assert str(pickle.loads(pickle.dumps(raised.value))) == message  # it crosses processes whole


def test_closed_error_names_the_pool_for_a_pool():
    message = str(ClosedError("this RolloutPool is closed", what="RolloutPool"))
    assert "with RolloutPool(...) as pool:" in message
