"""Properties of ``id`` and ``seed``: checked directly, then end to end on a dummy ParallelEnv.

The contract (docs/design.rst, "``id``"): an int, a list or a NumPy array of env
indices, in any order; results come back in that order; out-of-range,
duplicated or wrongly typed indices raise ``ValueError``/``TypeError`` naming
the bad index before anything is sent. An int seed gives each env its own
independent seed; a list gives one seed per env of ``id``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from envs import CountingEnv, counting
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from parallelenv import ParallelEnv
from parallelenv.arguments import env_ids, env_seeds

# Mostly checks of the front object: on the Ray backends only where marked every_backend.
pytestmark = pytest.mark.local_backends

# No database: the suite must not write into the checkout; no deadline: the
# machine is shared, and timing is not what these tests are about.
PROPERTY = settings(database=None, deadline=None, max_examples=150)
END_TO_END = settings(
    database=None, deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
MAX_ENVS = 12


@st.composite
def envs_and_ids(draw: st.DrawFn, min_size: int = 1) -> tuple[int, list[int]]:
    """A number of envs and distinct indices among them, in any order."""
    n = draw(st.integers(1, MAX_ENVS))
    order = draw(st.permutations(range(n)))
    k = draw(st.integers(min(min_size, n), n))
    return n, list(order[:k])


FORMS = ["list", "tuple", "array", "int", "numpy int"]


def write_id(ids: list[int], form: str, dtype: type) -> Any:
    """``ids`` written in one of the forms a user may pass (scalar forms need one id)."""
    if form == "list":
        return list(ids)
    if form == "tuple":
        return tuple(ids)
    if form == "int":
        return ids[0]
    if form == "numpy int":
        return dtype(ids[0])
    return np.array(ids, dtype=dtype)


@st.composite
def id_forms(draw: st.DrawFn, ids: list[int]) -> Any:
    forms = FORMS if len(ids) == 1 else FORMS[:3]
    return write_id(ids, draw(st.sampled_from(forms)), draw(st.sampled_from(INT_DTYPES)))


def names(message: str, value: Any) -> bool:
    """Whether ``message`` names ``value`` as a token of its own (not inside a longer number)."""
    texts = {repr(value)} if isinstance(value, (str, bytes)) else {str(value), repr(value)}
    for text in texts:
        if re.search(rf"(?<![\w.-]){re.escape(text)}(?![\w.])", message):
            return True
    return False


# ---------------------------------------------------------------- valid ids


@PROPERTY
@given(st.data())
def test_valid_ids_map_to_the_same_indices_in_the_same_order(data):
    n, ids = data.draw(envs_and_ids())
    given_id = data.draw(id_forms(ids))
    result = env_ids(given_id, n)
    assert result.dtype == np.int64 and result.ndim == 1
    assert result.tolist() == ids


@pytest.mark.parametrize("n", [1, 5])
def test_none_means_every_env_in_order(n):
    assert env_ids(None, n).tolist() == list(range(n))


# ---------------------------------------------------------------- invalid ids


@st.composite
def out_of_range(draw: st.DrawFn) -> tuple[int, list[int], int]:
    """Valid ids with one index outside ``range(n)`` inserted somewhere."""
    n, ids = draw(envs_and_ids())
    bad = draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=n)))
    position = draw(st.integers(0, len(ids)))
    return n, [*ids[:position], bad, *ids[position:]], bad


@PROPERTY
@given(out_of_range())
@example((5, [0, 2**64], 2**64))  # too big for int64
@example((5, [0, 2**63], 2**63))
@example((5, [-(2**63) - 1], -(2**63) - 1))
def test_out_of_range_ids_in_a_list_are_refused_naming_the_index(case):
    n, ids, bad = case
    for given_id in (ids, tuple(ids)) + ((bad,) if len(ids) == 1 else ()):
        with pytest.raises(ValueError) as caught:
            env_ids(given_id, n)
        assert names(str(caught.value), bad), (given_id, str(caught.value))


@PROPERTY
@given(st.data())
def test_out_of_range_ids_in_an_array_are_refused_naming_the_index(data):
    dtype = np.dtype(data.draw(st.sampled_from(INT_DTYPES)))
    info = np.iinfo(dtype)
    top = min(int(info.max), 2**63 - 1)  # uint64 ids above int64: test_huge_uint64_ids_are_named_as_given
    n = data.draw(st.integers(1, min(MAX_ENVS, top)))
    bad = data.draw(
        st.one_of(st.integers(int(info.min), -1), st.integers(n, top)) if info.min < 0 else st.integers(n, top)
    )
    ids = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    ids.insert(data.draw(st.integers(0, len(ids))), bad)
    with pytest.raises(ValueError) as caught:
        env_ids(np.array(ids, dtype=dtype), n)
    assert names(str(caught.value), bad), (ids, dtype, str(caught.value))
    if len(ids) == 1:
        with pytest.raises(ValueError) as caught:
            env_ids(dtype.type(bad), n)
        assert names(str(caught.value), bad), (bad, dtype, str(caught.value))


@pytest.mark.parametrize("bad", [2**63, 2**64 - 1])
def test_huge_uint64_ids_are_named_as_given(bad):
    with pytest.raises(ValueError) as caught:
        env_ids(np.array([0, bad], dtype=np.uint64), 5)
    assert names(str(caught.value), bad), str(caught.value)


@PROPERTY
@given(envs_and_ids(min_size=1), st.data())
def test_duplicated_ids_are_refused_naming_the_index(case, data):
    n, ids = case
    duplicate = data.draw(st.sampled_from(ids))
    with_duplicate = list(ids)
    with_duplicate.insert(data.draw(st.integers(0, len(ids))), duplicate)
    for given_id in (with_duplicate, tuple(with_duplicate), np.array(with_duplicate)):
        with pytest.raises(ValueError) as caught:
            env_ids(given_id, n)
        assert names(str(caught.value), duplicate), str(caught.value)


BAD_SCALARS = st.one_of(
    st.booleans(),
    st.sampled_from([np.True_, np.False_]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.0, 0.0, np.float64(1.0), np.float32(2.0)]),
    st.text(max_size=3),
    st.sampled_from(["0", b"1", "1, 2"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=2),
    st.tuples(st.integers(0, 3)),
    st.just({0: 1}),
    st.just({1}),
)


@PROPERTY
@given(st.data(), BAD_SCALARS)
def test_wrongly_typed_items_of_an_id_list_are_refused_naming_the_value(data, bad):
    n, ids = data.draw(envs_and_ids())
    position = data.draw(st.integers(0, len(ids)))
    with_bad = [*ids[:position], bad, *ids[position:]]
    for given_id in (with_bad, tuple(with_bad)):
        with pytest.raises(TypeError) as caught:
            env_ids(given_id, n)
        assert names(str(caught.value), bad), (given_id, str(caught.value))


@PROPERTY
@given(st.integers(1, MAX_ENVS), BAD_SCALARS.filter(lambda bad: not isinstance(bad, (list, tuple))))
@example(5, 1.5)
@example(5, "0")
def test_a_wrongly_typed_scalar_id_is_refused_naming_the_value(n, bad):
    with pytest.raises(TypeError) as caught:
        env_ids(bad, n)
    assert names(str(caught.value), bad), (bad, str(caught.value))


@pytest.mark.parametrize(
    "bad",
    [
        np.array([0.0, 1.0]),
        np.array([True, False]),
        np.array(["0", "1"]),
        np.array([[0, 1]]),
        np.array(1),
        np.array([0, 1], dtype=object),
    ],
    ids=["float", "bool", "str", "2-D", "0-D", "object"],
)
def test_arrays_that_are_not_1d_integer_are_refused_naming_what_they_are(bad):
    with pytest.raises(TypeError) as caught:
        env_ids(bad, 5)
    message = str(caught.value)
    assert str(bad.dtype) in message or str(bad.shape) in message, message


@pytest.mark.parametrize("empty", [[], (), np.array([], dtype=np.int64)])
def test_empty_ids_are_refused(empty):
    with pytest.raises(ValueError, match="no env"):
        env_ids(empty, 3)


# ---------------------------------------------------------------- seeds


@PROPERTY
@given(st.integers(0, 2**128), envs_and_ids())
def test_int_seed_gives_each_env_a_seed_independent_of_the_other_ids(seed, case):
    n, ids = case
    everyone = env_seeds(seed, np.arange(n))
    assert len(set(everyone)) == n  # distinct seeds for distinct envs
    assert all(isinstance(s, int) and s >= 0 for s in everyone)
    assert env_seeds(seed, np.array(ids)) == tuple(everyone[i] for i in ids)
    assert env_seeds(np.uint64(seed % 2**64), np.array(ids)) == env_seeds(seed % 2**64, np.array(ids))


@PROPERTY
@given(st.integers(1, 2**64), st.integers(0, 2**64), st.integers(0, MAX_ENVS - 2))
def test_seeds_do_not_overlap_between_base_seeds(seed, other, i):
    ids = np.arange(i + 2)
    mine = env_seeds(seed, ids)
    # Unlike `seed + i`: env i+1 under seed-1 is not env i under seed.
    assert env_seeds(seed - 1, ids)[i + 1] != mine[i]
    if other != seed:
        assert env_seeds(other, ids)[i] != mine[i]


@PROPERTY
@given(envs_and_ids(), st.data())
def test_a_seed_list_gives_one_seed_per_id(case, data):
    n, ids = case
    seeds = data.draw(st.lists(st.none() | st.integers(0, 2**64), min_size=len(ids), max_size=len(ids)))
    assert env_seeds(seeds, np.array(ids)) == tuple(seeds)
    assert env_seeds(None, np.array(ids)) == (None,) * len(ids)


@PROPERTY
@given(envs_and_ids(), st.integers(-(2**64), -1), st.data())
def test_negative_seeds_are_refused_naming_them(case, negative, data):
    n, ids = case
    with pytest.raises(ValueError) as caught:
        env_seeds(negative, np.array(ids))
    assert names(str(caught.value), negative)
    seeds = data.draw(st.lists(st.integers(0, 100), min_size=len(ids), max_size=len(ids)))
    position = data.draw(st.integers(0, len(ids) - 1))
    seeds[position] = negative
    with pytest.raises(ValueError) as caught:
        env_seeds(seeds, np.array(ids))
    assert names(str(caught.value), negative) and f"seed[{position}]" in str(caught.value)


@pytest.mark.parametrize("length", [0, 2, 4])
def test_a_seed_list_of_the_wrong_length_is_refused(length):
    with pytest.raises(ValueError, match=rf"seed has {length} entries for 3 envs"):
        env_seeds([0] * length, np.array([0, 1, 2]))


# ---------------------------------------------------------------- end to end, in order of id


def dummy_penv(n: int) -> ParallelEnv:
    return ParallelEnv([counting(tag, episode_length=100) for tag in range(n)], para_mode="dummy")


@END_TO_END
@given(envs_and_ids(), st.sampled_from(FORMS[:3]), st.sampled_from(INT_DTYPES), st.integers(0, 4))
@example((4, [0, 2, 1, 3]), "list", np.int64, 1)  # a permutation of a contiguous block
@example((7, [1, 0, 3]), "array", np.uint8, 0)
def test_results_come_back_in_the_order_of_id(case, form, dtype, shift):
    n, ids = case
    given_id = write_id(ids, form, dtype)
    actions = [(tag + shift) % 5 for tag in ids]
    with dummy_penv(n) as penv:
        obs, info = penv.reset(seed=0, id=given_id)
        np.testing.assert_array_equal(obs[:, 0], ids)
        obs, reward, terminated, truncated, info = penv.step(np.array(actions), id=given_id)
        np.testing.assert_array_equal(obs[:, 0], ids)
        np.testing.assert_array_equal(obs[:, 2], actions)
        np.testing.assert_array_equal(reward, [10 * tag + 1 for tag in ids])
        batch = penv.step(actions, id=given_id, align="batch")
        assert [int(result[0][0]) for result in batch] == ids
        assert [result[1] for result in batch] == [10 * tag + 2 for tag in ids]
        assert penv.get_env_attr("tag", id=given_id) == ids
        assert penv.get_env_attr("step_calls") == [2 if i in ids else 0 for i in range(n)]
        assert penv.customized_method("describe", id=given_id) == [f"env {tag}" for tag in ids]
        values = [tag * 3 - shift for tag in ids]
        assert penv.customized_method("double", data=values, id=given_id) == [2 * v for v in values]
        penv.set_env_attr("gravity", 1.5, id=given_id)
        assert penv.get_env_attr("gravity") == [1.5 if i in ids else 9.8 for i in range(n)]


@END_TO_END
@given(st.integers(0, 2**64), envs_and_ids())
def test_an_int_seed_draws_the_same_per_env_whatever_else_is_reset(seed, case):
    n, ids = case
    with dummy_penv(n) as penv:
        _, info = penv.reset(seed=seed)
        everyone = info["seed_draw"]
        _, info = penv.reset(seed=seed, id=ids)
        np.testing.assert_array_equal(info["seed_draw"], everyone[ids])


@END_TO_END
@given(envs_and_ids(), st.data())
def test_a_seed_list_seeds_the_envs_of_id_one_each(case, data):
    n, ids = case
    seeds = data.draw(st.lists(st.integers(0, 2**32), min_size=len(ids), max_size=len(ids)))
    with dummy_penv(n) as penv:
        _, info = penv.reset(seed=seeds, id=ids)
    expected = [CountingEnv().reset(seed=s)[1]["seed_draw"] for s in seeds]
    np.testing.assert_array_equal(info["seed_draw"], expected)


@END_TO_END
@given(st.integers(0, 2**32), st.integers(2, MAX_ENVS))
def test_neighbouring_base_seeds_do_not_share_env_streams(seed, n):
    with dummy_penv(n) as penv:
        _, info = penv.reset(seed=seed + 1)
        draws = info["seed_draw"]
        _, info = penv.reset(seed=seed)
        shifted = info["seed_draw"]
    assert len(set(draws.tolist())) == n
    assert not set(draws[:-1].tolist()) & set(shifted[1:].tolist())


@pytest.mark.parametrize(("bad", "error"), [([0, 7], ValueError), ([1, 1], ValueError), ([0, 1.0], TypeError)])
def test_bad_ids_reach_no_env(bad, error):
    with dummy_penv(3) as penv:
        penv.reset(seed=0)
        with pytest.raises(error):
            penv.step([0, 0], id=bad)
        with pytest.raises(error):
            penv.get_env_attr("tag", id=bad)
        with pytest.raises(error):
            penv.customized_method("double", data=[1, 2], id=bad)
        assert penv.get_env_attr("step_calls") == [0, 0, 0]


@pytest.mark.parametrize("ids", [[0, 2, 1, 3], [1, 0, 3], [3, 2, 1, 0], [5, 4, 6, 0, 1], [6, 0]])
def test_step_results_follow_an_unsorted_id(make_penv, ids):
    # Seven envs: subproc's two workers host envs 0-3 and 4-6.
    penv = make_penv([counting(tag, episode_length=100) for tag in range(7)])
    penv.reset(seed=0)
    actions = [(p + 1) % 5 for p in range(len(ids))]
    obs, reward, terminated, truncated, info = penv.step(actions, id=ids)
    np.testing.assert_array_equal(obs[:, 0], ids)
    np.testing.assert_array_equal(obs[:, 1], [1] * len(ids))
    np.testing.assert_array_equal(obs[:, 2], actions)
    np.testing.assert_array_equal(reward, [10 * tag + 1 for tag in ids])
    batch = penv.step(actions, id=ids, align="batch")
    assert [(int(o[0]), int(o[1]), int(o[2]), r) for o, r, *_ in batch] == [
        (tag, 2, a, 10 * tag + 2) for tag, a in zip(ids, actions, strict=True)
    ]
