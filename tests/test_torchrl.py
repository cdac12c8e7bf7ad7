"""TorchRL takes the Gymnasium view as it is: its GymWrapper and Collector over a ParallelEnv, their data checked."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # TorchRL 0.14 warns of its own classes as it loads
    try:
        import torch
        from torchrl.collectors import Collector
        from torchrl.envs import GymWrapper
    except ImportError as missing:  # not installed, or installed without what it imports
        pytest.skip(f"TorchRL does not import here: {missing}", allow_module_level=True)

from parallelenv import VECTOR_ENV_ID  # noqa: E402
from parallelenv.integrations.gymnasium import GymnasiumVectorEnv  # noqa: E402

# TorchRL works on NumPy results turned into tensors; the Ray backends serve the view as subproc does.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]

CART_LIMITS = np.array([2.4, np.inf, 12 * 2 * np.pi / 360, np.inf])  # CartPole's termination bounds


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def collect(env, frames: int, frames_per_batch: int) -> dict[str, np.ndarray]:
    """``frames`` random frames by TorchRL's own Collector, each key as ``[env, time, ...]`` over all batches."""
    torch.manual_seed(0)
    collector = Collector(env, None, frames_per_batch=frames_per_batch, total_frames=frames)
    batches = list(collector)
    collector.shutdown()
    data = torch.cat(batches, dim=1)
    keys = {
        "obs": "observation",
        "next_obs": ("next", "observation"),
        "done": ("next", "done"),
        "terminated": ("next", "terminated"),
        "truncated": ("next", "truncated"),
        "traj": ("collector", "traj_ids"),
    }
    return {name: data.get(key).numpy() for name, key in keys.items()}


def check_cartpole_data(data: dict[str, np.ndarray]) -> int:
    """Each env's frames follow one another within an episode; episodes end on their real last obs and
    the next one starts from a reset obs. The number of episodes ended."""
    done, terminated, truncated = (data[key][..., 0] for key in ("done", "terminated", "truncated"))
    np.testing.assert_array_equal(done, terminated | truncated)
    obs, next_obs, traj = data["obs"], data["next_obs"], data["traj"]
    # A terminated episode ends out of bounds, on its real last obs; no other frame does.
    np.testing.assert_array_equal((np.abs(next_obs) > CART_LIMITS).any(axis=-1), terminated)
    assert not truncated.any()  # random play does not last 500 steps
    within = ~done[:, :-1]
    np.testing.assert_array_equal(obs[:, 1:][within], next_obs[:, :-1][within])
    np.testing.assert_array_equal(traj[:, 1:][within], traj[:, :-1][within])
    # After an end, a new trajectory from a reset obs (CartPole draws each component from [-0.05, 0.05]).
    assert np.abs(obs[:, 1:][~within]).max() <= 0.05
    assert (traj[:, 1:][~within] != traj[:, :-1][~within]).all()
    assert np.abs(obs[:, 0]).max() <= 0.05
    return int(done.sum())


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("asynchronous", "mode"), [("idle", AutoresetMode.DISABLED), ("restart", AutoresetMode.SAME_STEP)]
)
def test_collector_over_the_view_keeps_episodes_whole(make_penv, asynchronous, mode):
    view = GymnasiumVectorEnv(make_penv([cartpole] * 8, asynchronous=asynchronous), autoreset_mode=mode)
    env = GymWrapper(view)
    assert tuple(env.batch_size) == (8,)
    data = collect(env, frames=5000, frames_per_batch=1000)
    env.close()
    assert data["obs"].shape == (8, 625, 4)
    assert check_cartpole_data(data) > 150


def test_torchrl_refuses_next_step_autoreset(make_penv):
    view = GymnasiumVectorEnv(make_penv([cartpole] * 2, asynchronous="idle"))
    assert view.autoreset_mode is AutoresetMode.NEXT_STEP
    with pytest.raises(RuntimeError, match="SAME_STEP or DISABLED"):
        GymWrapper(view)
    view.close()


@pytest.mark.timeout(120)
def test_make_vec_with_disabled_autoreset_is_torchrls_recipe(no_leaks):
    envs = gym.make_vec(VECTOR_ENV_ID, num_envs=4, env_id="CartPole-v1", para_mode="subproc", autoreset_mode="Disabled")
    env = GymWrapper(envs)
    data = collect(env, frames=2000, frames_per_batch=400)
    env.close()
    assert check_cartpole_data(data) > 50
