"""The tensor backend's compiled step (``compile=``) against its eager step, the reference.

Compiled float32 kernels round some operations (sin, cos, sqrt) differently
from eager torch's by an ulp; over an episode a pole's or pendulum's chaos
grows that into different trajectories, which says nothing about the step.
So each step starts both from the eager env's state: what is compared is
every step's computation, and the flags, restarts and draws that follow from it.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor")

from gymnasium import spaces  # noqa: E402

from parallelenv import ParallelEnv  # noqa: E402
from parallelenv.envs import CartPole, Chasing, Pendulum  # noqa: E402
from parallelenv.tensor import TensorEnv, fill_rows, put_rows  # noqa: E402
from parallelenv.tensor.compiled import CompileFallbackWarning  # noqa: E402

# |compiled - eager| <= ATOL + RTOL |eager|, for values of each step from the same state. Pendulum's cos and
# sin of an angle wound up to |theta| ~ 30 differ by an ulp of the angle (2e-6), hence the absolute part.
RTOL, ATOL = 1e-6, 4e-6


def actions_for(space, steps: int, num_envs: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if hasattr(space, "n"):
        return torch.randint(0, int(space.n), (steps, num_envs), generator=generator)
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    return low + (high - low) * torch.rand((steps, num_envs, *space.shape), generator=generator)


def assert_same_steps(env_class, num_envs: int, steps: int, asynchronous: str) -> int:
    """Step an eager and a compiled ParallelEnv with the same actions from the same seed; return the
    episodes ended. Flags and masks must be identical, values within RTOL/ATOL, every step."""
    envs = (env_class(num_envs, device="cpu"), env_class(num_envs, device="cpu"))
    eager = ParallelEnv(envs[0], para_mode="tensor", asynchronous=asynchronous)
    compiled = ParallelEnv(envs[1], para_mode="tensor", asynchronous=asynchronous, compile=True)
    ended = 0
    with eager, compiled:
        assert torch.equal(eager.reset(seed=3)[0], compiled.reset(seed=3)[0])
        for row in actions_for(eager.single_action_space, steps, num_envs):
            for name in envs[0].state_fields:
                getattr(envs[1], name).copy_(getattr(envs[0], name))
            want, got = eager.step(row), compiled.step(row)
            for a, b in zip(want[:4], got[:4], strict=True):
                if a.dtype == torch.bool:
                    assert torch.equal(a, b)
                else:
                    torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
            if asynchronous == "restart":
                mask = want[4]["_ended_state"]
                assert torch.equal(mask, got[4]["_ended_state"]) and torch.equal(mask, got[4]["reset"])
                torch.testing.assert_close(got[4]["ended_state"][mask], want[4]["ended_state"][mask],
                                           rtol=RTOL, atol=ATOL)
                ended += int(mask.sum())
            else:
                ended += int((want[2] | want[3]).sum())
    return ended


def test_compiled_cartpole_equals_eager_every_step_for_1000_steps():
    # 1,000 steps of 256 envs: episodes end (and restart, drawing their starts) throughout.
    assert assert_same_steps(CartPole, 256, 1000, "restart") > 1000


@pytest.mark.long
@pytest.mark.parametrize("env_class", [Pendulum, Chasing, CartPole])
@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_compiled_envs_equal_eager_every_step_for_1000_steps(env_class, asynchronous):
    assert_same_steps(env_class, 512, 1000, asynchronous)


class ReadsBack(TensorEnv):
    """A user's env whose step reads a value back to the host: it cannot be compiled whole."""

    single_observation_space = spaces.Box(-1e6, 1e6, (1,))
    single_action_space = spaces.Discrete(2)
    state_fields = ("position",)

    def __init__(self, num_envs, device="cpu"):
        super().__init__(num_envs, device)
        self.position = torch.zeros(num_envs, 1, device=self.device)

    def reset_envs(self, rows, options):
        put_rows(self.position, rows, self.rng.uniform((1,), -1.0, 1.0, rows))
        self.obs.copy_(self.position)

    def step_envs(self, actions):
        if float(self.position.abs().max()) > 5:  # a host read: the graph breaks here
            self.position.mul_(0.5)
        self.position.add_(actions[:, None] * 2 - 1)
        self.obs.copy_(self.position)
        self.reward.copy_(self.position[:, 0])
        torch.gt(self.position[:, 0], 3.0, out=self.terminated)
        fill_rows(self.truncated, None, False)


def test_an_env_that_cannot_compile_runs_eager_and_says_so_once():
    eager = ParallelEnv(ReadsBack(8), para_mode="tensor", asynchronous="restart")
    compiled = ParallelEnv(ReadsBack(8), para_mode="tensor", asynchronous="restart", compile=True)
    with eager, compiled:
        eager.reset(seed=1)
        compiled.reset(seed=1)
        with pytest.warns(CompileFallbackWarning, match="ReadsBack's step could not be compiled"):
            compiled.step(torch.ones(8, dtype=torch.int64))
        eager.step(torch.ones(8, dtype=torch.int64))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once: later steps are quiet
            for row in actions_for(eager.single_action_space, 20, 8):
                want, got = eager.step(row), compiled.step(row)
                for a, b in zip(want[:4], got[:4], strict=True):
                    assert torch.equal(a, b)


@pytest.mark.parametrize(("value", "message"), [
    ("fast", "compile='fast'; valid: False, True, 'inductor'"),
    ("graph", "captures a CUDA graph, but the env is on cpu"),
    ("inductor+graph", "captures a CUDA graph, but the env is on cpu"),
])
def test_a_compile_mode_that_does_not_exist_or_fit_the_device_is_refused(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        ParallelEnv(CartPole(4, device="cpu"), para_mode="tensor", compile=value)


def test_only_the_tensor_backend_takes_compile():
    import gymnasium as gym

    with pytest.raises(TypeError, match="compile"):
        ParallelEnv([lambda: gym.make("CartPole-v1")], para_mode="dummy", compile=True)


def test_auto_compiles_the_shipped_envs_from_65536_envs_on_the_cpu():
    from parallelenv.tensor.compiled import AUTO_MIN_ENVS, resolve_mode

    assert AUTO_MIN_ENVS == 65_536
    for env_class in (CartPole, Pendulum, Chasing):
        assert resolve_mode("auto", env_class(AUTO_MIN_ENVS, device="cpu")) == "inductor"
        assert resolve_mode("auto", env_class(AUTO_MIN_ENVS - 1, device="cpu")) is None
    assert resolve_mode("auto", ReadsBack(AUTO_MIN_ENVS)) is None  # a user's env compiles when asked only
    assert resolve_mode(False, CartPole(AUTO_MIN_ENVS, device="cpu")) is None


def test_auto_compiles_a_shipped_env_on_cuda_at_any_size_into_a_graph():
    """What resolve_mode reads of an env, as a shipped env on a CUDA device has it (no device needed here)."""
    import torch

    from parallelenv.tensor.compiled import resolve_mode

    class ShippedOnCuda:
        compiles_by_default = True
        device = torch.device("cuda", 0)
        num_envs = 16

    class YoursOnCuda(ShippedOnCuda):
        compiles_by_default = False

    assert resolve_mode("auto", ShippedOnCuda()) == "inductor+graph"
    assert resolve_mode("auto", YoursOnCuda()) is None


def test_a_compile_auto_chose_is_said_once_as_a_warning(caplog):
    import parallelenv.tensor.compiled as compiled

    # The threshold lowered while the backend is built: 64 envs compile in seconds.

    original = compiled.AUTO_MIN_ENVS
    compiled.AUTO_MIN_ENVS = 64
    try:
        penv = ParallelEnv(CartPole(64, device="cpu"), para_mode="tensor", asynchronous="restart")
    finally:
        compiled.AUTO_MIN_ENVS = original
    with penv, caplog.at_level("INFO", logger="parallelenv.tensor"):
        penv.reset(seed=0)
        for row in actions_for(penv.single_action_space, 3, 64):
            penv.step(row)
    said = [record for record in caplog.records if "compiled" in record.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "compile='auto'" in said[0].getMessage()
