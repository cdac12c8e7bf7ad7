"""``ParallelEnv.make`` and ``gym.make_vec`` send each keyword where it is taken (parallelenv/make_options.py).

ParallelEnv's own arguments go to it, an option the backend names to the
backend, the rest to ``gym.make`` of each env; a keyword that neither the
backend nor ``gym.make`` takes is refused before any worker starts.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from parallelenv import VECTOR_ENV_ID, ParallelEnv
from parallelenv.make_options import backend_keywords, env_keywords


def workers_of(penv: ParallelEnv) -> int:
    return len(set(penv.backend.env_pids()))


@pytest.mark.timeout(120)
def test_a_backend_option_given_to_make_reaches_the_backend(no_leaks):
    with ParallelEnv.make("CartPole-v1", 4, "subproc", num_workers=2) as penv:
        assert workers_of(penv) == 2
        penv.reset(seed=0)
        penv.step(np.zeros(4, dtype=np.int64))


@pytest.mark.timeout(120)
def test_backend_options_and_gym_make_keywords_go_each_their_way(no_leaks):
    with ParallelEnv.make("CartPole-v1", 4, "subproc", num_workers=2, max_episode_steps=3,
                          asynchronous="idle") as penv:
        assert workers_of(penv) == 2
        penv.reset(seed=0)
        for _ in range(3):
            obs, reward, terminated, truncated, info = penv.step(np.zeros(4, dtype=np.int64))
        assert truncated.all()  # gym.make's TimeLimit of 3 steps, in every worker


@pytest.mark.timeout(60)
def test_an_option_no_one_takes_is_refused_before_the_backend_is_built(no_leaks):
    # num_workers=99 is more workers than envs: the backend refuses it first thing, before it starts
    # any worker. A TypeError about the other keyword instead says that the backend was never built.
    with pytest.raises(TypeError) as refused:
        ParallelEnv.make("CartPole-v1", 4, "subproc", num_workers=99, no_such_option=1)
    message = str(refused.value)
    assert "no_such_option=1" in message and "backend_options" in message
    assert "para_mode='subproc'" in message and "num_workers" in message  # the backend and what it takes
    assert "gym.make('CartPole-v1')" in message and "max_episode_steps" in message  # and gym.make


@pytest.mark.timeout(60)
def test_a_backend_option_given_twice_is_refused(no_leaks):
    with pytest.raises(TypeError, match="num_workers is given twice"):
        ParallelEnv.make("CartPole-v1", 4, "subproc", num_workers=2, backend_options={"num_workers": 2})


@pytest.mark.timeout(60)
def test_an_option_of_another_backend_is_refused_naming_what_this_one_takes(no_leaks):
    with pytest.raises(TypeError, match=r"num_workers=2 is taken neither by para_mode='dummy' \(it takes no options"):
        ParallelEnv.make("CartPole-v1", 4, "dummy", num_workers=2)
    # Refused from the factory's signature: no Ray cluster is started to find out.
    with pytest.raises(TypeError, match=r"num_workers_per_actor=2 is taken neither by para_mode='ray'"):
        ParallelEnv.make("CartPole-v1", 2, "ray", num_workers_per_actor=2)


@pytest.mark.timeout(120)
def test_make_vec_sends_a_backend_option_to_the_backend(no_leaks):
    envs = gym.make_vec(VECTOR_ENV_ID, num_envs=4, vectorization_mode="vector_entry_point",
                        env_id="CartPole-v1", para_mode="subproc", num_workers=2)
    try:
        assert workers_of(envs.penv) == 2
        envs.reset(seed=0)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_make_vec_refuses_an_option_no_one_takes_before_the_backend_is_built(no_leaks):
    with pytest.raises(TypeError) as refused:
        gym.make_vec(VECTOR_ENV_ID, num_envs=4, vectorization_mode="vector_entry_point",
                     env_id="CartPole-v1", para_mode="subproc", num_workers=99, no_such_option=1)
    assert "no_such_option=1" in str(refused.value) and "backend_options" in str(refused.value)


def test_each_builtin_backend_names_its_options():
    assert {"num_workers", "start_method"} <= backend_keywords("subproc")
    assert {"num_actors", "num_workers_per_actor", "actor_options"} <= backend_keywords("ray-subproc")
    assert "actor_options" in backend_keywords("ray") and "num_actors" not in backend_keywords("ray")
    assert backend_keywords("dummy") == frozenset()


def _open_env(**kwargs):
    return gym.make("CartPole-v1")


def test_an_env_that_takes_any_keyword_gets_every_unclaimed_one():
    gym.register("parallelenv-tests/OpenCartPole-v0", entry_point=_open_env)
    try:
        assert env_keywords("parallelenv-tests/OpenCartPole-v0", None) is None
    finally:
        del gym.registry["parallelenv-tests/OpenCartPole-v0"]
    assert {"render_mode", "max_episode_steps", "disable_env_checker"} <= env_keywords("CartPole-v1", None)
    assert env_keywords("NoSuchEnv-v0", None) is None  # the workers' gym.make says what is wrong
