"""RLlib's env runners (new API stack) take our vector entry point with no glue, and record whole episodes.

RLlib 2.60 pins gymnasium 1.2.2, which our pins rule out: these tests skip in
the main venv and run in their own (``make test-frameworks``).
"""

from __future__ import annotations

import numpy as np
import pytest

try:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env
except ImportError as missing:  # not installed, or installed without what it imports (ray.tune's pyarrow)
    pytest.skip(f"RLlib does not import here: {missing}", allow_module_level=True)

from parallelenv import ParallelEnv  # noqa: E402

# Gymnasium's module prefix imports parallelenv, which registers the id, in every env runner.
ENV = "parallelenv:parallelenv/ParallelEnv-v0"
CART_LIMITS = np.array([2.4, np.inf, 12 * 2 * np.pi / 360, np.inf])  # CartPole's termination bounds
# Inside a remote env runner, which holds one of the session's two CPUs, ray-subproc gets the other.
INSIDE = {
    "subproc": {"backend_options": {"num_workers": 2}},
    "ray-subproc": {"num_cpus": 1, "backend_options": {"num_actors": 1, "num_workers_per_actor": 2}},
}


def count_episode(*, episode, metrics_logger, prev_episode_chunks=None, **kwargs) -> None:
    """Count, where RLlib recorded them, the episodes that start from a reset obs and the terminated
    ones that end out of bounds (a reset obs recorded as a last obs is within them)."""
    first = prev_episode_chunks[0] if prev_episode_chunks else episode
    start, last = np.asarray(first.get_observations(0)), np.asarray(episode.get_observations(-1))
    metrics_logger.log_value("pe_episodes", 1, reduce="sum")
    metrics_logger.log_value("pe_reset_starts", int(first.t_started == 0 and np.abs(start).max() <= 0.05), reduce="sum")
    if episode.is_terminated:
        metrics_logger.log_value("pe_terminated", 1, reduce="sum")
        metrics_logger.log_value("pe_terminated_out", int((np.abs(last) > CART_LIMITS).any()), reduce="sum")


def ppo(env: str, env_config: dict, num_env_runners: int) -> PPOConfig:
    """One small PPO iteration's config over ``env`` with 4 envs per env runner."""
    return (
        PPOConfig()
        .environment(env, env_config=env_config)
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=4,
            num_cpus_per_env_runner=1,
            gym_env_vectorize_mode="vector_entry_point",
        )
        .training(train_batch_size_per_learner=2000, minibatch_size=500, num_epochs=1)
        .callbacks(on_episode_end=count_episode)
        .debugging(seed=0)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_env_runners", [0, 1], ids=["local-runner", "remote-runner"])
@pytest.mark.parametrize("para_mode", ["subproc", "ray-subproc"])
def test_ppo_trains_on_whole_episodes_through_our_entry_point(ray_session, no_leaks, para_mode, num_env_runners):
    env_config = {"env_id": "CartPole-v1", "para_mode": para_mode, **INSIDE[para_mode]}
    algo = ppo(ENV, env_config, num_env_runners).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    counts = result["env_runners"]
    assert counts["num_env_steps_sampled"] >= 2000
    assert counts["pe_reset_starts"] == counts["pe_episodes"] > 50
    assert counts["pe_terminated_out"] == counts["pe_terminated"] > 50


def test_a_mode_rllib_does_not_expect_is_refused_through_our_entry_point(ray_session, no_leaks):
    env_config = {"env_id": "CartPole-v1", "para_mode": "dummy", "autoreset_mode": "SameStep"}
    with pytest.raises(ValueError, match="RLlib's SingleAgentEnvRunner steps its vector env as"):
        ppo(ENV, env_config, 0).build_algo()


def restarting_view(config: dict):
    """A creator of the README's kind: the view of a ParallelEnv that restarts envs (SAME_STEP)."""
    return ParallelEnv.make("CartPole-v1", config["num_envs"], "dummy", asynchronous="restart").as_gymnasium()


def test_a_mode_rllib_does_not_expect_is_refused_from_a_creator_of_ones_own(ray_session, no_leaks):
    register_env("parallelenv-restarting-cartpole", restarting_view)
    with pytest.raises(ValueError, match="RLlib's SingleAgentEnvRunner steps its vector env as"):
        ppo("parallelenv-restarting-cartpole", {}, 0).build_algo()
