"""penv.as_gymnasium(): a real gymnasium.vector.VectorEnv that Gymnasium's vector wrappers accept."""

from __future__ import annotations

import copy
import functools
import os
import re
import signal
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import host_of
from envs import BagSpace, CountingEnv, EchoEnv, FaultyEnv, RenderingEnv, counting
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.wrappers.vector import (
    ClipAction,
    DictInfoToList,
    NormalizeObservation,
    NormalizeReward,
    RecordEpisodeStatistics,
    RescaleObservation,
)

from parallelenv import ClosedError, EnvError
from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

# The tensor backend is left out: the Gymnasium view hands NumPy arrays to NumPy wrappers.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]


def plain_loop_episodes(actions: np.ndarray, seed: int, next_step: bool) -> list[tuple[int, int, float, int]]:
    """``(step, env, return, length)`` of each CartPole episode, one env at a time.

    With ``next_step`` the step after an episode's end resets the env and
    ignores its action, as Gymnasium's NEXT_STEP autoreset does.
    """
    num_steps, num_envs = actions.shape
    episodes = []
    for i, env_seed in enumerate(seed + i for i in range(num_envs)):  # the view seeds as SyncVectorEnv does
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
    with pytest.raises(ValueError, match="autoreset_mode=AutoresetMode.DISABLED is not what asynchronous='restart' does"):
        GymnasiumVectorEnv(penv, autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(ValueError, match="'Sometimes' is not a valid AutoresetMode"):
        GymnasiumVectorEnv(penv, autoreset_mode="Sometimes")
    envs = penv.as_gymnasium()
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="actions has shape \\(3,\\); expected \\(2,\\)"):
        envs.step(np.array([0, 1, 2]))
    envs.close()
    assert envs.closed
    with pytest.raises(ClosedError):
        penv.reset()
    with pytest.raises(gym.error.ClosedEnvironmentError):  # what code written for Gymnasium catches
        envs.reset()


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


# ---------------------------------------------------------------- against Gymnasium's own SyncVectorEnv


class SpaceEnv(gym.Env):
    """Obs drawn from ``space`` (seeded by ``tag``, whatever the reset seed); episodes last ``episode_length`` steps.

    Infos carry a Python int and an ``np.int32``, so that their dtypes show;
    with ``python_obs`` the obs is a Python int, as toy-text envs return it.
    """

    def __init__(self, space: gym.Space, episode_length: int, tag: int, python_obs: bool = False) -> None:
        self.observation_space = copy.deepcopy(space)  # its own RNG, seeded below
        self.action_space = gym.spaces.Discrete(3)
        self.episode_length = episode_length
        self.python_obs = python_obs
        self.count = self.resets = 0
        self.observation_space.seed(tag)

    def _obs(self) -> Any:
        return int(self.count) if self.python_obs else self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.count, self.resets = 0, self.resets + 1
        return self._obs(), {"resets": self.resets, "options": options} if options else {"resets": self.resets}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.count += 1
        done = self.count >= self.episode_length
        info = {"count": self.count, "small": np.int32(self.count)} if self.count % 2 else {}
        return self._obs(), float(action), done, False, info


SPACES = {
    "Discrete(4, start=1, int32)": gym.spaces.Discrete(4, start=1, dtype=np.int32),
    "Dict": gym.spaces.Dict({"position": gym.spaces.Discrete(5, dtype=np.int32),
                             "velocity": gym.spaces.Box(0.0, 1.0, (2,), np.float64)}),
    "Tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))),
    "Box": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
    "Python int obs": gym.spaces.Discrete(5),
    # Spaces of no fixed shape: Gymnasium batches each as a tuple of per-env values.
    "Graph": gym.spaces.Graph(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3)),
    "Text": gym.spaces.Text(5),
    "Sequence": gym.spaces.Sequence(gym.spaces.Box(0.0, 1.0, (2,), np.float32)),
    "stacked Sequence": gym.spaces.Sequence(gym.spaces.Discrete(4), stack=True),
    "OneOf": gym.spaces.OneOf((gym.spaces.Discrete(3), gym.spaces.Box(0.0, 1.0, (2,), np.float32))),
    "custom Space": BagSpace(3),
    "Dict with a Graph": gym.spaces.Dict({"graph": gym.spaces.Graph(gym.spaces.Discrete(4), None),
                                          "position": gym.spaces.Discrete(5, dtype=np.int32)}),
}


def space_envs(space_name: str, lengths: tuple[int, ...] = (2, 3, 5)) -> list[Any]:
    space = SPACES[space_name]
    python_obs = space_name == "Python int obs"
    return [functools.partial(SpaceEnv, space, length, tag, python_obs) for tag, length in enumerate(lengths)]


def assert_same(ours: Any, theirs: Any, what: str) -> None:
    assert data_equivalence(ours, theirs, exact=True), f"{what}:\nours   {ours!r}\ntheirs {theirs!r}"


def same_as_sync_vector_env(ours: VectorEnv, theirs: VectorEnv, script: list[tuple[str, Any]]) -> None:
    """Run ``script`` (``("step", actions)`` or ``("reset", kwargs)``) on both; every return value must be equal."""
    for t, (call, argument) in enumerate(script):
        if call == "step":
            outputs = ours.step(argument), theirs.step(argument)
        else:  # each its own copy: SyncVectorEnv pops reset_mask out of the options it is given
            outputs = ours.reset(**copy.deepcopy(argument)), theirs.reset(**copy.deepcopy(argument))
        for name, mine, their in zip(("obs", "reward", "terminated", "truncated", "info"), *outputs, strict=False):
            assert_same(mine, their, f"{call} {t}: {name}")
    ours.close()
    theirs.close()


@pytest.mark.parametrize("space_name", sorted(SPACES))
def test_same_step_final_obs_and_final_info_are_sync_vector_envs(make_penv, space_name):
    ours = make_penv(space_envs(space_name), asynchronous="restart").as_gymnasium()
    theirs = SyncVectorEnv(space_envs(space_name), autoreset_mode=AutoresetMode.SAME_STEP)
    script = [("reset", {"seed": [1, 2, 3]})] + [("step", np.array([0, 1, 2]))] * 7
    same_as_sync_vector_env(ours, theirs, script)


class MixedInfoEnv(CountingEnv):
    """Info ``k`` is an int in env 0 and a float elsewhere; env 1's episodes end first."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"k": 1 if self.tag == 0 else 0.5, "t": self.count}


@pytest.mark.every_backend
def test_same_step_final_info_keeps_each_ended_envs_own_value_as_sync_vector_env_does(make_penv):
    """The step's vector info casts env 1's 0.5 to the int of env 0's 1; its final_info must not."""
    factories = [functools.partial(MixedInfoEnv, tag=i, episode_length=2 if i == 1 else 5) for i in range(2)]
    ours = make_penv(factories, asynchronous="restart").as_gymnasium()
    theirs = SyncVectorEnv(factories, autoreset_mode=AutoresetMode.SAME_STEP)
    same_as_sync_vector_env(ours, theirs, [("reset", {"seed": 0})] + [("step", np.array([0, 0]))] * 6)


@pytest.mark.every_backend
def test_final_obs_is_none_where_no_episode_ended(make_penv):
    envs = make_penv(space_envs("Dict"), asynchronous="restart").as_gymnasium()
    envs.reset(seed=0)
    envs.step(np.array([0, 0, 0]))
    *_, info = envs.step(np.array([0, 0, 0]))  # env 0 ends (length 2)
    assert info["final_obs"].dtype == object and info["final_obs"].shape == (3,)
    assert info["final_obs"][1] is None and info["final_obs"][2] is None
    assert info["final_obs"][0] in envs.single_observation_space
    assert info["_final_obs"].tolist() == info["_final_info"].tolist() == [True, False, False]


@pytest.mark.parametrize("space_name", [pytest.param("Dict", marks=pytest.mark.every_backend), "Python int obs",
                                        "Dict with a Graph"])
def test_disabled_autoreset_resets_what_reset_mask_names_as_sync_vector_env_does(make_penv, space_name):
    ours = GymnasiumVectorEnv(make_penv(space_envs(space_name), asynchronous="continue"),
                              autoreset_mode=AutoresetMode.DISABLED)
    assert ours.metadata["autoreset_mode"] is AutoresetMode.DISABLED
    theirs = SyncVectorEnv(space_envs(space_name), autoreset_mode=AutoresetMode.DISABLED)
    step = ("step", np.array([1, 2, 0]))

    def reset_mask(*mask: bool, seed: Any = None, **options: Any) -> tuple[str, dict[str, Any]]:
        return "reset", {"seed": seed, "options": {**options, "reset_mask": np.array(mask)}}

    script = [  # episode lengths 2, 3, 5
        ("reset", {"seed": [4, 5, 6]}),
        step, step,  # env 0 ends
        reset_mask(True, False, False),
        step,  # env 1 ends
        reset_mask(False, True, False, seed=[7, 8, 9], x=1),
        step,  # env 0 ends
        reset_mask(True, False, False),
        step,  # env 2 ends
        reset_mask(False, False, True),
        step,  # envs 0 and 1 end
        reset_mask(True, True, False),
        step,
        ("reset", {"seed": [1, 2, 3]}),  # every env, no mask
        step,
    ]
    same_as_sync_vector_env(ours, theirs, script)


# Actions and observations of every kind of no fixed shape, beside fixed-shape parts.
EVERY_KIND = gym.spaces.Dict({
    "graph": SPACES["Graph"],
    "text": SPACES["Text"],
    "sequences": gym.spaces.Tuple((SPACES["Sequence"], SPACES["stacked Sequence"])),
    "one of": SPACES["OneOf"],
    "bag": BagSpace(3),
    "box": SPACES["Box"],
})


# NEXT_STEP on the Ray backends too: it resets and steps envs by id, SAME_STEP steps every env.
@pytest.mark.parametrize("asynchronous", ["restart", pytest.param("idle", marks=pytest.mark.every_backend)])
def test_actions_and_observations_of_no_fixed_shape_are_sync_vector_envs(make_penv, asynchronous):
    mode = AutoresetMode.SAME_STEP if asynchronous == "restart" else AutoresetMode.NEXT_STEP

    def envs() -> list[Any]:
        return [functools.partial(EchoEnv, EVERY_KIND, tag, length) for tag, length in enumerate((2, 3))]

    ours = make_penv(envs(), asynchronous=asynchronous).as_gymnasium()
    theirs = SyncVectorEnv(envs(), autoreset_mode=mode)
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    theirs.action_space.seed(0)
    script = [("reset", {"seed": [1, 2]})] + [("step", theirs.action_space.sample()) for _ in range(5)]
    same_as_sync_vector_env(ours, theirs, script)


@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_reset_mask_works_in_the_other_modes_too(make_penv, asynchronous):
    mode = AutoresetMode.SAME_STEP if asynchronous == "restart" else AutoresetMode.NEXT_STEP
    ours = make_penv(space_envs("Box"), asynchronous=asynchronous).as_gymnasium()
    theirs = SyncVectorEnv(space_envs("Box"), autoreset_mode=mode)
    step = ("step", np.array([2, 1, 0]))
    script = [("reset", {"seed": [4, 5, 6]}), step, step, step,
              ("reset", {"options": {"reset_mask": np.array([False, True, True])}}), step, step]
    same_as_sync_vector_env(ours, theirs, script)


def test_disabled_autoreset_refuses_to_step_an_env_that_ended(make_penv):
    envs = GymnasiumVectorEnv(make_penv([counting(0, 2), counting(1, 5)], asynchronous="continue"),
                              autoreset_mode="Disabled")
    envs.reset(seed=0)
    envs.step(np.array([1, 1]))
    *_, terminated, _, _ = envs.step(np.array([1, 1]))
    assert terminated.tolist() == [True, False]
    with pytest.raises(ValueError, match=r"envs \[0\] ended and were not reset"):
        envs.step(np.array([1, 1]))
    obs, _ = envs.reset(options={"reset_mask": terminated})
    np.testing.assert_array_equal(obs[:, 1], [0, 2])
    obs, *_ = envs.step(np.array([1, 1]))
    np.testing.assert_array_equal(obs[:, 1], [1, 3])


BAD_MASKS = {
    "list": ([True, False], TypeError, "must be a numpy array"),
    "shape": (np.array([True]), ValueError, re.escape("must have shape `(2,)`, got (1,)")),
    "dtype": (np.array([1, 0]), TypeError, "must have `dtype=np.bool_`, got int64"),
    "no env": (np.array([False, False]), ValueError, "at least one True value"),
}


@pytest.mark.parametrize("case", sorted(BAD_MASKS))
def test_bad_reset_masks_are_refused_as_gymnasium_refuses_them(make_penv, case):
    mask, error, match = BAD_MASKS[case]
    envs = make_penv([counting(0), counting(1)], asynchronous="continue").as_gymnasium()
    with pytest.raises(error, match=match):
        envs.reset(options={"reset_mask": mask})
    with pytest.raises(ValueError, match="seed has 3 entries for 2 envs"):
        envs.reset(seed=[1, 2, 3], options={"reset_mask": np.array([True, False])})


@pytest.mark.every_backend
def test_np_random_seed_is_each_envs_seed(make_penv):
    envs = make_penv([counting(0), counting(1), counting(2)], asynchronous="restart").as_gymnasium()
    envs.reset(seed=[11, 12, 13])
    assert envs.np_random_seed == (11, 12, 13) == envs.get_attr("np_random_seed")
    envs.reset(options={"reset_mask": np.array([False, True, False])}, seed=[0, 20, 0])
    assert envs.np_random_seed == (11, 20, 13)
    expected = []
    for tag, seed in enumerate((11, 20, 13)):
        env = CountingEnv(tag)
        env.reset(seed=seed)
        expected.append(env.np_random.bit_generator.state)
    assert [rng.bit_generator.state for rng in envs.np_random] == expected


# ----------------------------------------------------------------- envs rebuilt after a failure

# Where a worker can die and be replaced (on_worker_failure="restart"); on_env_error="restart" works on
# every backend of this module.
WORKER_BACKENDS = ("subproc", "ray", "ray-subproc")


def breaking_envs(episode_lengths: tuple[int, ...], breaks: int, at_step: int = 2) -> list[Any]:
    """FaultyEnv factories: env ``breaks`` raises on its ``at_step``-th step of every life."""
    return [functools.partial(FaultyEnv, tag=i, at_step=at_step if i == breaks else 10**9, episode_length=length)
            for i, length in enumerate(episode_lengths)]


def kill_the_worker_of(envs: GymnasiumVectorEnv, env_id: int) -> None:
    os.kill(host_of(envs.penv.backend, env_id)[0], signal.SIGKILL)


@pytest.mark.every_backend
@pytest.mark.timeout(120)
@pytest.mark.parametrize("copy", [True, False])  # under copy=False the next step overwrites what a step returned
def test_same_step_reports_an_env_rebuilt_after_an_error_as_an_ended_episode(make_penv, copy):
    # Env 0's episode ends in the step where env 1 raises; env 2 runs on.
    penv = make_penv(breaking_envs((2, 100, 100), breaks=1), asynchronous="restart", on_env_error="restart",
                     copy=copy)
    envs = penv.as_gymnasium()
    envs.reset(seed=0)
    last, *_ = envs.step(np.array([1, 2, 3]))
    last = last.copy()
    obs, reward, terminated, truncated, info = envs.step(np.array([4, 4, 4]))
    assert terminated.tolist() == [True, False, False] and truncated.tolist() == [False, True, False]
    final_obs = {j: info["final_obs"][j] for j in np.flatnonzero(terminated | truncated)}  # Gymnasium's loop
    assert info["_final_obs"].tolist() == info["_final_info"].tolist() == [True, True, False]
    np.testing.assert_array_equal(final_obs[1], last[1])  # where the cut episode was
    np.testing.assert_array_equal(final_obs[0], [0, 2, 4, last[0, 3]])
    final_info = info["final_info"]
    assert final_info["_env_restarted"].tolist() == [False, True, False]
    assert final_info["failure"][1].kind == "env error" and final_info["_count"].tolist() == [True, False, False]
    assert obs[1, 1] == 0 and obs[1, 2] == -1 and reward[1] == 0  # the rebuilt env's first obs
    # The top level holds each new episode's reset info, and the restart as the ParallelEnv reports it.
    assert info["_seed_draw"].tolist() == [True, True, False] and info["seed_draw"][1] == obs[1, 3]
    assert info["_env_restarted"].tolist() == [False, True, False]
    obs, _, _, truncated, info = envs.step(np.array([1, 1, 1]))
    assert obs[:, 1].tolist() == [1, 1, 3] and not truncated.any() and "final_obs" not in info


@pytest.mark.every_backend
@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_envs_rebuilt_with_their_worker_end_their_episode_on_their_last_obs(make_penv, backend, asynchronous):
    if backend not in WORKER_BACKENDS:
        pytest.skip(f"para_mode={backend!r} has no worker to restart")
    envs = make_penv([counting(i, 1000) for i in range(4)], asynchronous=asynchronous,
                     on_worker_failure="restart").as_gymnasium()
    envs.reset(seed=0)
    envs.step(np.array([1, 1, 1, 1]))
    last, *_ = envs.step(np.array([2, 2, 2, 2]))
    last = last.copy()
    kill_the_worker_of(envs, 3)
    obs, reward, terminated, truncated, info = envs.step(np.array([3, 3, 3, 3]))
    rebuilt = info["_worker_restarted"]
    assert rebuilt[3] and not rebuilt.all() and truncated.tolist() == rebuilt.tolist() and not terminated.any()
    if asynchronous == "restart":
        assert info["_final_obs"].tolist() == rebuilt.tolist()
        for j in np.flatnonzero(rebuilt):
            np.testing.assert_array_equal(info["final_obs"][j], last[j])
            assert info["final_info"]["worker_restarted"][j] and info["final_info"]["failure"][j].env_ids
        assert (obs[rebuilt, 1] == 0).all() and (obs[~rebuilt, 1] == 3).all()
    else:  # NEXT_STEP: the step that ends an episode returns its last obs, the next one the new episode's first
        np.testing.assert_array_equal(obs[rebuilt], last[rebuilt])
        obs, reward, *_ = envs.step(np.array([4, 4, 4, 4]))
        assert (obs[rebuilt, 1] == 0).all() and (obs[rebuilt, 2] == -1).all() and (reward[rebuilt] == 0).all()
        assert (obs[~rebuilt, 1] == 4).all()


@pytest.mark.every_backend
@pytest.mark.timeout(120)
# Under "continue" copy=False hands over buffers that the next step overwrites; "idle" hands over the caller's own.
@pytest.mark.parametrize("asynchronous, copy", [("idle", True), ("idle", False), ("continue", False)])
def test_next_step_ends_a_rebuilt_envs_episode_on_its_last_obs_and_resets_it_in_the_next(make_penv, asynchronous,
                                                                                          copy):
    envs = make_penv(breaking_envs((100, 100), breaks=1), asynchronous=asynchronous, on_env_error="restart",
                     copy=copy).as_gymnasium()
    envs.reset(seed=0)
    last, *_ = envs.step(np.array([1, 2]))
    last = last.copy()
    obs, reward, terminated, truncated, info = envs.step(np.array([3, 3]))
    assert truncated.tolist() == [False, True] and not terminated.any() and reward[1] == 0
    np.testing.assert_array_equal(obs[1], last[1])  # as NEXT_STEP returns any ended episode's last obs
    assert info["_env_restarted"].tolist() == [False, True] and info["failure"][1].kind == "env error"
    assert "seed_draw" not in info  # no reset's info where no reset's obs is returned
    obs, reward, terminated, truncated, info = envs.step(np.array([4, 4]))
    # The reset step, as after any ended episode: a first obs with its reset's info, the action ignored.
    assert obs[:, 1].tolist() == [3, 0] and obs[1, 2] == -1 and reward.tolist() == [3, 0]
    assert not terminated.any() and not truncated.any() and "env_restarted" not in info
    assert info["_seed_draw"].tolist() == [False, True] and info["seed_draw"][1] == obs[1, 3]
    first = obs[1].copy()
    obs, *_ = envs.step(np.array([4, 4]))
    np.testing.assert_array_equal(obs[1], [1, 1, 4, first[3]])


@pytest.mark.timeout(60)
def test_disabled_autoreset_ends_a_rebuilt_envs_episode_on_its_last_obs(make_penv):
    penv = make_penv(breaking_envs((100, 100), breaks=0), asynchronous="continue", on_env_error="restart")
    envs = GymnasiumVectorEnv(penv, autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=0)
    last, *_ = envs.step(np.array([1, 2]))
    last = last.copy()
    obs, _, _, truncated, info = envs.step(np.array([3, 3]))
    assert truncated.tolist() == [True, False] and info["_env_restarted"].tolist() == [True, False]
    np.testing.assert_array_equal(obs[0], last[0])
    with pytest.raises(ValueError, match=r"envs \[0\] ended and were not reset"):
        envs.step(np.array([1, 1]))
    obs, info = envs.reset(seed=[5, 0], options={"reset_mask": truncated})
    first, _ = CountingEnv(0).reset(seed=5)
    np.testing.assert_array_equal(obs[0], first)  # the reset the caller asked for, with its seed
    np.testing.assert_array_equal(obs[1], [1, 2, 3, last[1, 3]])
