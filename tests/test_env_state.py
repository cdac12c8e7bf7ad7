"""Env state as a value (parallelenv.state): taken at one step and put back, the same actions give
the same results bit for bit, on every backend and for every way a state is taken; a whole run
saved and resumed on another backend; and every bad input refused with a clear error."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv, counting
from gymnasium.utils import EzPickle

from parallelenv import AlreadyPendingError, EnvError, EnvState, ParallelEnv, StateError, check_state
from parallelenv.state import capture

pytestmark = [pytest.mark.timeout(300), pytest.mark.numpy_backends]

NUM_ENVS = 3


def host_array(value: Any) -> np.ndarray:
    return np.asarray(value.cpu()) if hasattr(value, "cpu") else np.asarray(value)


def play(penv: Any, actions: list[Any]) -> list[tuple[np.ndarray, ...]]:
    return [tuple(host_array(part) for part in penv.step(action)[:4]) for action in actions]


def assert_same(first: list[tuple[np.ndarray, ...]], second: list[tuple[np.ndarray, ...]]) -> None:
    assert len(first) == len(second)
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        for name, x, y in zip(("obs", "reward", "terminated", "truncated"), a, b, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), f"step {step}: {name} differs"


def snapshot_continues(penv: Any, warmup: int = 300, steps: int = 200) -> list[EnvState]:
    """Play ``warmup`` steps, take the state, play ``steps``, put it back, play them again: the same."""
    penv.reset(seed=0)
    penv.action_space.seed(1)
    play(penv, [penv.action_space.sample() for _ in range(warmup)])
    states = penv.get_state()
    actions = [penv.action_space.sample() for _ in range(steps)]
    first = play(penv, actions)
    penv.set_state(states)
    assert_same(first, play(penv, actions))
    return states


class Walker(gym.Env):
    """A pure-Python env with its own RNG and counters, and neither the protocol nor an adapter."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.position, self.elapsed = 0.0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position, self.elapsed = float(self.np_random.normal()), 0
        return np.array([self.position, 0.0]), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position += (int(action) - 1) * 0.1 + float(self.np_random.normal()) * 0.01
        self.elapsed += 1
        return np.array([self.position, self.elapsed]), -abs(self.position), abs(self.position) > 2, False, {}


class ProtocolWalker(Walker):
    """Walker with the state protocol: its own get_state/set_state are what is taken."""

    taken = 0

    def get_state(self) -> Any:
        type(self).taken += 1
        return self.position, self.elapsed, self.np_random.bit_generator.state

    def set_state(self, state: Any) -> None:
        self.position, self.elapsed, rng = state
        self.np_random.bit_generator.state = rng


class ConstructorPickled(Walker, EzPickle):
    """Pickles its constructor's arguments, as MuJoCo's and the ALE's envs do: a copy is a fresh env."""

    def __init__(self) -> None:
        Walker.__init__(self)
        EzPickle.__init__(self)


def walker() -> gym.Env:
    return gym.wrappers.TimeLimit(Walker(), max_episode_steps=350)


def protocol_walker() -> gym.Env:
    return gym.wrappers.TimeLimit(ProtocolWalker(), max_episode_steps=350)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def half_cheetah() -> gym.Env:
    return gym.make("HalfCheetah-v5")


def pong() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", repeat_action_probability=0.0)


def sticky_pong() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5")  # repeats the last action at random: the ALE's state does not hold which


ENV_KINDS = {
    "cartpole": (cartpole, None, "pickle"),
    "walker": (walker, None, "pickle"),
    "protocol": (protocol_walker, None, "protocol"),
    "half_cheetah": (half_cheetah, "mujoco", "mujoco"),
    "pong": (pong, "ale_py", "ale"),
}


@pytest.mark.parametrize("kind", ENV_KINDS)
def test_state_taken_and_put_back_continues_bit_for_bit(make_penv, backend, kind):
    factory, needs, way = ENV_KINDS[kind]
    if needs is not None:
        pytest.importorskip(needs, reason=f"{kind} needs {needs} (the test extra installs it)")
    if way == "pickle":
        assert check_state(factory, steps=60), "its pickle must be verified, and so trusted, first"
    penv = make_penv([factory] * NUM_ENVS, asynchronous="restart")
    states = snapshot_continues(penv)
    assert len(states) == NUM_ENVS and {state.way for state in states} == {way}
    assert all(pickle.loads(pickle.dumps(state)) == state for state in states)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_tensor_env_rows_continue_bit_for_bit(env_id):
    pytest.importorskip("torch")
    with ParallelEnv.make(env_id, num_envs=NUM_ENVS, para_mode="tensor", device="cpu",
                           asynchronous="restart") as penv:
        states = snapshot_continues(penv)
        assert {state.way for state in states} == {"tensor"}
        # Some envs' rows alone, in another order: only those change.
        later = penv.get_state()
        penv.set_state([states[2], states[0]], id=[2, 0])
        now = [pickle.loads(state.data) for state in penv.get_state()]
        wanted = [pickle.loads(state.data) for state in (states[0], later[1], states[2])]
        for have, want in zip(now, wanted, strict=True):
            assert have.keys() == want.keys() and all(np.array_equal(have[k], want[k]) for k in have)


def test_a_wrappers_own_state_is_taken_with_the_env(make_penv):
    """TimeLimit's elapsed steps travel with the state: restored at 300 of 350, the episode is cut at
    the same step again (the protocol env's core keeps only its own fields)."""
    penv = make_penv([protocol_walker] * 2, asynchronous="restart")
    penv.reset(seed=0)
    play(penv, [np.ones(2, dtype=np.int64)] * 300)
    states = penv.get_state()
    first = play(penv, [np.ones(2, dtype=np.int64)] * 60)
    assert any(step[3].any() for step in first), "TimeLimit cuts the episode at 350"
    penv.set_state(states)
    assert_same(first, play(penv, [np.ones(2, dtype=np.int64)] * 60))


class Keeper(gym.Wrapper):
    """A wrapper whose attributes hold arrays of every kind and generators, nested too."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.records = np.zeros(2, dtype=[("count", "<i4"), ("total", "<f8")])
        string_dtype = getattr(getattr(np, "dtypes", None), "StringDType", None)  # NumPy 2's
        self.names = np.array(["a", "bb"], dtype=string_dtype() if string_dtype else "<U2")
        self.when = np.array(["2026-11-28"], dtype="datetime64[ns]")
        self.history = [np.arange(3.0), {"last": np.ones((2, 2), np.float32).T}]
        self.rng = np.random.default_rng(0)
        self.others = [np.random.default_rng(1)]


def test_a_wrappers_arrays_and_generators_come_back_as_they_were():
    env = Keeper(ProtocolWalker())
    env.reset(seed=0)
    state = capture.capture_env(env)
    expected = pickle.loads(pickle.dumps(vars(env)))  # a deep copy of its attributes as they were
    rng = env.rng
    env.records["count"] += 5
    env.names[0] = "changed"
    env.history[1]["last"][0, 0] = 9.0
    env.rng.random(3)
    env.others[0].random(3)
    capture.restore_env(env, state)
    assert env.rng is rng, "a generator held by an attribute gets the state put back into it"
    assert env.rng.random() == expected["rng"].random() and env.others[0].random() == expected["others"][0].random()
    for name in ("records", "names", "when"):
        got, want = getattr(env, name), expected[name]
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert np.array_equal(env.history[0], expected["history"][0])
    last = env.history[1]["last"]
    assert last.dtype == np.float32 and np.array_equal(last, expected["history"][1]["last"]) and last.flags.writeable


class Recorded(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A wrapper that Gymnasium records the constructor's arguments of, with metadata of its own."""

    def __init__(self, env: gym.Env, label: str) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, label=label)
        super().__init__(env)
        self.metadata = {"render_modes": [], "label": label}
        self.steps_seen = 0


def test_what_an_env_was_built_with_stays_out_of_its_state():
    """Metadata, spaces and the constructor's recorded arguments are the env's as built, not its state:
    put into another env built the same way, they stay that env's; its counters do come back."""
    env = Recorded(ProtocolWalker(), label="built-with-marker")
    env.steps_seen = 7
    state = capture.capture_env(env)
    assert b"built-with-marker" not in state.data
    other = Recorded(ProtocolWalker(), label="another-marker")
    capture.restore_env(other, state)
    assert other.steps_seen == 7
    assert other.metadata["label"] == "another-marker" and other._saved_kwargs == {"label": "another-marker"}


def test_a_pickle_is_trusted_only_once_checked(make_penv, monkeypatch):
    monkeypatch.setattr(capture, "_TRUSTED_PICKLES", set())
    penv = make_penv([walker] * 2)
    penv.reset(seed=0)
    with pytest.raises(EnvError, match=r"(?s)Walker has no get_state\(\)/set_state\(\).*check_state"):
        penv.get_state()
    assert check_state(walker).exact
    assert {state.way for state in penv.get_state()} == {"pickle"}


def test_check_state_finds_a_pickle_that_rebuilds_a_fresh_env(monkeypatch):
    monkeypatch.setattr(capture, "_TRUSTED_PICKLES", set())
    result = check_state(ConstructorPickled, steps=30)
    assert not result.exact and not result
    assert result.way == "pickle" and "ConstructorPickled" in result.env_class
    assert "fresh env" in result.difference or "same env" in result.difference
    assert capture.class_name(ConstructorPickled) not in capture.trusted_classes()


def test_check_state_reports_size_and_times():
    result = check_state(protocol_walker, steps=20, warmup=5)
    assert result.exact and result.way == "protocol" and result.nbytes > 0
    assert result.capture_s >= 0 and result.restore_s >= 0 and result.difference is None


def ant() -> gym.Env:
    return gym.make("Ant-v5")


@pytest.mark.parametrize("needs, factory", [("mujoco", half_cheetah), ("mujoco", ant), ("ale_py", pong)])
@pytest.mark.parametrize("seed", [0, 2])
def test_the_adapters_are_exact(needs, factory, seed):
    """Ant reads its bodies' positions before a step (as the last step left them); Pong, with seed 2,
    met a sticky action before sticky actions were refused."""
    pytest.importorskip(needs)
    result = check_state(factory, steps=100, seed=seed)
    assert result.exact, result.difference


def test_an_atari_env_with_sticky_actions_is_refused_naming_why(make_penv):
    pytest.importorskip("ale_py")
    result = check_state(sticky_pong, steps=5)
    assert not result.exact and result.way == "none" and "repeat_action_probability=0.25" in result.difference
    penv = make_penv([sticky_pong])
    penv.reset(seed=0)
    with pytest.raises(EnvError, match="repeat_action_probability=0"):
        penv.get_state()


def test_bad_states_are_refused_with_a_clear_error(make_penv):
    assert check_state(walker, steps=10)
    penv = make_penv([walker, walker, protocol_walker])
    penv.reset(seed=0)
    states = penv.get_state()
    with pytest.raises(ValueError, match="2 states for 3 envs"):
        penv.set_state(states[:2])
    with pytest.raises(TypeError, match="a state is an EnvState"):
        penv.set_state([1, 2, 3])
    with pytest.raises(EnvError, match="state is of a .*ProtocolWalker, and this env is a .*Walker"):
        penv.set_state([states[2]], id=[0])
    penv.send(np.zeros(3, dtype=np.int64))
    with pytest.raises(AlreadyPendingError):
        penv.get_state()
    penv.recv()
    penv.set_state(states)  # nothing was lost on the way: the envs still take their own states
    with pytest.raises(TypeError, match="needs a way to build the env"):
        check_state(walker())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps="):
        check_state(walker, steps=0)


def test_an_env_of_no_known_way_is_named_in_the_error(monkeypatch):
    monkeypatch.setattr(capture, "_TRUSTED_PICKLES", set())  # another test of this process may have trusted it
    env = CountingEnv()
    with pytest.raises(StateError, match=r"tests?\.?.*CountingEnv has no get_state|CountingEnv has no get_state"):
        capture.capture_env(env, trusted=())


# ------------------------------------------------------------------ save and load


def saved_halfway(penv: Any, path: Any, steps: int) -> tuple[list[Any], list[tuple[np.ndarray, ...]]]:
    """Random actions for ``steps`` steps from a seeded reset, the run saved to ``path`` halfway: the
    actions, and the second half's results."""
    penv.reset(seed=0)
    penv.action_space.seed(3)
    actions = [penv.action_space.sample() for _ in range(steps)]
    play(penv, actions[: steps // 2])
    penv.save(path)
    return actions, play(penv, actions[steps // 2:])


def uninterrupted_and_resumed(tmp_path: Any, first_mode: str, then_mode: str, **options: Any) -> None:
    assert check_state(cartpole, steps=10)
    envs = [cartpole] * 4
    options = {"asynchronous": "restart", **options}
    with ParallelEnv(envs, para_mode=first_mode, **options) as penv:
        actions, uninterrupted = saved_halfway(penv, tmp_path / "run.pkl", 1000)
    with ParallelEnv.load(tmp_path / "run.pkl", para_mode=then_mode) as resumed:
        assert resumed.asynchronous == "restart" and resumed.para_mode == then_mode
        assert_same(uninterrupted, play(resumed, actions[500:]))


@pytest.mark.parametrize("then_mode", ["dummy", "subproc"])
def test_saved_on_subproc_resumes_exactly(tmp_path, then_mode):
    uninterrupted_and_resumed(tmp_path, "subproc", then_mode)


@pytest.mark.parametrize("then_mode", ["ray-subproc", "ray"])
def test_saved_on_subproc_resumes_exactly_on_ray(tmp_path, ray_session, then_mode):
    uninterrupted_and_resumed(tmp_path, "subproc", then_mode)


def test_load_puts_back_the_finished_envs(tmp_path):
    """Under "idle" a finished env answers None results until reset: so it does after load."""
    envs = [counting(0, 2), counting(1, 9)]
    assert check_state(envs[0], steps=10)
    with ParallelEnv(envs, asynchronous="idle") as penv:
        penv.reset(seed=0)
        for _ in range(3):
            penv.step(np.zeros(2, dtype=np.int64))
        penv.save(tmp_path / "idle.pkl")
        expected = penv.step(np.zeros(2, dtype=np.int64))
    with ParallelEnv.load(tmp_path / "idle.pkl", envs=envs, para_mode="subproc") as resumed:
        assert resumed.asynchronous == "idle"
        resumed_step = resumed.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(resumed_step[0], expected[0])
    np.testing.assert_array_equal(resumed_step[1], expected[1])


def test_load_refuses_what_it_cannot_resume(tmp_path):
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"something": "else"}))
    with pytest.raises(ValueError, match="not a file ParallelEnv.save"):
        ParallelEnv.load(tmp_path / "other.pkl")
    assert check_state(cartpole, steps=10)
    with ParallelEnv([cartpole] * 2) as penv:
        penv.reset(seed=0)
        penv.save(tmp_path / "two.pkl")
    with pytest.raises(ValueError, match="holds 2 envs' states, and envs= builds 3"):
        ParallelEnv.load(tmp_path / "two.pkl", envs=[cartpole] * 3)


@pytest.mark.parametrize("module", ["parallelenv.state.check", "parallelenv.state.front"])
def test_the_examples_of_the_docstrings_run(module):
    import doctest
    import importlib

    failed, tried = doctest.testmod(importlib.import_module(module))
    assert tried and not failed


# ------------------------------------------------------------------ a VecWorker's collection


def lean_left(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 2] > 0).astype(np.int64)


@pytest.mark.parametrize("then_mode", ["dummy", "subproc"])
@pytest.mark.parametrize("collect", ["steps", "episodes"])
def test_a_vec_workers_collection_resumes_where_it_was_saved(tmp_path, then_mode, collect):
    """Saved between two calls, loaded on another backend with the same agent: the next call collects
    what the saved worker would have, returns and lengths of the episodes in flight included."""
    from parallelenv.rollout import VecWorker

    assert check_state(cartpole, steps=10)
    penv = ParallelEnv([cartpole] * 4, para_mode="subproc", num_workers=2, asynchronous="restart")
    with VecWorker(penv, lean_left, seed=3, max_episode_length=30) as worker:
        worker.collect(45) if collect == "steps" else worker.collect_episodes(3)
        worker.save(tmp_path / "worker.pkl")
        expected = worker.collect(60) if collect == "steps" else worker.collect_episodes(5)
    with VecWorker.load(tmp_path / "worker.pkl", lean_left, para_mode=then_mode) as resumed:
        assert resumed.max_episode_length == 30 and resumed.penv.para_mode == then_mode
        got = resumed.collect(60) if collect == "steps" else resumed.collect_episodes(5)
    names = ("obs", "action", "reward", "terminated", "truncated", "next_obs", "episode_returns",
             "episode_lengths") if collect == "steps" else (
             "env_ids", "lengths", "returns", "observations", "actions", "rewards", "terminations", "truncations",
             "last_observations")
    for name in names:
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)


def test_a_file_of_another_kind_is_not_a_vec_workers(tmp_path):
    from parallelenv.rollout import VecWorker

    assert check_state(cartpole, steps=10)
    with ParallelEnv([cartpole] * 2) as penv:
        penv.reset(seed=0)
        penv.save(tmp_path / "penv.pkl")
    with pytest.raises(ValueError, match="not a file VecWorker.save"):
        VecWorker.load(tmp_path / "penv.pkl", lean_left)


def test_a_tensor_run_saved_resumes_exactly(tmp_path):
    pytest.importorskip("torch")
    with ParallelEnv.make("CartPole-v1", num_envs=NUM_ENVS, para_mode="tensor", device="cpu",
                          asynchronous="restart") as penv:
        actions, uninterrupted = saved_halfway(penv, tmp_path / "tensor.pkl", 200)
    with pytest.raises(ValueError, match="did not travel in the file .a TensorEnv"):
        ParallelEnv.load(tmp_path / "tensor.pkl")
    from parallelenv.envs import make_tensor_env

    with ParallelEnv.load(tmp_path / "tensor.pkl", envs=make_tensor_env("CartPole-v1", NUM_ENVS, device="cpu")) \
            as resumed:
        assert resumed.para_mode == "tensor"
        assert_same(uninterrupted, play(resumed, actions[100:]))
