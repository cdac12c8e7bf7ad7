"""``gym.make_vec`` with the vector entry point returns the Gymnasium view of a ParallelEnv, on every CPU backend."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import BUILDS, assert_gone, build
from gymnasium.vector import AutoresetMode

from parallelenv import VECTOR_ENV_ID, register_vector_env
from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

CPU_BACKENDS = ("dummy", "subproc", "ray", "ray-subproc")


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request: pytest.FixtureRequest, no_leaks: None) -> str:
    if build(request.param).needs == "ray":
        request.getfixturevalue("ray_session")
    return request.param


def backend_options(para_mode: str, num_envs: int) -> dict:
    """The suite's options for ``para_mode`` (a few workers or actors, several envs each)."""
    options = dict(BUILDS[para_mode].options)
    for groups in ("num_workers", "num_actors"):
        if groups in options:
            options[groups] = min(options[groups], num_envs)
    return options


def run(envs: gym.vector.VectorEnv, steps: int) -> list:
    """What ``envs`` returns over ``steps`` steps of seeded random actions after ``reset(seed=3)``."""
    rng = np.random.default_rng(0)
    results = [envs.reset(seed=3)[0]]
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = envs.step(rng.integers(0, 2, size=envs.num_envs))
        results.append((obs, reward, terminated, truncated))
    return results


@pytest.mark.timeout(180)
def test_make_vec_returns_our_view_and_steps_as_sync_vector_env(cpu_backend):
    envs = gym.make_vec(
        VECTOR_ENV_ID,
        num_envs=8,
        vectorization_mode="vector_entry_point",
        env_id="CartPole-v1",
        para_mode=cpu_backend,
        backend_options=backend_options(cpu_backend, 8),
    )
    try:
        assert isinstance(envs, GymnasiumVectorEnv)
        assert envs.penv.para_mode == cpu_backend and len(envs.penv) == 8
        assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP  # Gymnasium's default
        assert envs.spec.id == VECTOR_ENV_ID and envs.spec.kwargs["env_id"] == "CartPole-v1"
        started = envs.penv.backend.pids()
        ours = run(envs, 120)
    finally:
        envs.close()
    assert_gone(started)
    sync_envs = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    theirs = run(sync_envs, 120)
    sync_envs.close()
    np.testing.assert_array_equal(ours[0], theirs[0])
    ended = 0
    for step, (mine, sync) in enumerate(zip(ours[1:], theirs[1:], strict=True)):
        for a, b in zip(mine, sync, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
        ended += int(mine[2].sum() + mine[3].sum())
    assert ended > 0  # some episodes ended and were reset in the next step, as SyncVectorEnv does


def test_a_registered_id_takes_its_defaults_and_make_vecs_overrides(no_leaks):
    register_vector_env("ParallelEnvTests/ShortCartPole-v0", env_id="CartPole-v1", max_episode_steps=5)
    try:
        # No vectorization_mode: an id with only a vector entry point takes it.
        envs = gym.make_vec("ParallelEnvTests/ShortCartPole-v0", num_envs=2)
        assert envs.penv.para_mode == "dummy"
        envs.reset(seed=0)
        truncated = [envs.step(np.zeros(2, dtype=np.int64))[3] for _ in range(5)]
        envs.close()
        assert truncated[-1].all() and not np.any(truncated[:-1])  # gym.make got max_episode_steps
        envs = gym.make_vec(
            "ParallelEnvTests/ShortCartPole-v0",
            num_envs=4,
            vectorization_mode="vector_entry_point",
            para_mode="subproc",
            backend_options={"num_workers": 2},
            autoreset_mode="SameStep",
            call_timeout=30,
        )
        assert envs.penv.para_mode == "subproc" and len(envs.penv.backend.pids()) == 2
        assert envs.penv.asynchronous == "restart" and envs.penv.call_timeout == 30
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        envs.reset(seed=0)
        for _ in range(5):
            *_, info = envs.step(np.zeros(4, dtype=np.int64))
        envs.close()
        assert info["_final_obs"].all()  # reset in the step that ended them
    finally:
        del gym.registry["ParallelEnvTests/ShortCartPole-v0"]


@pytest.mark.parametrize(
    ("options", "asynchronous", "mode"),
    [
        ({}, "idle", AutoresetMode.NEXT_STEP),
        ({"autoreset_mode": AutoresetMode.DISABLED}, "idle", AutoresetMode.DISABLED),
        ({"autoreset_mode": "SameStep"}, "restart", AutoresetMode.SAME_STEP),
        ({"asynchronous": "continue"}, "continue", AutoresetMode.NEXT_STEP),
        ({"asynchronous": "restart"}, "restart", AutoresetMode.SAME_STEP),
    ],
)
def test_the_autoreset_mode_and_the_policy_follow_each_other(no_leaks, options, asynchronous, mode):
    envs = gym.make_vec(VECTOR_ENV_ID, num_envs=2, env_id="CartPole-v1", **options)
    envs.close()
    assert envs.penv.asynchronous == asynchronous
    assert envs.metadata["autoreset_mode"] is mode


def test_bad_requests_are_refused_and_leave_nothing(no_leaks):
    with pytest.raises(ValueError, match="env_id="):
        gym.make_vec(VECTOR_ENV_ID, num_envs=2)
    with pytest.raises(ValueError, match="is not what asynchronous='restart' does"):
        gym.make_vec(
            VECTOR_ENV_ID, num_envs=2, env_id="CartPole-v1", para_mode="subproc", asynchronous="restart",
            autoreset_mode="NextStep",
        )
    with pytest.raises(ValueError, match="NotAMode"):
        gym.make_vec(VECTOR_ENV_ID, num_envs=2, env_id="CartPole-v1", autoreset_mode="NotAMode")


@pytest.mark.timeout(60)
def test_the_id_is_there_after_import_and_through_gymnasiums_module_prefix_without_ray_or_torch():
    script = (
        "import sys, gymnasium as gym\n"
        "envs = gym.make_vec('parallelenv:parallelenv/ParallelEnv-v0', num_envs=2, env_id='CartPole-v1')\n"
        "envs.reset(seed=0); envs.step(envs.action_space.sample()); envs.close()\n"
        "assert type(envs).__name__ == 'GymnasiumVectorEnv', type(envs)\n"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-W", "error", "-c", script], check=True, timeout=50)
