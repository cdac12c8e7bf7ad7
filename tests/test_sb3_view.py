"""SB3VecEnv: a Stable-Baselines3 VecEnv over a ParallelEnv, checked against SB3's own DummyVecEnv."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv, FaultyEnv, RenderingEnv, counting

from parallelenv import ParallelEnv, SharedEnvError

try:
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecCheckNan, VecFrameStack, VecMonitor, VecNormalize
except ImportError as missing:  # not installed, or installed without what it imports
    pytest.skip(f"Stable-Baselines3 does not import here: {missing}", allow_module_level=True)

from parallelenv.integrations.sb3 import SB3VecEnv  # noqa: E402

# The tensor backend is left out: SB3 works on NumPy arrays.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def run(venv, actions: np.ndarray) -> list:
    """Everything a VecEnv returns for these actions, after seeding it with 3."""
    venv.seed(3)
    results = [venv.reset()]
    for step_actions in actions:
        venv.step_async(step_actions)
        results.append(venv.step_wait())
    return results


@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_same_results_as_sb3s_dummy_vec_env(make_penv, asynchronous):
    actions = np.random.default_rng(0).integers(0, 2, size=(80, 3))
    ours = run(SB3VecEnv(make_penv([cartpole] * 3, asynchronous=asynchronous)), actions)
    theirs = run(DummyVecEnv([cartpole] * 3), actions)
    np.testing.assert_array_equal(ours[0], theirs[0])
    ended = 0
    for (obs, reward, dones, infos), (obs2, reward2, dones2, infos2) in zip(ours[1:], theirs[1:], strict=True):
        np.testing.assert_array_equal(obs, obs2)
        np.testing.assert_array_equal(reward, reward2)
        np.testing.assert_array_equal(dones, dones2)
        for info, info2 in zip(infos, infos2, strict=True):
            assert info.keys() == info2.keys()
            assert info["TimeLimit.truncated"] == info2["TimeLimit.truncated"]
            if "terminal_observation" in info:
                np.testing.assert_array_equal(info["terminal_observation"], info2["terminal_observation"])
                ended += 1
    assert ended > 5


@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_reset_infos_follow_sb3s_dummy_vec_env(make_penv, asynchronous):
    factories = [counting(tag, length) for tag, length in enumerate([2, 3])]
    ours = SB3VecEnv(make_penv(factories, asynchronous=asynchronous))
    theirs = DummyVecEnv(factories)
    for venv in (ours, theirs):
        venv.seed(3)
        venv.reset()
    assert ours.reset_infos == theirs.reset_infos
    for _ in range(7):
        for venv in (ours, theirs):
            venv.step_async(np.array([1, 1]))
            *_, dones, _ = venv.step_wait()
        assert ours.reset_infos == theirs.reset_infos, dones
    assert all("seed_draw" in info for info in ours.reset_infos)


def test_sb3_vec_env_wrappers_work_on_the_view(make_penv):
    venv = VecMonitor(VecCheckNan(SB3VecEnv(make_penv([cartpole] * 2, asynchronous="restart")), raise_exception=True))
    venv = VecFrameStack(VecNormalize(venv, gamma=0.9), n_stack=2)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (2, 8)
    episodes = []
    for _ in range(60):
        obs, reward, dones, infos = venv.step(np.array([0, 1]))
        episodes += [info["episode"] for info in infos if "episode" in info]
    assert episodes and all(e["r"] == e["l"] for e in episodes)  # CartPole pays 1 a step
    assert venv.venv.obs_rms.count > 60


def test_attributes_methods_and_wrappers_by_index(make_penv):
    venv = SB3VecEnv(make_penv([counting(0), lambda: Monitor(counting(1)()), counting(2)], asynchronous="restart"))
    venv.reset()
    assert venv.get_attr("tag") == [0, 1, 2]
    assert venv.get_attr("tag", indices=[2, 0]) == [2, 0]
    venv.set_attr("gravity", 2.0, indices=1)
    assert venv.get_attr("gravity") == [9.8, 2.0, 9.8]
    assert venv.env_method("double", 4, indices=[0, 1]) == [8, 8]
    assert venv.env_method("double", x=1.5) == [3.0, 3.0, 3.0]
    assert venv.env_is_wrapped(Monitor) == [False, True, False]
    assert venv.env_is_wrapped(Monitor, indices=1) == [True]
    with pytest.raises(AttributeError, match="envs \\[0, 2\\] have no attribute 't_start'"):
        venv.get_attr("t_start")
    venv.close()


def test_render_tiles_the_envs_images(make_penv):
    venv = SB3VecEnv(make_penv([lambda: RenderingEnv(0), lambda: RenderingEnv(1)], asynchronous="restart"))
    venv.reset()
    assert venv.render_mode == "rgb_array"
    assert [image[0, 0, 0] for image in venv.get_images()] == [0, 10]
    assert venv.render().shape == (4, 3, 3)  # SB3 tiles the two 2x3 frames


def test_seeds_and_options_apply_to_the_next_reset_only(make_penv):
    venv = SB3VecEnv(make_penv([counting(0), counting(1)], asynchronous="restart"))
    venv.seed(5)
    first = venv.reset()
    second = venv.reset()
    venv.seed(5)
    venv.set_options({"start": 2})
    third = venv.reset()
    np.testing.assert_array_equal(first[:, 3], third[:, 3])
    assert not np.array_equal(first[:, 3], second[:, 3])
    np.testing.assert_array_equal(third[:, 1], [2, 2])
    np.testing.assert_array_equal(venv.reset()[:, 1], [0, 0])


def test_reset_cancels_a_step_in_flight(make_penv):
    venv = SB3VecEnv(make_penv([counting(0), counting(1)], asynchronous="restart"))
    venv.reset()
    venv.step_async(np.array([1, 2]))
    obs = venv.reset()
    np.testing.assert_array_equal(obs[:, 1], [0, 0])
    obs, *_ = venv.step(np.array([3, 3]))
    np.testing.assert_array_equal(obs[:, 1], [1, 1])


def test_the_none_policy_is_refused(no_leaks):
    with ParallelEnv([counting(0)], para_mode="dummy", asynchronous=None) as penv:
        with pytest.raises(ValueError, match="asynchronous=None has no SB3 equivalent"):
            SB3VecEnv(penv)


@pytest.fixture
def one_torch_thread():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two cores: the env workers need the other
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_ppo_learns_cartpole_through_the_view_over_subproc(no_leaks, one_torch_thread):
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    venv = VecMonitor(SB3VecEnv(ParallelEnv.make("CartPole-v1", num_envs=8, para_mode="subproc", asynchronous="restart")))
    try:
        venv.seed(0)
        model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, learning_rate=3e-3, gamma=0.98,
                    gae_lambda=0.8, ent_coef=0.0, policy_kwargs={"net_arch": [64, 64]}, seed=0, device="cpu")
        model.learn(40_000)
        mean_return, _ = evaluate_policy(model, venv, n_eval_episodes=16, deterministic=True)
    finally:
        venv.close()
    assert mean_return >= 150, f"PPO reached a mean return of {mean_return} only"


@pytest.mark.every_backend
def test_negative_indices_count_from_the_end_as_in_sb3(make_penv):
    venv = SB3VecEnv(make_penv([counting(0), counting(1), counting(2)], asynchronous="restart"))
    venv.reset()
    assert venv.env_method("set_wrapper_attr", "gravity", 1.5, indices=[0, -1]) == [True, True]
    assert venv.get_attr("gravity") == [1.5, 9.8, 1.5]
    assert venv.get_attr("tag", indices=[-1]) == [2]
    assert venv.get_attr("tag", indices=-2) == [1]
    venv.set_attr("gravity", 3.0, indices=-2)
    assert venv.get_attr("gravity", indices=range(-3, 0)) == [1.5, 3.0, 1.5]
    assert venv.env_is_wrapped(Monitor, indices=[-1]) == [False]
    with pytest.raises(IndexError, match="index -4 is out of range for 3 envs"):
        venv.get_attr("tag", indices=[-4])
    with pytest.raises(IndexError, match="index 3 is out of range for 3 envs"):
        venv.env_method("double", 1, indices=3)


# ---------------------------------------------------------------- one env given as several entries
# SB3's DummyVecEnv refuses it with a ValueError (SB3's test_vecenv_func_checker): stepped once per
# entry, one env would give every entry's results.


@pytest.mark.every_backend
@pytest.mark.parametrize("shape", ["instance twice", "instance and a wrapper of it"])
def test_one_env_instance_given_twice_is_refused_on_every_backend(make_penv, shape):
    env = CountingEnv(1)
    envs = {
        "instance twice": [counting(0), env, env],
        "instance and a wrapper of it": [counting(0), env, gym.wrappers.TimeLimit(env, 5)],
    }[shape]
    with pytest.raises(ValueError) as caught:  # before any worker or actor starts: the caller sees both entries
        SB3VecEnv(make_penv(envs, asynchronous="restart"))
    error = caught.value
    assert isinstance(error, SharedEnvError)  # our own check, in the caller: no env raised it
    assert "env 2 is the same env instance as env 1" in str(error)
    assert "each entry of envs needs its own env" in str(error)


@pytest.mark.every_backend
def test_factories_sharing_one_env_are_refused_where_one_process_builds_them(make_penv, backend):
    env = CountingEnv(5, episode_length=100)
    factories = [lambda: env for _ in range(2)]  # as in SB3's test_vecenv_func_checker
    if backend in ("dummy", "toy"):  # built in the caller: one object, given twice
        with pytest.raises(ValueError, match="env 1 is the same env instance as env 0"):
            SB3VecEnv(make_penv(factories, asynchronous="restart"))
        return
    # Each process unpickles each factory on its own (and each env here has a
    # process of its own): the env arrives as copies, each its own env,
    # stepped once per step, as SB3's SubprocVecEnv and Gymnasium's
    # AsyncVectorEnv run them. Nothing is one env stepped twice.
    venv = SB3VecEnv(make_penv(factories, asynchronous="restart"))
    venv.seed(0)
    venv.reset()
    obs, *_ = venv.step(np.array([1, 1]))
    assert obs[:, 1].tolist() == [1, 1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
@pytest.mark.parametrize("copy", [True, False])
def test_an_env_rebuilt_after_a_failure_ends_its_episode_on_the_last_obs_sb3_saw(make_penv, asynchronous, copy):
    """on_env_error="restart": env 1 raises in its second step and is rebuilt; SB3 sees its episode end,
    cut by the time limit as it were, with the terminal_observation it last returned for it."""
    envs = [functools.partial(FaultyEnv, tag=i, at_step=2 if i == 1 else 10**9) for i in range(3)]
    venv = SB3VecEnv(make_penv(envs, asynchronous=asynchronous, on_env_error="restart", copy=copy))
    first = venv.reset().copy()
    venv.step_async(np.array([1, 2, 3]))
    obs, _, dones, infos = venv.step_wait()
    assert not dones.any()
    seen = obs.copy()
    venv.step_async(np.array([4, 4, 4]))
    obs, _, dones, infos = venv.step_wait()
    assert dones.tolist() == [False, True, False]
    np.testing.assert_array_equal(infos[1]["terminal_observation"], seen[1])
    assert infos[1]["TimeLimit.truncated"] and infos[1]["env_restarted"]
    assert obs[1, 1] == 0 and obs[0, 1] == 2  # env 1 starts a new episode, the others go on
    assert first[1, 1] == 0
