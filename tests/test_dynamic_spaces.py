"""Spaces of no fixed shape (Graph, Sequence, Text, OneOf, custom Space subclasses), on every CPU backend.

Gymnasium's vector envs take them (``SyncVectorEnv``, ``AsyncVectorEnv``
without shared memory) and batch them as a tuple of per-env values. A
ParallelEnv carries them beside its shared memory, pickled: each such part
is an object array with one value per env, and the Gymnasium view returns it
as Gymnasium's tuple (tests/test_gymnasium_view.py compares it with
``SyncVectorEnv``). Their values go both ways here: an ``EchoEnv`` observes
the action it was given, so a step's observation says which action reached
which env. The tensor backend refuses them.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import pytest
from envs import BagSpace, EchoEnv
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector.utils import iterate

from parallelenv import EnvError
from parallelenv.arguments import env_seeds
from parallelenv.infos import ended_states

# Results are NumPy; a TensorEnv's spaces are fixed (the last test). The Ray
# backends run the tests marked every_backend: a Ray ParallelEnv takes seconds to start.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]

KINDS = {
    "Text": spaces.Text(6),
    "Sequence": spaces.Sequence(spaces.Box(-1, 1, (2,), np.float32)),
    "stacked Sequence": spaces.Sequence(spaces.Discrete(4), stack=True),
    "Graph": spaces.Graph(spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3)),
    "OneOf": spaces.OneOf((spaces.Discrete(3), spaces.Box(0, 1, (2,), np.float32))),
    "custom Space": BagSpace(4),
}
# Every kind in one space, beside fixed-shape parts (shared memory) and inside a Tuple.
EVERY_KIND = spaces.Dict({
    **{name: space for name, space in KINDS.items() if name != "Sequence"},
    "box": spaces.Box(-1, 1, (3,), np.float32),
    "pair": spaces.Tuple((KINDS["Sequence"], spaces.Discrete(5))),
})
LENGTHS = (2, 3, 5)


def echo_envs(space: spaces.Space, lengths: tuple[int, ...] = LENGTHS) -> list[Any]:
    return [functools.partial(EchoEnv, space, tag, length) for tag, length in enumerate(lengths)]


def assert_same(ours: Any, expected: Any, what: str) -> None:
    assert data_equivalence(ours, expected, exact=True), f"{what}:\nours     {ours!r}\nexpected {expected!r}"


def per_env(penv: Any, batched: Any) -> list[Any]:
    """Each env's value out of Gymnasium's batched form (tuples for parts of no fixed shape)."""
    return list(iterate(penv.observation_space, batched))


def penv_rows(obs: Any, n: int) -> list[Any]:
    """Each env's value out of a ParallelEnv's batched obs (object arrays for parts of no fixed shape)."""
    if isinstance(obs, dict):
        columns = {key: penv_rows(sub, n) for key, sub in obs.items()}
        return [{key: column[i] for key, column in columns.items()} for i in range(n)]
    if isinstance(obs, tuple):
        return list(zip(*(penv_rows(sub, n) for sub in obs), strict=True))
    return [obs[i] for i in range(n)]


def first_observations(space: spaces.Space, seeds: list[int]) -> list[Any]:
    """What each env's reset with these seeds observes, run as plain envs."""
    return [EchoEnv(space, tag).reset(seed=seed)[0] for tag, seed in enumerate(seeds)]


@pytest.mark.every_backend
def test_every_kind_of_part_goes_both_ways(make_penv):
    penv = make_penv(echo_envs(EVERY_KIND), asynchronous="restart")
    assert penv.single_observation_space == EVERY_KIND and penv.single_action_space == EVERY_KIND
    seeds = env_seeds(7, np.arange(3))
    results = penv.reset(seed=7, align="batch")
    for i, ((mine, _), expected) in enumerate(zip(results, first_observations(EVERY_KIND, seeds), strict=True)):
        assert_same(mine, expected, f"reset obs of env {i}")
    penv.action_space.seed(1)
    actions = penv.action_space.sample()  # Gymnasium's batched form: a tuple for each part of no fixed shape
    obs, reward, terminated, truncated, info = penv.step(actions)
    assert obs["Text"].dtype == object and obs["Text"].shape == (3,)
    assert obs["box"].dtype == np.float32 and obs["box"].shape == (3, 3)
    assert obs in penv.observation_space
    for i, (action, step_obs) in enumerate(zip(per_env(penv, actions), penv_rows(obs, 3), strict=True)):
        assert_same(step_obs, action, f"step obs of env {i}")
    np.testing.assert_array_equal(reward, [1, 11, 21])

    actions = penv.action_space.sample()
    obs, _, terminated, _, info = penv.step(actions)  # env 0 ends, and restarts
    assert terminated.tolist() == [True, False, False]
    expected = per_env(penv, actions)
    assert_same(ended_states(info)[0], expected[0], "the last obs of env 0's episode")
    rows = penv_rows(obs, 3)
    assert rows[0] in EVERY_KIND  # the first of its next episode
    for i in (1, 2):
        assert_same(rows[i], expected[i], f"step obs of env {i}")


def test_a_space_of_no_fixed_shape_alone_by_id_and_per_env(make_penv):
    space = KINDS["Text"]
    penv = make_penv(echo_envs(space), asynchronous="idle")
    obs, _ = penv.reset(seed=[4, 5, 6])
    assert obs.dtype == object and obs.tolist() == first_observations(space, [4, 5, 6])
    obs, reward, *_ = penv.step(("ab", "c", "def"))
    assert obs.tolist() == ["ab", "c", "def"]
    obs, reward, *_ = penv.step(["xyz", "w"], id=[2, 0])  # a list, by id: results in the order of id
    assert obs.tolist() == ["xyz", "w"] and reward.tolist() == [22.0, 2.0]
    per_env_results = penv.step(np.array(["2", "3"], dtype=object), id=[1, 2], align="batch")
    assert [result[0] for result in per_env_results] == ["2", "3"]
    # env 0 ended (length 2): under "idle" it gets a None result, its part of no fixed shape None
    obs, reward, terminated, _, info = penv.step(("a", "b", "c"))
    assert obs.tolist() == [None, "b", "c"] and info["idle"].tolist() == [True, False, False]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_alone(make_penv, kind):
    space = KINDS[kind]
    penv = make_penv(echo_envs(space), asynchronous="continue")
    results = penv.reset(seed=[1, 2, 3], align="batch")
    for i, ((mine, _), expected) in enumerate(zip(results, first_observations(space, [1, 2, 3]), strict=True)):
        assert_same(mine, expected, f"reset obs of env {i}")
    penv.action_space.seed(0)
    for _ in range(2):
        actions = penv.action_space.sample()
        obs, *_ = penv.step(actions)
        assert obs in penv.observation_space
        for i, (mine, action) in enumerate(zip(obs, actions, strict=True)):
            assert_same(mine, action, f"step obs of env {i}")


# Steps past the end under None on purpose: the warning it gives is tests/test_first_all_done_warning.py's.
@pytest.mark.filterwarnings("ignore::parallelenv.AllEnvsFinishedWarning")
def test_none_results_leave_fixed_parts_zero_and_the_others_none(make_penv):
    space = spaces.Dict({"word": KINDS["Text"], "box": spaces.Box(-1, 1, (2,), np.float32)})
    penv = make_penv(echo_envs(space, (1, 3)), asynchronous=None)  # env 0's end ends both
    penv.reset(seed=0)
    step = {"word": ("a", "b"), "box": np.ones((2, 2), np.float32)}
    penv.step(step)
    obs, *_ = penv.step(step)
    assert obs["word"].tolist() == [None, None] and not obs["box"].any()
    assert penv.step(step, align="batch")[0][:4] == (None, None, True, False)


BAD_ACTIONS = {
    "one string where a batch is due": ("abc", TypeError, "expected a tuple, list or 1-D array with one value per env"),
    "too few": (("a", "b"), ValueError, r"actions has 2 values; expected one per env \(3 envs of Text"),
    "a scalar array": (np.array("a", dtype=object), TypeError, "one value per env"),
}


@pytest.mark.parametrize("case", sorted(BAD_ACTIONS))
def test_bad_actions_are_refused_before_anything_is_sent(make_penv, case):
    actions, error, match = BAD_ACTIONS[case]
    penv = make_penv(echo_envs(KINDS["Text"]), asynchronous="continue")
    penv.reset(seed=0)
    with pytest.raises(error, match=match):
        penv.step(actions)
    obs, *_ = penv.step(("a", "b", "c"))  # nothing was sent: every env steps as before
    assert obs.tolist() == ["a", "b", "c"]


def unpicklable_draws(env: EchoEnv) -> None:
    """From now on ``env`` observes, at reset, a value that cannot be pickled."""
    env.observation_space.sample = lambda *args, **kwargs: [threading.Lock()]


def test_values_that_cannot_travel_fail_what_carries_them_only(make_penv, backend):
    penv = make_penv(echo_envs(KINDS["custom Space"]), asynchronous="continue")
    penv.reset(seed=0)
    penv.customized_method(unpicklable_draws, id=[1])
    lock = threading.Lock()
    if backend in ("dummy", "toy"):  # nothing crosses a process
        obs, _ = penv.reset()
        assert isinstance(obs[1][0], type(lock))
        obs, *_ = penv.step(([lock], [2], [3]))
        assert obs[0] == [lock]
        return
    with pytest.raises(EnvError) as caught:
        penv.reset()
    error = caught.value
    assert (error.env_index, error.method, error.failed_env_ids) == (1, "reset", [1])
    assert "its observation cannot be sent back from the worker process" in error.message
    obs, info = error.results
    assert info["env_id"].tolist() == [0, 2] and all(value in KINDS["custom Space"] for value in obs)
    with pytest.raises(TypeError, match="cannot be sent to where the envs run"):
        penv.step(([lock], [2], [3]))  # an action: refused in the caller, nothing sent
    obs, *_ = penv.step(([1], [2], [3]))
    assert obs.tolist() == [[1], [2], [3]]


def test_the_tensor_backend_refuses_spaces_of_no_fixed_shape():
    pytest.importorskip("torch")
    from parallelenv.tensor import TensorEnv

    class TextTensorEnv(TensorEnv):
        single_observation_space = KINDS["Text"]
        single_action_space = spaces.Discrete(2)

    with pytest.raises(TypeError, match="a TensorEnv's spaces must be Box, Discrete, MultiDiscrete or MultiBinary"):
        TextTensorEnv(4, "cpu")


def test_torch_output_refuses_spaces_of_no_fixed_shape(no_leaks):
    pytest.importorskip("torch")
    from parallelenv import ParallelEnv

    with pytest.raises(ValueError, match="no tensor form"):
        ParallelEnv([functools.partial(EchoEnv, KINDS["Text"], i) for i in range(2)], para_mode="subproc",
                    output="torch")
