"""penv.as_gymnasium(): a real gymnasium.vector.VectorEnv that Gymnasium's vector wrappers accept."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs import RenderingEnv, counting
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.wrappers.vector import (
    ClipAction,
    DictInfoToList,
    NormalizeObservation,
    NormalizeReward,
    RecordEpisodeStatistics,
    RescaleObservation,
)

from parallelenv import ClosedError, EnvError
from parallelenv.arguments import env_seeds

# The tensor backend is left out: the Gymnasium view hands NumPy arrays to NumPy wrappers.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]


def plain_loop_episodes(actions: np.ndarray, seed: int, next_step: bool) -> list[tuple[int, int, float, int]]:
    """``(step, env, return, length)`` of each CartPole episode, one env at a time.

    With ``next_step`` the step after an episode's end resets the env and
    ignores its action, as Gymnasium's NEXT_STEP autoreset does.
    """
    num_steps, num_envs = actions.shape
    episodes = []
    for i, env_seed in enumerate(env_seeds(seed, np.arange(num_envs))):
        env = gym.make("CartPole-v1")
        env.reset(seed=env_seed)
        total, length, pending_reset = 0.0, 0, False
        for t in range(num_steps):
            if pending_reset:
                env.reset()
                pending_reset = False
                continue
            _, reward, terminated, truncated, _ = env.step(int(actions[t, i]))
            total, length = total + reward, length + 1
            if terminated or truncated:
                episodes.append((t, i, total, length))
                total, length = 0.0, 0
                if next_step:
                    pending_reset = True
                else:
                    env.reset()
        env.close()
    return sorted(episodes)


@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_record_episode_statistics_matches_a_plain_loop(make_penv, asynchronous):
    actions = np.random.default_rng(3).integers(0, 2, size=(120, 3))
    envs = RecordEpisodeStatistics(make_penv([lambda: gym.make("CartPole-v1")] * 3, asynchronous=asynchronous).as_gymnasium())
    envs.reset(seed=5)
    seen = []
    for t, step_actions in enumerate(actions):
        *_, info = envs.step(step_actions)
        if "episode" in info:
            for i in np.flatnonzero(info["_episode"]):
                seen.append((t, int(i), float(info["episode"]["r"][i]), int(info["episode"]["l"][i])))
    expected = plain_loop_episodes(actions, seed=5, next_step=asynchronous != "restart")
    assert len(expected) > 8
    assert sorted(seen) == expected
    assert list(envs.return_queue) == [r for _, _, r, _ in sorted(seen)][-len(envs.return_queue):]


def test_restart_is_same_step_autoreset_with_final_obs_and_final_info(make_penv):
    envs = make_penv([counting(0, 2), counting(1, 3)], asynchronous="restart").as_gymnasium()
    assert isinstance(envs, VectorEnv) and envs.num_envs == 2
    assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    envs.reset(seed=0)
    envs.step(np.array([1, 1]))
    obs, reward, terminated, truncated, info = envs.step(np.array([3, 3]))
    np.testing.assert_array_equal(terminated, [True, False])
    np.testing.assert_array_equal(obs[:, 1], [0, 2])  # env 0 already began its next episode
    np.testing.assert_array_equal(info["_final_obs"], [True, False])
    assert info["final_obs"][0][1] == 2 and info["final_obs"][0][2] == 3
    assert info["final_info"]["count"][0] == 2 and info["final_info"]["_count"].tolist() == [True, False]
    assert info["count"].tolist()[1] == 2 and info["_count"].tolist() == [False, True]
    assert info["_seed_draw"].tolist() == [True, False]  # env 0's top-level info is its reset's, as in Gymnasium
    assert info["seed_draw"][0] == obs[0, 3]
    assert "ended_state" not in info and "reset" not in info and "reset_info" not in info


@pytest.mark.parametrize("asynchronous", ["idle", "continue"])
def test_idle_and_continue_are_next_step_autoreset(make_penv, asynchronous):
    envs = make_penv([counting(0, 2), counting(1, 3)], asynchronous=asynchronous).as_gymnasium()
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    envs.reset(seed=0)
    envs.step(np.array([1, 1]))
    obs, reward, terminated, truncated, info = envs.step(np.array([3, 3]))
    np.testing.assert_array_equal(terminated, [True, False])
    np.testing.assert_array_equal(obs[:, 1], [2, 2])  # env 0's real last obs
    obs, reward, terminated, truncated, info = envs.step(np.array([4, 4]))
    np.testing.assert_array_equal(obs[:, 1], [0, 3])  # env 0 reset, its action ignored
    np.testing.assert_array_equal(obs[:, 2], [-1, 4])
    np.testing.assert_array_equal(reward, [0.0, 13.0])
    np.testing.assert_array_equal(terminated, [False, True])
    assert info["_seed_draw"].tolist() == [True, False]  # the reset's info
    obs, *_ = envs.step(np.array([2, 2]))
    np.testing.assert_array_equal(obs[:, 1], [1, 0])


def test_observation_wrappers_work_in_next_step_mode_and_refuse_same_step(make_penv):
    envs = NormalizeObservation(make_penv([lambda: gym.make("CartPole-v1")] * 2, asynchronous="idle").as_gymnasium())
    envs.reset(seed=0)
    for _ in range(50):
        obs, *_ = envs.step(np.array([0, 1]))
    assert np.abs(obs).max() < 10
    with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP"):
        NormalizeObservation(make_penv([lambda: gym.make("CartPole-v1")] * 2, asynchronous="restart").as_gymnasium())


def test_call_get_attr_set_attr_and_render(make_penv):
    envs = make_penv([lambda: RenderingEnv(0), lambda: RenderingEnv(1)], asynchronous="restart").as_gymnasium()
    envs.reset(seed=0)
    assert envs.call("double", 3) == (6, 6)
    assert envs.call("double", x=2.5) == (5.0, 5.0)
    assert envs.call("tag") == (0, 1)  # an attribute comes back as it is
    assert envs.get_attr("tag") == (0, 1)
    envs.set_attr("gravity", 1.5)
    assert envs.get_attr("gravity") == (1.5, 1.5)
    envs.set_attr("gravity", [2.0, 3.0])
    assert envs.get_attr("gravity") == (2.0, 3.0)
    with pytest.raises(ValueError, match="set_attr\\('gravity'\\) got 3 values for 2 envs"):
        envs.set_attr("gravity", [1.0, 2.0, 3.0])
    assert envs.render_mode == "rgb_array"
    frames = envs.render()
    assert [frame[0, 0, 0] for frame in frames] == [0, 10]
    with pytest.raises(EnvError, match=r"env [01] raised AttributeError in nothing\(\)"):
        envs.call("nothing")


def test_bad_use_is_refused_clearly(make_penv):
    with pytest.raises(ValueError, match="asynchronous=None has no Gymnasium autoreset mode"):
        make_penv([counting(0)]).as_gymnasium()  # None is the default policy
    penv = make_penv([counting(0), counting(1)], asynchronous="restart")
    envs = penv.as_gymnasium()
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": np.array([True, False])})
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="actions has shape \\(3,\\); expected \\(2,\\)"):
        envs.step(np.array([0, 1, 2]))
    envs.close()
    assert envs.closed
    with pytest.raises(ClosedError):
        penv.reset()


def test_reward_action_and_info_wrappers_stack_on_the_view(make_penv):
    envs = make_penv([lambda: gym.make("Pendulum-v1")] * 2, asynchronous="idle").as_gymnasium()
    envs = RescaleObservation(NormalizeReward(ClipAction(envs)), min_obs=-np.ones(3, np.float32),
                              max_obs=np.ones(3, np.float32))
    stats = RecordEpisodeStatistics(envs)
    envs = DictInfoToList(stats)
    envs.reset(seed=0)
    for _ in range(210):  # Pendulum truncates at 200 steps
        obs, reward, terminated, truncated, infos = envs.step(np.full((2, 1), 5.0, np.float32))
        assert np.abs(obs).max() <= 1.0 + 1e-6
    assert isinstance(infos, list) and len(infos) == 2
    assert list(stats.length_queue) == [200, 200]
