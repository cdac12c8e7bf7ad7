"""Envs must share their spaces: at start (``common_spaces``) and when one replaces another (``check_replacement``)."""

from __future__ import annotations

import pickle

import pytest
from envs import CountingEnv, OtherSpaceEnv

from parallelenv import EnvError, ParallelEnv
from parallelenv.backends.spaces import SpaceMismatch, check_replacement, common_spaces


def spaces_of(*envs):
    return [(env.observation_space, env.action_space) for env in envs]


def test_common_spaces_are_env_0s_and_a_mismatch_names_the_first_env_that_differs():
    same = spaces_of(CountingEnv(), CountingEnv())
    assert common_spaces(same) == same[0]
    with pytest.raises(SpaceMismatch, match=r"env 2 has action_space Discrete\(3\), but env 0 has Discrete\(5\)"):
        common_spaces(spaces_of(CountingEnv(), CountingEnv(), OtherSpaceEnv(), OtherSpaceEnv()))


def test_a_mismatch_survives_pickling_and_shifts_to_global_ids():
    """An actor reports its group's mismatch in its own ids; the caller names the envs in global ones."""
    with pytest.raises(SpaceMismatch) as raised:
        common_spaces(spaces_of(CountingEnv(), OtherSpaceEnv()))
    shifted = pickle.loads(pickle.dumps(raised.value)).shifted(4)
    assert isinstance(shifted, RuntimeError) and str(shifted).startswith("env 5 has action_space")
    assert "but env 4 has" in str(shifted)


def test_a_replacement_must_fit_the_rows_of_the_env_it_replaces():
    check_replacement(CountingEnv(1), CountingEnv(2), env_id=3)
    with pytest.raises(ValueError, match=r"the new env has action_space Discrete\(3\), but env 3 has Discrete\(5\)"):
        check_replacement(OtherSpaceEnv(), CountingEnv(), env_id=3)


class ClosingOtherSpaceEnv(OtherSpaceEnv):
    closed: list[int] = []

    def close(self) -> None:
        self.closed.append(self.tag)


def test_replace_envs_refuses_other_spaces_closes_the_new_env_and_keeps_the_old():
    """In the caller (dummy), so that the new env's close is seen."""
    with ParallelEnv([lambda: CountingEnv(0), lambda: CountingEnv(1)], para_mode="dummy") as penv:
        penv.reset(seed=0)
        with pytest.raises(EnvError, match="the new env has action_space"):
            penv.replace_envs([lambda: ClosingOtherSpaceEnv(7)], id=[1])
        assert ClosingOtherSpaceEnv.closed == [7]
        assert penv.get_env_attr("tag") == [0, 1]
