"""One env's info out of a vector info: the one ``env_info`` that every consumer reads with."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

from parallelenv.infos import (
    env_info,
    every_scalar_as_python,
    numpy_scalars_as_python,
    python_dtypes_as_python,
    vector_info,
)


def merged() -> dict:
    """Env 0 sets every kind of value, env 1 a few, env 2 nothing."""
    return vector_info(
        [
            (0, {"count": 3, "small": np.int32(4), "flag": np.bool_(True), "row": np.arange(2.0),
                 "name": "a", "nested": {"depth": 1.5}, "empty": {}}),
            (1, {"count": 5, "name": 7}),  # "name" turns the column into objects
        ],
        3,
    )


def test_keys_are_those_the_masks_set_and_nested_dicts_follow_theirs():
    vector = merged()
    first = env_info(vector, 0)
    np.testing.assert_array_equal(first.pop("row"), [0.0, 1.0])
    assert first == {"count": 3, "small": 4, "flag": True, "name": "a", "nested": {"depth": 1.5}, "empty": {}}
    assert env_info(vector, 1) == {"count": 5, "name": 7}
    assert env_info(vector, 2) == {}


def test_a_key_with_no_mask_is_every_envs():
    vector = {"seen": np.array([1, 2]), "nested": {"x": np.array([3, 4])}}
    assert env_info(vector, 1) == {"seen": 2, "nested": {"x": 4}}


@pytest.mark.parametrize(
    ("scalars", "count", "small", "flag"),
    [
        # An np.bool_ is held in an object array, as Gymnasium's _add_info holds it: given back as it came.
        (numpy_scalars_as_python, int, int, np.bool_),
        (every_scalar_as_python, int, int, np.bool_),
        (python_dtypes_as_python, int, np.int32, np.bool_),  # Gymnasium's _add_info makes an int32 column of it again
    ],
)
def test_each_caller_picks_how_numpy_scalars_come_out(scalars, count, small, flag):
    info = env_info(merged(), 0, scalars)
    assert (type(info["count"]), type(info["small"]), type(info["flag"])) == (count, small, flag)
    assert type(info["nested"]["depth"]) is float and isinstance(info["row"], np.ndarray)


@pytest.mark.parametrize("scalars", [numpy_scalars_as_python, every_scalar_as_python, python_dtypes_as_python])
def test_a_value_among_objects_comes_back_as_the_env_gave_it(scalars):
    vector = {"x": np.array([np.array(2.5), np.bool_(True), None], dtype=object), "_x": np.array([True, True, False])}
    zero_d = env_info(vector, 0, scalars)["x"]
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d == 2.5
    assert type(env_info(vector, 1, scalars)["x"]) is np.bool_


def test_torch_rows_stay_tensors_but_for_align_batch():
    torch = pytest.importorskip("torch")
    vector = {"x": torch.tensor([1.5, 2.5]), "_x": torch.tensor([False, True]), "obs": torch.zeros(2, 3)}
    assert list(env_info(vector, 0, every_scalar_as_python)) == ["obs"]
    batch = env_info(vector, 1, every_scalar_as_python)
    assert type(batch["x"]) is float and batch["x"] == 2.5 and batch["obs"].shape == (3,)
    default = env_info(vector, 1)
    assert isinstance(default["x"], torch.Tensor) and default["x"].ndim == 0
    assert "x" not in env_info(vector, 0)


def test_any_mapping_of_columns_serves_as_a_dict_does():
    """Value and presence columns read in place (here read-only views) give what the merged dict gives."""
    vector = merged()
    columns = MappingProxyType({key: MappingProxyType(value) if isinstance(value, dict) else value
                                for key, value in vector.items()})
    for position in range(3):
        assert str(env_info(columns, position)) == str(env_info(vector, position))


def test_a_number_a_complex64_array_cannot_hold_makes_the_key_objects():
    # 3.4e38 overflows complex64 with a warning only (an error in this suite): the key's array becomes
    # objects, each env's value as it gave it; complex64 rows of the array's own dtype stay an array.
    info = vector_info(enumerate([{"a": np.complex64(1j)}, {"a": 3.4028235677973366e38}, {"a": 1.5}]), 3)
    assert info["a"].dtype == object and list(info["a"]) == [1j, 3.4028235677973366e38, 1.5]
    assert type(info["a"][1]) is float
    rows = vector_info(enumerate([{"r": np.zeros(2, np.complex64)}, {"r": np.ones(2, np.complex64)}]), 2)
    assert rows["r"].dtype == np.complex64 and rows["r"].shape == (2, 2)
