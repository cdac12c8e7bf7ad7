"""Per-step infos of every kind give the same vector infos on every backend as on dummy.

Numeric keys travel in the shared buffers' info columns on the process
backends (:mod:`parallelenv.infos.columns`), the rest in the replies;
a key whose type changes or that comes late mixes both in one step. Whatever
the road, the caller gets what the dummy backend gives, and what it holds is
not changed by later steps.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence

from parallelenv import ParallelEnv
from parallelenv.infos.columns import INFO_CELLS, InfoColumns, learn
from parallelenv.infos.step_infos import StepInfo

pytestmark = pytest.mark.local_backends


class EveryInfoEnv(gym.Env):
    """A step's info holds numbers of each type, an array, a string, a nested dict, keys that come and go
    and keys whose type changes, each on its own schedule per env (``tag``)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, tag: int = 0) -> None:
        self.tag = tag
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {"start": self.tag}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        t, tag = self.t, self.tag
        info: dict[str, Any] = {
            "x": 0.5 * t + tag, "count": t, "flag": bool((t + tag) % 2), "small": np.float32(tag),
            "wide": np.int16(t), "is_success": np.bool_(t % 3 == 0), "row": np.arange(3.0) * t,
            "name": f"env{tag}",
        }
        if (t + tag) % 4 == 0:
            info["late"] = t  # comes and goes
        if tag == 1 and t % 3 == 0:
            info["x"] = "not a number"  # a column's key with a value of another type
        if tag == 2 and t % 5 == 0:
            info["count"] = 0.25  # an int column's key with a float: the dtype is the first env's
        if tag == 3 and t % 2 == 0:
            del info["flag"]
        if t % 6 == 0:
            info["episode"] = {"r": float(t), "l": t}
        if tag == 0 and t % 7 == 0:
            info["row"] = np.arange(4.0)  # another shape
        obs = np.full(2, t / 100, np.float32)
        return obs, float(tag), False, t % 9 == 0, info


def run(make: Any, steps: int = 24, **options: Any) -> list[tuple[dict, dict]]:
    """Each step's info, and a deep copy taken when it was handed over."""
    penv = make([functools.partial(EveryInfoEnv, tag=i) for i in range(5)], **options)
    penv.reset(seed=0)
    seen = []
    for _ in range(steps):
        info = penv.step([0] * 5)[4]
        seen.append((info, copy.deepcopy(info)))
    penv.close()
    return seen


def same(ours: dict, theirs: dict, what: str) -> None:
    assert data_equivalence(ours, theirs, exact=True), f"{what}:\nours   {ours!r}\ntheirs {theirs!r}"


@pytest.mark.every_backend
@pytest.mark.timeout(180)
@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_every_kind_of_info_comes_out_as_on_dummy(make_penv, backend, asynchronous):
    if backend == "tensor":
        pytest.skip("the tensor backend runs one batched TensorEnv, whose infos are tensors it builds itself")
    theirs = run(functools.partial(ParallelEnv, para_mode="dummy", asynchronous=asynchronous))
    ours = run(functools.partial(make_penv, asynchronous=asynchronous))
    for t, ((info, _), (reference, _)) in enumerate(zip(ours, theirs, strict=True)):
        same(info, reference, f"step {t}")


@pytest.mark.every_backend
@pytest.mark.timeout(180)
def test_infos_held_are_not_changed_by_later_steps(make_penv, backend):
    if backend == "tensor":
        pytest.skip("the tensor backend runs one batched TensorEnv, whose infos are tensors it builds itself")
    for t, (info, at_hand_over) in enumerate(run(functools.partial(make_penv, asynchronous="restart"))):
        same(info, at_hand_over, f"step {t}")


class NumericInfoEnv(EveryInfoEnv):
    """Four float infos a step, as MuJoCo's envs return."""

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {key: float(self.t + k) for k, key in enumerate("abcd")}


@pytest.mark.timeout(120)
def test_numeric_keys_take_columns_on_subproc_and_their_steps_reply_with_nothing(no_leaks):
    with ParallelEnv([functools.partial(EveryInfoEnv, tag=i) for i in range(4)], para_mode="subproc",
                     num_workers=2) as penv:
        penv.reset(seed=0)
        penv.step([0] * 4)
        kinds = dict(penv.backend.buffers.info_columns.kinds)
        kinds.pop("late", None)  # in step 1 env 3's only: learned if its worker's reply came first
        # An np.bool_ goes into an object array of Gymnasium's vector info, which no column holds.
        assert kinds == {"x": float, "count": int, "flag": bool, "small": np.float32, "wide": np.int16,
                         "row": np.ndarray}
    with ParallelEnv([functools.partial(NumericInfoEnv, tag=i) for i in range(4)], para_mode="subproc",
                     num_workers=2) as penv:
        penv.reset(seed=0)
        collect, replies = penv.backend.collect, []

        def recorded(*args: Any, **kwargs: Any) -> list:
            new = collect(*args, **kwargs)
            replies.extend(new)
            return new

        penv.backend.collect = recorded
        for t in range(1, 4):
            replies.clear()
            _, _, _, _, info = penv.step([0] * 4)
            assert info["d"].tolist() == [t + 3.0] * 4 and info["_a"].all()
            # Learned from the first step's replies; the workers are told with the next step.
            assert all(bool(reply.values) == (t == 1) for reply in replies), (t, replies)


def test_a_key_of_two_types_in_one_step_gets_no_column():
    columns = learn([{"a": 1, "b": 1.0, "c": "s", "_d": 1.0, "reset": True, "e": np.zeros((2, 2), np.float32)},
                     {"a": 1.0, "b": 2.0, "e": np.ones((2, 2), np.float32)}])
    assert [(c.key, c.kind, c.shape) for c in columns] == [("b", float, ()), ("e", np.ndarray, (2, 2))]


def test_keys_past_the_cells_travel_in_the_replies():
    many = {f"k{i}": float(i) for i in range(INFO_CELLS + 3)}
    columns = learn([many])
    assert len(columns) == INFO_CELLS and columns[-1].first_cell == INFO_CELLS - 1
    big = learn([{"image": np.zeros(INFO_CELLS * 8 + 1, np.uint8), "x": 1.0}])
    assert [c.key for c in big] == ["x"]


def test_a_written_step_reads_back_as_the_vector_info_of_its_envs():
    n = 4
    columns = InfoColumns(np.zeros(INFO_CELLS * n * 8, np.uint8), np.zeros((INFO_CELLS, n), bool), n)
    columns.lay_out(learn([{"x": 1.0, "k": 3, "row": np.zeros(2, np.int32)}]))
    left = columns.write(slice(0, n), (0, 1, 2, 3), [{"x": 1.5, "k": 2}, {"x": "s", "k": 7, "name": "b"}, {},
                                                     {"row": np.array([1, 2], np.int32), "k": 2.5}])
    assert left == {1: {"x": "s", "name": "b"}, 3: {"k": 2.5}}
    vector = columns.vector(slice(None))
    np.testing.assert_array_equal(vector["x"], [1.5, 0, 0, 0])
    np.testing.assert_array_equal(vector["_k"], [True, True, False, False])
    np.testing.assert_array_equal(vector["row"], [[0, 0], [0, 0], [0, 0], [1, 2]])
    vector["x"][0] = 99.0  # a copy: the column keeps its value
    assert columns.vector(slice(None))["x"][0] == 1.5
    columns.forget([0, 1, 2, 3])
    assert columns.vector(slice(None)) == {}


def test_a_key_in_columns_and_replies_merges_as_if_all_came_in_replies():
    # Env 0's int came in its reply, env 1's float in a column: Gymnasium's dtype is env 0's.
    columns = {"k": np.array([0.0, 0.5]), "_k": np.array([False, True])}
    info = StepInfo({0: {"k": 1}}, columns, {"k": float}).vector(np.arange(2))
    np.testing.assert_array_equal(info["k"], [1, 0])
    assert info["k"].dtype == np.int64 and info["_k"].tolist() == [True, True]
    columns = {"k": np.array([0.5, 0.0]), "_k": np.array([True, False])}
    info = StepInfo({1: {"k": 1}}, columns, {"k": float}).vector(np.arange(2))
    assert info["k"].dtype == np.float64 and info["k"].tolist() == [0.5, 1.0]
