"""The tensor backend's own API: torch results, the shipped envs against Gymnasium, seeding, torch output.

The conformance suite runs on ``tensor`` too (through tests/tensor_envs.py);
this module checks what only the tensor backend has, and ``output="torch"``
of the CPU backends.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from envs import DictObsEnv, counting
from tensor_envs import CountingTwin

from parallelenv import ClosedError, EnvError, ParallelEnv
from parallelenv.backends import backend_names
from parallelenv.envs import TENSOR_ENVS, CartPole, Chasing, Pendulum, make_tensor_env
from parallelenv.tensor import TensorEnv

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def tensor_penv(env: TensorEnv, **kwargs) -> ParallelEnv:
    return ParallelEnv(env, para_mode="tensor", **kwargs)


# ------------------------------------------------------------------ the shipped envs against Gymnasium


def gym_twins(env_id: str, n: int, **kwargs) -> list[gym.Env]:
    envs = [gym.make(env_id, **kwargs) for _ in range(n)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    return envs


def start_from(gym_env: gym.Env, state: np.ndarray) -> None:
    """A fresh episode of ``gym_env`` (time limit included) from the tensor env's ``state``."""
    gym_env.reset()
    gym_env.unwrapped.state = np.array(state, dtype=np.float64)


def compare_rollout(
    penv: ParallelEnv, gym_envs: list[gym.Env], state_of, actions: np.ndarray, atol: float, resync: bool
) -> int:
    """Step both with the same actions; return how many episodes ended on the way.

    With ``resync`` each Gymnasium env continues from the tensor env's state
    after every step (float32 states drift from float64 ones over a long
    episode: what is compared is each step's dynamics); without, whole
    episodes run apart and must still agree.
    """
    penv.reset(seed=5)
    for i, gym_env in enumerate(gym_envs):
        start_from(gym_env, state_of(i))
    ended = 0
    for step_actions in actions:
        obs, reward, terminated, truncated, info = penv.step(torch.as_tensor(step_actions))
        for i, gym_env in enumerate(gym_envs):
            g_obs, g_reward, g_term, g_trunc, _ = gym_env.step(step_actions[i])
            assert (bool(terminated[i]), bool(truncated[i])) == (g_term, g_trunc), i
            np.testing.assert_allclose(float(reward[i]), g_reward, rtol=1e-5, atol=atol)
            if g_term or g_trunc:
                assert bool(info["_ended_state"][i]) and bool(info["reset"][i])
                np.testing.assert_allclose(info["ended_state"][i].numpy(), g_obs, rtol=0, atol=atol)
                start_from(gym_env, state_of(i))
                ended += 1
            else:
                assert not bool(info["_ended_state"][i])
                np.testing.assert_allclose(obs[i].numpy(), g_obs, rtol=0, atol=atol)
                if resync:
                    gym_env.unwrapped.state = np.array(state_of(i), dtype=np.float64)
    return ended


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("max_episode_steps", [500, 25])
def test_cartpole_matches_gymnasium_step_by_step(dtype, max_episode_steps):
    n, steps = 6, 300
    env = CartPole(n, device="cpu", dtype=dtype, max_episode_steps=max_episode_steps)
    gym_envs = gym_twins("CartPole-v1", n, max_episode_steps=max_episode_steps)
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    with tensor_penv(env, asynchronous="restart") as penv:
        ended = compare_rollout(penv, gym_envs, lambda i: env.state[i].double().numpy(), actions, atol=1e-5,
                                resync=dtype == torch.float32)
    assert ended >= n  # every env went through episode ends


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_pendulum_matches_gymnasium_step_by_step(dtype):
    n, steps = 4, 450  # two truncations at 200 steps
    env = Pendulum(n, device="cpu", dtype=dtype)
    gym_envs = gym_twins("Pendulum-v1", n)
    # Torques beyond the limits too: both clip them.
    actions = np.random.default_rng(1).uniform(-3, 3, size=(steps, n, 1)).astype(np.float32)

    def state_of(i: int) -> np.ndarray:
        return np.array([float(env.theta[i]), float(env.theta_dot[i])])

    with tensor_penv(env, asynchronous="restart") as penv:
        ended = compare_rollout(penv, gym_envs, state_of, actions, atol=1e-5, resync=dtype == torch.float32)
    assert ended == 2 * n


def test_cartpole_terminates_on_gymnasiums_thresholds():
    env = CartPole(4, device="cpu", dtype=torch.float64)
    env.reset(seed=0)
    env.state.copy_(torch.tensor([[2.39, 1.0, 0, 0], [0, 0, 0.2, 1.0], [-2.0, 0, 0, 0], [0, 0, -0.22, -1.0]]))
    _, reward, terminated, truncated = env.step(torch.tensor([1, 1, 0, 0]))
    assert terminated.tolist() == [True, True, False, True] and not truncated.any()
    assert reward.tolist() == [1.0] * 4


# ------------------------------------------------------------------ Chasing


def test_chasing_shapes_and_reward_from_distance():
    env = Chasing(5, dim=3, device="cpu")
    assert env.single_observation_space.shape == (12,) and env.single_action_space.shape == (3,)
    obs = env.reset(seed=0)
    start = torch.linalg.vector_norm(obs[:, 6:9] - obs[:, 0:3], dim=1)
    torch.testing.assert_close(start, torch.full((5,), 8.0), rtol=1e-5, atol=1e-5)
    before = env.distance.clone()
    action = torch.zeros(5, 3)
    obs, reward, terminated, truncated = env.step(action)
    after = torch.linalg.vector_norm(obs[:, 6:9] - obs[:, 0:3], dim=1)
    torch.testing.assert_close(reward, before - after)
    assert not terminated.any() and not truncated.any()


def test_chasing_agent_that_heads_for_the_robot_catches_it():
    env = Chasing(64, dim=2, device="cpu", max_episode_steps=10_000)
    with tensor_penv(env, asynchronous="idle") as penv:
        obs, _ = penv.reset(seed=3)
        caught = torch.zeros(64, dtype=torch.bool)
        for _ in range(3000):
            toward = obs[:, 0:2] - obs[:, 4:6]
            obs, _reward, terminated, truncated, info = penv.step(toward)
            caught |= terminated & ~info["idle"]
            if bool(terminated.all()):
                break
    assert caught.all() and not truncated.any()


def test_chasing_truncates_at_the_step_limit():
    env = Chasing(3, device="cpu", max_episode_steps=5, catch_distance=0.0)
    env.reset(seed=1)
    for step in range(1, 6):
        _, _, terminated, truncated = env.step(torch.zeros(3, 2))
        assert truncated.all() == (step == 5) and not terminated.any()


def test_chasing_action_cost_and_length_clamp():
    env = Chasing(2, device="cpu")
    env.reset(seed=2)
    before = env.distance.clone()
    robot_before = env.robot.clone()
    _, reward, _, _ = env.step(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))  # length 5: moves as length 1
    assert not torch.equal(env.robot, robot_before)  # the robot moved on its own
    agent_velocity = env.agent[:, 1]
    torch.testing.assert_close(agent_velocity[0], torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(reward, before - env.distance - torch.tensor([5.0, 0.0]) * 0.02)


# ------------------------------------------------------------------ seeding and subsets


def test_an_envs_stream_depends_on_its_own_seed_only():
    env = CartPole(6, device="cpu")
    everyone = env.reset(seed=11).clone()
    for ids in ([3], [5, 0], [1, 2, 3, 4]):
        env.reset(seed=12)
        env.reset(ids=torch.tensor(ids), seed=11)
        torch.testing.assert_close(env.obs[ids], everyone[ids], rtol=0, atol=0)
    assert len({tuple(row.tolist()) for row in everyone}) == 6


def test_restarts_draw_the_same_starts_whoever_else_restarts():
    def starts_of_env_0(others_done: bool) -> list[list[float]]:
        env = CartPole(4, device="cpu", max_episode_steps=3 if others_done else 10_000)
        env.max_episode_steps = 10_000
        env.reset(seed=0)
        seen = []
        for _ in range(3):
            done = torch.tensor([True, others_done, others_done, False])
            env.reset_where(done)
            seen.append(env.obs[0].tolist())
        return seen

    assert starts_of_env_0(True) == starts_of_env_0(False)


@pytest.mark.parametrize("rows", ["all", "index", "mask"])
def test_numpy_and_torch_draws_are_the_same_bits(rows):
    """On the CPU draws are made with NumPy; accelerators use the torch code: both must agree."""
    from parallelenv.tensor import CounterRNG

    numpy_rng, torch_rng = CounterRNG(300, torch.device("cpu")), CounterRNG(300, torch.device("cpu"))
    torch_rng.numpy_math = False
    chosen = {"all": None, "index": torch.tensor([7, 299, 0, 42]), "mask": torch.arange(300) % 3 == 0}[rows]
    for rng in (numpy_rng, torch_rng):
        rng.seed(None, 2**70 + 5)
    for shape, dtype in (((4,), torch.float32), ((2, 3), torch.float64), ((1,), torch.float32)):
        a = numpy_rng.uniform(shape, -2.0, 3.0, chosen, dtype=dtype).clone()
        b = torch_rng.uniform(shape, -2.0, 3.0, chosen, dtype=dtype).clone()
        assert torch.equal(a, b) and torch.equal(numpy_rng.counter, torch_rng.counter)
        assert (a >= -2.0).all() and (a < 3.0).all()


def test_step_of_some_ids_leaves_the_others_untouched():
    env = Chasing(4, device="cpu")  # draws random numbers in every step
    env.reset(seed=4)
    obs, counters = env.obs.clone(), env.rng.counter.clone()
    env.step(torch.ones(2, 2), ids=torch.tensor([2, 0]))
    assert torch.equal(env.obs[[1, 3]], obs[[1, 3]]) and torch.equal(env.rng.counter[[1, 3]], counters[[1, 3]])
    assert not torch.equal(env.obs[[0, 2]], obs[[0, 2]])
    # An env stepped alone follows the trajectory it follows when stepped with everyone.
    alone, together = Chasing(4, device="cpu"), Chasing(4, device="cpu")
    alone.reset(seed=9)
    together.reset(seed=9)
    for _ in range(5):
        alone.step(torch.ones(1, 2), ids=torch.tensor([1]))
        together.step(torch.ones(4, 2))
    assert torch.equal(alone.obs[1], together.obs[1])


# ------------------------------------------------------------------ the front object


def test_results_are_tensors_on_the_envs_device_and_info_keys_are_always_there():
    with tensor_penv(CartPole(8, device="cpu"), asynchronous="restart") as penv:
        assert isinstance(penv, ParallelEnv) and len(penv) == 8 and "tensor" in backend_names()
        obs, info = penv.reset(seed=0)
        assert isinstance(obs, torch.Tensor) and obs.device.type == "cpu" and obs.shape == (8, 4)
        obs, reward, terminated, truncated, info = penv.step(torch.ones(8, dtype=torch.int64))
        for value in (obs, reward, terminated, truncated, *info.values()):
            assert isinstance(value, torch.Tensor) and value.device.type == "cpu"
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        assert set(info) == {"ended_state", "_ended_state", "reset", "_reset"} and not info["_reset"].any()
        # The env's output buffers, rewritten by the next step: changing them changes no env.
        state = penv.backend.env.state.clone()
        obs.add_(100.0)
        reward.zero_()
        assert torch.equal(penv.backend.env.state, state)
        again, reward, *_ = penv.step(torch.ones(8, dtype=torch.int64))
        assert again.data_ptr() == obs.data_ptr() and (again.abs() < 5).all() and (reward == 1.0).all()
        some, *_ = penv.step(torch.ones(2, dtype=torch.int64), id=[1, 0])
        assert some.data_ptr() != obs.data_ptr()  # results for ids are fresh tensors


def test_ids_select_rows_and_batch_alignment_gives_python_scalars():
    with tensor_penv(CartPole(5, device="cpu")) as penv:
        penv.reset(seed=0)
        before = penv.backend.env.obs.clone()
        obs, _reward, *_ = penv.step(torch.tensor([1, 0]), id=np.array([4, 1]))
        assert obs.shape == (2, 4)
        assert torch.equal(penv.backend.env.obs[[0, 2, 3]], before[[0, 2, 3]])
        assert torch.equal(obs, penv.backend.env.obs[[4, 1]])
        (o, r, te, tr, info), *_ = penv.step([1, 1], id=[3, 2], align="batch")
        assert isinstance(o, torch.Tensor) and r == 1.0 and te is False and tr is False and info == {}
        obs, _ = penv.reset(id=torch.tensor([2]))  # ids from the device are accepted
        assert obs.shape == (1, 4)


def test_make_picks_the_tensor_env_of_a_gymnasium_id():
    assert TENSOR_ENVS["CartPole-v1"] is CartPole and TENSOR_ENVS["Pendulum-v1"] is Pendulum
    with ParallelEnv.make("CartPole-v1", num_envs=16, para_mode="tensor", device="cpu") as penv:
        assert isinstance(penv.backend.env, CartPole) and penv.backend.env.num_envs == 16
        assert penv.get_env_attr("spec", id=[0])[0].id == "CartPole-v1"
    with ParallelEnv.make("Pendulum-v1", num_envs=3, para_mode="tensor", device="cpu", asynchronous="idle") as penv:
        assert isinstance(penv.backend.env, Pendulum) and penv.asynchronous == "idle"
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_tensor_env("Acrobot-v1", num_envs=2)


def test_actions_of_the_wrong_shape_or_kind_are_refused_before_stepping():
    with tensor_penv(CartPole(4, device="cpu")) as penv:
        penv.reset(seed=0)
        obs = penv.backend.env.obs.clone()
        with pytest.raises(ValueError, match=r"actions.*\(3,\).*\(4,\)"):
            penv.step(torch.zeros(3, dtype=torch.int64))
        with pytest.raises(ValueError, match=r"actions.*\(2, 2\)"):
            penv.step(torch.zeros(2, 2, dtype=torch.int64), id=[0, 1])
        with pytest.raises(TypeError, match="float"):
            penv.step(torch.zeros(4))
        with pytest.raises(ValueError, match=r"actions\[1\] = 2"):
            penv.step([0, 2, 0, 0])
        with pytest.raises(ValueError, match=r"\b4\b"):
            penv.step(torch.zeros(1, dtype=torch.int64), id=[4])
        assert torch.equal(penv.backend.env.obs, obs)


def test_attributes_by_id_and_shared_ones():
    with tensor_penv(CountingTwin([counting(i)() for i in range(4)])) as penv:
        assert [float(g) for g in penv.get_env_attr("gravity", id=[3, 1])] == [9.8, 9.8]
        penv.set_env_attr("gravity", 2.0, id=[1])
        assert penv.backend.env.gravity.tolist() == [9.8, 2.0, 9.8, 9.8]
        with pytest.raises(ValueError, match="shared by every env"):
            penv.set_env_attr("extra", 5, id=[2])
        penv.set_env_attr("extra", 5)
        assert penv.get_env_attr("extra", id=[2, 0]) == [5, 5]


def test_env_errors_name_the_env_and_method():
    class Broken(CartPole):
        @property
        def wobble(self) -> float:
            raise RuntimeError("cannot wobble")

        def kick(self, ids):
            raise KeyError("no kick")

    with tensor_penv(Broken(4, device="cpu")) as penv:
        with pytest.raises(EnvError) as caught:
            penv.get_env_attr("wobble", id=[2, 1])
        assert (caught.value.env_index, caught.value.method, caught.value.exc_type) == (2, "wobble", "RuntimeError")
        with pytest.raises(EnvError) as caught:
            penv.customized_method("kick")
        assert (caught.value.env_index, caught.value.method, caught.value.exc_type) == (0, "kick", "KeyError")
        assert "no kick" in caught.value.remote_traceback


def test_closed_and_wrong_arguments():
    penv = tensor_penv(CartPole(2, device="cpu"))
    penv.close()
    penv.close()
    for call in (lambda: penv.reset(), lambda: penv.step(torch.zeros(2, dtype=torch.int64)),
                 lambda: penv.get_env_attr("tau"), lambda: penv.recv()):
        with pytest.raises(ClosedError):
            call()
    with pytest.raises(TypeError, match="TensorEnv"):
        ParallelEnv([counting(0)], para_mode="tensor")
    with pytest.raises(ValueError, match="output"):
        ParallelEnv(CartPole(2, device="cpu"), para_mode="tensor", output="numpy")
    with pytest.raises(TypeError, match="num_workers"):
        ParallelEnv(CartPole(2, device="cpu"), para_mode="tensor", num_workers=2)


# ------------------------------------------------------------------ output="torch" on the CPU backends


@pytest.mark.parametrize("mode", ["dummy", "subproc"])
def test_cpu_backends_hand_over_torch_tensors(no_leaks, mode):
    options = {"num_workers": 2} if mode == "subproc" else {}
    with ParallelEnv([counting(i, 9) for i in range(3)], para_mode=mode, output="torch", **options) as penv:
        obs, _ = penv.reset(seed=0)
        assert isinstance(obs, torch.Tensor) and obs.dtype == torch.float64
        obs, reward, terminated, truncated, _ = penv.step(torch.tensor([1, 2, 3]))
        assert all(isinstance(x, torch.Tensor) for x in (obs, reward, terminated, truncated))
        assert obs[:, 2].tolist() == [1, 2, 3] and reward.tolist() == [1, 11, 21]
        (o, r, *_), *_ = penv.step(torch.tensor([4, 4]), id=[2, 0], align="batch")
        assert isinstance(o, torch.Tensor) and o[0] == 2 and r == 22
    with ParallelEnv([DictObsEnv] * 2, para_mode=mode, output="torch", device="cpu", **options) as penv:
        obs, _ = penv.reset(seed=0)
        assert isinstance(obs["position"], torch.Tensor) and isinstance(obs["pair"][1], torch.Tensor)
        obs, *_ = penv.step(torch.zeros(2, 2))
        assert obs["grid"].shape == (2, 2, 3)


@pytest.mark.parametrize("mode", ["dummy", "tensor"])
def test_make_takes_output_and_device(no_leaks, mode):
    with ParallelEnv.make("CartPole-v1", num_envs=3, para_mode=mode, output="torch", device="cpu") as penv:
        obs, _ = penv.reset(seed=0)
        assert isinstance(obs, torch.Tensor) and obs.device.type == "cpu" and obs.shape == (3, 4)
    with pytest.raises(ValueError, match="output"):
        ParallelEnv.make("CartPole-v1", num_envs=3, para_mode=mode, output="jax")


def test_output_must_be_numpy_or_torch(no_leaks):
    with pytest.raises(ValueError, match="output"):
        ParallelEnv([counting(0)], para_mode="dummy", output="jax")


# ------------------------------------------------------------------ imports


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_importing_parallelenv_imports_neither_torch_nor_ray():
    done = run_python("import sys, parallelenv\n"
                      "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("ask", [
    "ParallelEnv.make('CartPole-v1', num_envs=4, para_mode='tensor')",
    "ParallelEnv([lambda: gym.make('CartPole-v1')], para_mode='dummy', output='torch')",
], ids=["tensor", "output"])
def test_without_torch_asking_for_it_says_what_to_install(ask):
    done = run_python("import sys; sys.modules['torch'] = None\n"
                      "import gymnasium as gym\nfrom parallelenv import ParallelEnv\n"
                      f"try:\n    {ask}\nexcept ImportError as exc:\n    print(exc)\n")
    assert done.returncode == 0, done.stderr
    assert "parallelenv[torch]" in done.stdout and "pip install -e '.[torch]' -c constraints.txt" in done.stdout


# ------------------------------------------------------------------ CUDA


@contextlib.contextmanager
def synchronising_raises():
    """Any host synchronisation in the block raises; the mode is put back however the block ends.

    Torch warns, as it sets the mode, that the mode is a prototype: the suite's warnings are errors,
    and that warning is not the code's.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Synchronization debug mode", UserWarning)
        try:
            torch.cuda.set_sync_debug_mode("error")
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@CUDA
def test_cuda_cartpole_steps_without_synchronising():
    with tensor_penv(CartPole(4096, device="cuda"), asynchronous="restart") as penv:
        obs, _ = penv.reset(seed=0)
        actions = torch.randint(0, 2, (50, 4096), device="cuda")
        penv.step(actions[0])
        with synchronising_raises():
            for row in actions[1:]:
                obs, _reward, _terminated, _truncated, info = penv.step(row)
        assert obs.device.type == "cuda" and info["ended_state"].device.type == "cuda"


@pytest.mark.gpu
@CUDA
def test_cuda_and_cpu_envs_draw_the_same_starts():
    cpu, cuda = CartPole(256, device="cpu"), CartPole(256, device="cuda")
    torch.testing.assert_close(cpu.reset(seed=7), cuda.reset(seed=7).cpu(), rtol=0, atol=0)


@pytest.mark.gpu
@CUDA
def test_cpu_backend_output_on_cuda(no_leaks):
    with ParallelEnv([counting(i) for i in range(2)], para_mode="dummy", output="torch", device="cuda") as penv:
        obs, _ = penv.reset(seed=0)
        assert obs.device.type == "cuda"
        obs, *_ = penv.step(torch.tensor([1, 1], device="cuda"))
        assert obs.device.type == "cuda"
