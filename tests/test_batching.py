"""The step path's action check gives what the general one gives, for every kind of batch."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from parallelenv.batching import SMALL_BATCH, batch_checker, check_batch

SPACES = {
    "Discrete(5)": spaces.Discrete(5),
    "Discrete(3, start=-1)": spaces.Discrete(3, start=-1),
    "Box(2,)": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "MultiBinary(3)": spaces.MultiBinary(3),
    "Dict": spaces.Dict({"a": spaces.Discrete(2)}),
}


class ArraySubclass(np.ndarray):
    pass


def batches(space: spaces.Space, n: int) -> dict[str, object]:
    """Good and bad batches for ``n`` envs of ``space``."""
    good = np.stack([space.sample() for _ in range(n)]) if not isinstance(space, spaces.Dict) else None
    cases: dict[str, object] = {
        "list": [space.sample() for _ in range(n)],
        "scalar": 1,
        "string": "0" * n,
        "one short": np.zeros((n - 1, *(space.shape or ())), np.int64),
        "float64 zeros": np.zeros((n, *(space.shape or ()))),
        "int64 zeros": np.zeros((n, *(space.shape or ())), np.int64),
        "bool": np.zeros((n, *(space.shape or ())), bool),
        "uint8 large": np.full((n, *(space.shape or ())), 200, np.uint8),
        "2-D of a row": np.zeros((n, 1, *(space.shape or ())), np.int64),
        "an ndarray subclass": np.zeros((n, *(space.shape or ())), np.int64).view(ArraySubclass),
    }
    if good is not None:
        cases["sampled"] = good
        cases["non-contiguous"] = np.repeat(good, 2, axis=0)[::2]
        for position in (0, n - 1):
            too_high = good.copy()
            too_high[position] = 99
            cases[f"99 at {position}"] = too_high
            too_low = good.astype(np.int64)
            too_low[position] = -7
            cases[f"-7 at {position}"] = too_low
        if isinstance(space, spaces.Discrete):  # one past either bound
            for value in (int(space.start) - 1, int(space.start + space.n)):
                edge = good.astype(np.int64)
                edge[n // 2] = value
                cases[f"{value} at {n // 2}"] = edge
    return cases


def outcome(check, values, n):
    try:
        result = check(values, n)
    except Exception as exc:
        return type(exc), str(exc)
    return "ok", result


@pytest.mark.parametrize("n", [1, 4, SMALL_BATCH + 3])
@pytest.mark.parametrize("name", list(SPACES))
def test_the_step_paths_check_agrees_with_check_batch(name, n):
    space = SPACES[name]
    space.seed(0)
    fast = batch_checker(space)
    for case, values in batches(space, n).items():
        expected, got = outcome(lambda v, k: check_batch(space, v, k), values, n), outcome(fast, values, n)
        assert expected[0] == got[0], (case, expected, got)
        if expected[0] == "ok":
            np.testing.assert_array_equal(np.asarray(got[1]) if not isinstance(got[1], dict) else got[1]["a"],
                                          np.asarray(expected[1]) if not isinstance(expected[1], dict)
                                          else expected[1]["a"], err_msg=case)
        else:
            assert got[1] == expected[1], case
