"""TianshouVectorEnv: Tianshou's own collectors and replay buffers over a ParallelEnv, their buffers checked."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv

try:
    from tianshou.algorithm.algorithm_base import Policy
    from tianshou.data import AsyncCollector, Batch, Collector, VectorReplayBuffer
except ImportError as missing:  # not installed, or installed without what it imports
    pytest.skip(f"Tianshou does not import here: {missing}", allow_module_level=True)

from parallelenv.integrations.tianshou import TianshouVectorEnv  # noqa: E402

# Tianshou works on NumPy arrays; the Ray backends run the same adapter code as subproc.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]

CART_LIMITS = np.array([2.4, np.inf, 12 * 2 * np.pi / 360, np.inf])  # CartPole's termination bounds


def counting_envs(n: int) -> list:
    """Env ``i`` tagged ``i``, episodes of 3 to 6 steps, ended by termination or truncation in turn."""
    return [functools.partial(CountingEnv, tag=i, episode_length=3 + i % 4, terminate=i % 2 == 0) for i in range(n)]


class RandomPolicyWithEntry(Policy):
    """Random Discrete actions, each with a policy entry and a hidden state: Tianshou 2.0.1's AsyncCollector
    indexes both by env and fails on a policy without them (and so with random=True)."""

    def __init__(self, action_space: gym.spaces.Discrete) -> None:
        super().__init__(action_space=action_space)
        self.rng = np.random.default_rng(0)

    def forward(self, batch, state=None, **kwargs):
        n = len(batch.obs)
        act = self.rng.integers(0, self.action_space.n, size=n)
        return Batch(act=act, state=np.zeros((n, 1)), policy=Batch(draw=np.zeros(n)))


def collect(envs: TianshouVectorEnv, n_step: int, collector_class: type = Collector) -> VectorReplayBuffer:
    """A buffer of ``n_step`` random steps collected by Tianshou's own collector, one sub-buffer per env."""
    buffer = VectorReplayBuffer(total_size=2 * n_step, buffer_num=len(envs))
    action_space = envs.get_env_attr("action_space", id=0)[0]
    collector = collector_class(RandomPolicyWithEntry(action_space), envs, buffer)
    collector.reset(gym_reset_kwargs={"seed": 0})
    stats = collector.collect(n_step=n_step, random=collector_class is Collector)
    assert stats.n_collected_steps >= n_step
    return buffer


def transitions(buffer: VectorReplayBuffer, env: int):
    """Env ``env``'s transitions, in the order they were added."""
    sub = buffer.buffers[env]
    assert len(sub) < sub.maxsize  # nothing overwritten: the order of the indices is the order of the steps
    return sub[np.arange(len(sub))]


def check_counting_buffer(buffer: VectorReplayBuffer, n: int) -> int:
    """Every sub-buffer holds its own env's episodes, each from its reset obs to its real last obs."""
    episodes = 0
    for i in range(n):
        batch = transitions(buffer, i)
        length, terminates = 3 + i % 4, i % 2 == 0
        np.testing.assert_array_equal(batch.obs[:, 0], i)  # no env's step in another env's buffer
        np.testing.assert_array_equal(batch.obs_next[:, 0], i)
        np.testing.assert_array_equal(batch.obs_next[:, 1], batch.obs[:, 1] + 1)
        np.testing.assert_array_equal(batch.obs_next[:, 2], batch.act)  # the action each env was given
        np.testing.assert_array_equal(batch.rew, i * 10 + batch.obs_next[:, 1])
        ends = batch.obs_next[:, 1] == length
        np.testing.assert_array_equal(batch.terminated, ends & terminates)
        np.testing.assert_array_equal(batch.truncated, ends & (not terminates))
        # Within an episode, a step starts where the one before ended; after an end, from a reset obs.
        starts = np.concatenate([[True], ends[:-1]])
        np.testing.assert_array_equal(batch.obs[~starts], batch.obs_next[np.flatnonzero(~starts) - 1])
        np.testing.assert_array_equal(batch.obs[starts][:, 1:3], [[0, -1]] * starts.sum())
        episodes += int(ends.sum())
    return episodes


@pytest.mark.timeout(180)
def test_collector_over_8000_cartpole_steps_fills_a_consistent_buffer(make_penv):
    envs = TianshouVectorEnv(make_penv([lambda: gym.make("CartPole-v1")] * 8, asynchronous="idle"))
    buffer = collect(envs, 8000)
    envs.close()
    episodes = terminated_episodes = 0
    for i in range(8):
        batch = transitions(buffer, i)
        done = batch.terminated | batch.truncated
        np.testing.assert_array_equal(batch.done, done)
        starts = np.concatenate([[True], done[:-1]])
        # Within an episode, a step's obs is the obs_next of the step before.
        np.testing.assert_array_equal(batch.obs[~starts], batch.obs_next[np.flatnonzero(~starts) - 1])
        # Episodes start from a reset obs (CartPole draws each component from [-0.05, 0.05]), not a last obs.
        assert np.abs(batch.obs[starts]).max() <= 0.05
        # A terminated episode ends out of bounds, on its real last obs; no other step does.
        out = (np.abs(batch.obs_next) > CART_LIMITS).any(axis=1)
        np.testing.assert_array_equal(out, batch.terminated)
        assert not batch.truncated.any()  # random play does not last 500 steps
        episodes += int(done.sum())
        terminated_episodes += int(batch.terminated.sum())
    assert terminated_episodes == episodes > 300


@pytest.mark.parametrize("asynchronous", ["idle", "continue"])
def test_every_env_keeps_its_own_episodes_in_its_own_buffer(make_penv, asynchronous):
    envs = TianshouVectorEnv(make_penv(counting_envs(6), asynchronous=asynchronous))
    buffer = collect(envs, 1200)
    envs.close()
    assert check_counting_buffer(buffer, 6) > 200


@pytest.mark.timeout(120)
def test_async_collector_gets_the_envs_that_answered(make_penv):
    envs = TianshouVectorEnv(make_penv(counting_envs(6), asynchronous="idle"), wait_num=3)
    assert envs.is_async
    with pytest.warns(UserWarning, match="extra transitions"):
        buffer = collect(envs, 600, AsyncCollector)
    envs.close()
    assert check_counting_buffer(buffer, 6) > 100


def test_what_tianshou_reads_is_in_its_form(make_penv):
    envs = TianshouVectorEnv(make_penv(counting_envs(4), asynchronous="idle"))
    assert len(envs) == 4 and not envs.is_async
    spaces = envs.action_space
    assert isinstance(spaces, list) and len(spaces) == 4 and all(s == gym.spaces.Discrete(5) for s in spaces)
    obs, info = envs.reset(env_id=[3, 1], seed=7)
    np.testing.assert_array_equal(obs[:, 0], [3, 1])
    assert info.dtype == object and info.shape == (2,) and set(info[0]) == {"seed_draw"}
    again, _ = envs.reset(env_id=[3, 1], seed=7)
    np.testing.assert_array_equal(again, obs)  # env i gets seed + i, whichever envs are reset with it
    envs.reset()
    obs, reward, terminated, truncated, info = envs.step(np.array([2, 4]), id=np.array([0, 2]))
    np.testing.assert_array_equal(obs[:, :3], [[0, 1, 2], [2, 1, 4]])
    np.testing.assert_array_equal(reward, [1.0, 21.0])
    assert terminated.dtype == truncated.dtype == bool
    assert [entry["env_id"] for entry in info] == [0, 2]
    assert envs.get_env_attr("tag", id=2) == [2]
    envs.set_env_attr("gravity", 1.0, id=[1])
    assert envs.get_env_attr("gravity") == [9.8, 1.0, 9.8, 9.8]
    assert envs.seed(5) == [[5], [6], [7], [8]]
    envs.close()
    envs.close()


@pytest.mark.parametrize("asynchronous", ["restart", None])
def test_a_policy_that_resets_behind_tianshous_back_is_refused(make_penv, asynchronous):
    with pytest.raises(ValueError, match="asynchronous='idle'"):
        TianshouVectorEnv(make_penv(counting_envs(2), asynchronous=asynchronous))
