"""Every info value comes back exactly as the env gave it, on every backend, by whichever road it took.

Hypothesis draws each env's info for each step from every kind of value an
env returns (Python's and NumPy's scalars of every dtype, ``np.bool_``, 0-d
and n-d arrays, strings, None, nested dicts), under keys that come and go
and change type from step to step and env to env. Each backend's per-env
infos (``align="batch"``) must be the drawn dicts exactly (type, dtype,
shape, value), and its vector info (``align="item"``) ``dummy``'s; the
Gymnasium view's infos must be ``SyncVectorEnv``'s in each autoreset mode.

One ParallelEnv per backend serves every example: its info columns learned
from one example's values meet the next example's, which is what keys that
change type do to a long run.
"""

from __future__ import annotations

import cmath
import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parallelenv import ParallelEnv
from parallelenv.infos import env_info, joined_rows, vector_info
from parallelenv.integrations.gymnasium import GymnasiumVectorEnv

NUM_ENVS = 3
STEPS = 3
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64]


class ScriptedInfoEnv(gym.Env):
    """Returns the info its script holds for each step; its episodes end where the script says."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.script: list[tuple[dict[str, Any], bool]] = []
        self.t = 0

    def set_script(self, script: list[tuple[dict[str, Any], bool]]) -> None:
        self.script, self.t = script, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.full(2, -1.0, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        info, terminated = self.script[self.t % len(self.script)] if self.script else ({}, False)
        self.t += 1
        return np.full(2, self.t / 100, np.float32), 1.0, terminated, False, info


def numpy_scalar(dtype: type) -> st.SearchStrategy[Any]:
    return st.integers(0, 100).map(lambda v: dtype(v % 2 if dtype is np.bool_ else v))


LEAVES = st.one_of(
    st.booleans(),
    st.integers(-(2 ** 70), 2 ** 70),  # past int64 too: no column holds it
    st.floats(allow_nan=False, width=64),
    st.text(max_size=3),
    st.none(),
    st.sampled_from(DTYPES).flatmap(numpy_scalar),
    st.sampled_from(DTYPES).flatmap(lambda d: numpy_scalar(d).map(np.asarray)),  # 0-d arrays
    st.tuples(st.sampled_from(DTYPES), st.sampled_from([(2,), (1, 3)])).map(
        lambda pair: np.arange(int(np.prod(pair[1]))).astype(pair[0]).reshape(pair[1])
    ),
)
PYTHON_NUMBERS = st.one_of(st.booleans(), st.integers(-(2 ** 40), 2 ** 40), st.floats(allow_nan=False, width=64))
NUMPY_SCALARS = st.sampled_from(DTYPES).flatmap(numpy_scalar)
ZERO_D = NUMPY_SCALARS.map(np.asarray)
ROWS = st.sampled_from(DTYPES).map(lambda dtype: np.arange(2).astype(dtype))
OBJECTS = st.one_of(st.text(max_size=3), st.none(), NUMPY_SCALARS)
KEYS = st.sampled_from(["a", "b", "c", "d"])
INFOS = st.dictionaries(KEYS, st.one_of(LEAVES, st.dictionaries(KEYS, LEAVES, max_size=2)), max_size=4)
SCRIPTS = st.lists(st.lists(st.tuples(INFOS, st.booleans()), min_size=STEPS, max_size=STEPS),
                   min_size=NUM_ENVS, max_size=NUM_ENVS)
# For the Gymnasium view: each key holds one family of values, so that SyncVectorEnv can merge most draws
# (it raises on an array of another shape, a str after a number, a key nested in one env and not another).
VIEW_INFOS = st.fixed_dictionaries({}, optional={
    "number": PYTHON_NUMBERS, "scalar": NUMPY_SCALARS, "zero_d": ZERO_D, "row": ROWS, "object": OBJECTS,
    "nested": st.fixed_dictionaries({}, optional={"number": PYTHON_NUMBERS, "scalar": NUMPY_SCALARS}),
})
VIEW_SCRIPTS = st.lists(st.lists(st.tuples(VIEW_INFOS, st.booleans()), min_size=STEPS, max_size=STEPS),
                        min_size=NUM_ENVS, max_size=NUM_ENVS)
# Few examples on each backend: a step of a Ray backend takes milliseconds, and each example is 2 x STEPS steps.
EXAMPLES = {"dummy": 200, "subproc": 100, "ray": 20, "ray-subproc": 20}


def same(ours: Any, theirs: Any, where: str) -> None:
    """``ours`` is ``theirs`` in type, dtype, shape and value, recursively."""
    assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} where the env gave {type(theirs).__name__}"
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs) or set(ours) == set(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, \
            f"{where}: {ours.dtype}{ours.shape} where the env gave {theirs.dtype}{theirs.shape}"
        if theirs.dtype == object:
            for index in np.ndindex(theirs.shape):
                same(ours[index], theirs[index], f"{where}{list(index)}")
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=where)
    elif isinstance(theirs, float | np.floating) and math.isnan(theirs):
        assert math.isnan(ours), where
    elif isinstance(theirs, complex | np.complexfloating) and cmath.isnan(theirs):
        assert cmath.isnan(ours), where
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def scripted(penv: ParallelEnv, scripts: list[list[tuple[dict[str, Any], bool]]]) -> None:
    penv.customized_method("set_script", data=[{"script": script} for script in scripts])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["subproc", "ray", "ray-subproc"])
def test_every_info_value_comes_back_as_the_env_gave_it_on_every_backend(backend, request, no_leaks):
    if backend.startswith("ray"):
        request.getfixturevalue("ray_session")
    options = {"num_workers": 2} if backend == "subproc" else {"num_actors": 2} if backend == "ray-subproc" else {}
    with ParallelEnv([ScriptedInfoEnv for _ in range(NUM_ENVS)], asynchronous="continue") as reference, \
            ParallelEnv([ScriptedInfoEnv for _ in range(NUM_ENVS)], para_mode=backend, asynchronous="continue",
                        **options) as penv:

        @settings(max_examples=EXAMPLES[backend], deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(scripts=SCRIPTS)
        def check(scripts: list[list[tuple[dict[str, Any], bool]]]) -> None:
            for each in (reference, penv):
                scripted(each, scripts)
                each.reset(seed=0)
            for t in range(STEPS):  # per env: exactly the drawn dicts
                results = penv.step([0] * NUM_ENVS, align="batch")
                for i, result in enumerate(results):
                    same(result[4], scripts[i][t][0], f"{backend}, step {t}, env {i}'s info")
            for each in (reference, penv):
                scripted(each, scripts)
            for t in range(STEPS):  # as a vector info: dummy's
                expected = reference.step([0] * NUM_ENVS)[4]
                same(penv.step([0] * NUM_ENVS)[4], expected, f"{backend}, step {t}'s vector info")

        check()


def test_every_info_value_comes_back_as_the_env_gave_it_on_dummy(no_leaks):
    with ParallelEnv([ScriptedInfoEnv for _ in range(NUM_ENVS)], asynchronous="continue") as penv:

        @settings(max_examples=EXAMPLES["dummy"], deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(scripts=SCRIPTS)
        def check(scripts: list[list[tuple[dict[str, Any], bool]]]) -> None:
            scripted(penv, scripts)
            penv.reset(seed=0)
            for t in range(STEPS):
                for i, result in enumerate(penv.step([0] * NUM_ENVS, align="batch")):
                    same(result[4], scripts[i][t][0], f"step {t}, env {i}'s info")

        check()


VIEW_MODES = {AutoresetMode.SAME_STEP: "restart", AutoresetMode.NEXT_STEP: "idle", AutoresetMode.DISABLED: "continue"}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["dummy", "subproc"])
@pytest.mark.parametrize("mode", list(VIEW_MODES), ids=lambda mode: mode.value)
def test_the_gymnasium_views_infos_are_sync_vector_envs(backend, mode, no_leaks):
    options = {"num_workers": 2} if backend == "subproc" else {}
    penv = ParallelEnv([ScriptedInfoEnv for _ in range(NUM_ENVS)], para_mode=backend, asynchronous=VIEW_MODES[mode],
                       **options)
    ours = GymnasiumVectorEnv(penv, autoreset_mode=mode)
    theirs = SyncVectorEnv([ScriptedInfoEnv for _ in range(NUM_ENVS)], autoreset_mode=mode)
    try:

        @settings(max_examples=EXAMPLES[backend], deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(scripts=VIEW_SCRIPTS)
        def check(scripts: list[list[tuple[dict[str, Any], bool]]]) -> None:
            for i, script in enumerate(scripts):
                theirs.envs[i].unwrapped.set_script(script)
            penv.customized_method("set_script", data=[{"script": script} for script in scripts])
            ours.reset(seed=0)
            theirs.reset(seed=0)
            for t in range(STEPS):
                try:
                    expected = theirs.step(np.zeros(NUM_ENVS, dtype=np.int64))
                except Exception:  # noqa: BLE001  (warnings are errors here: a lossy cast too)
                    assume(False)  # values SyncVectorEnv itself cannot merge (a str after a float, a complex)
                got = ours.step(np.zeros(NUM_ENVS, dtype=np.int64))
                np.testing.assert_array_equal(got[0], expected[0])
                same(got[4], expected[4], f"{mode.value} on {backend}, step {t}'s info")
                if mode is AutoresetMode.DISABLED:
                    done = expected[2] | expected[3]
                    if done.any():
                        ours.reset(options={"reset_mask": done})
                        theirs.reset(options={"reset_mask": done})

        check()
    finally:
        ours.close()
        theirs.close()


# A few returns of recv, each a vector info of its envs, as overlapped collection gathers one half from them.
RETURNS = st.lists(st.lists(INFOS, min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(returns=RETURNS, data=st.data())
def test_rows_joined_from_several_vector_infos_are_each_envs_as_its_own_vector_held_it(returns, data):
    try:
        vectors = [vector_info(enumerate(infos), len(infos)) for infos in returns]
    except Warning:  # a cast NumPy warns of (a float past complex64's range) while the returns are made
        assume(False)
    places = [(batch, row) for batch, infos in enumerate(returns) for row in range(len(infos))]
    taken = data.draw(st.permutations(places).flatmap(lambda order: st.sampled_from(range(1, len(order) + 1)).map(
        lambda count: order[:count])))
    parts = []
    for batch in sorted({batch for batch, _ in taken}):
        positions = [position for position, (b, _) in enumerate(taken) if b == batch]
        parts.append((vectors[batch], np.array([taken[p][1] for p in positions]), np.array(positions)))
    joined = joined_rows(parts, len(taken))
    # None: some key differs in kind or dtype between the parts; the caller then merges each env's info again.
    assume(joined is not None)
    for position, (batch, row) in enumerate(taken):
        same(env_info(joined, position), env_info(vectors[batch], row),
             f"position {position} (return {batch}, row {row})")
    assert all(joined[key].any() for key in joined if key.startswith("_")), "a key no env taken has"
    for key, value in joined.items():
        if isinstance(value, np.ndarray) and not key.startswith("_"):
            sources = [vectors[batch][key] for batch, row in taken if key in vectors[batch]
                       and vectors[batch]["_" + key][row]]
            assert all(value.dtype == source.dtype for source in sources), key
