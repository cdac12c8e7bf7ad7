"""The behaviour docs/design.rst promises, asserted for every backend.

Every test takes ``make_penv``, which is parametrised over the registered
backends; a new backend is done when this file passes unchanged.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import build
from envs import CountingEnv, DictObsEnv, WideCountingEnv, counting
from gymnasium.vector.utils import batch_space

from parallelenv import ParallelEnv
from parallelenv.arguments import env_seeds


def counting_envs(lengths: list[int], terminate: bool = True) -> list:
    return [counting(tag, length, terminate) for tag, length in enumerate(lengths)]


# ------------------------------------------------------------------ shapes and spaces


def test_reset_returns_batched_obs_and_vector_info(make_penv):
    penv = make_penv(counting_envs([3] * 5))
    obs, info = penv.reset(seed=0)
    assert len(penv) == 5
    assert obs.shape == (5, 4) and obs.dtype == np.float64
    np.testing.assert_array_equal(obs[:, 0], np.arange(5))
    assert info["seed_draw"].shape == (5,) and info["_seed_draw"].all()
    np.testing.assert_array_equal(obs[:, 3], info["seed_draw"])


def test_spaces_follow_gymnasium_batching(make_penv):
    penv = make_penv([DictObsEnv] * 3)
    assert penv.single_observation_space == DictObsEnv.observation_space
    assert penv.single_action_space == DictObsEnv.action_space
    assert penv.observation_space == batch_space(DictObsEnv.observation_space, 3)
    assert penv.action_space == batch_space(DictObsEnv.action_space, 3)


def test_step_item_types(make_penv, backend):
    penv = make_penv(counting_envs([5] * 4))
    penv.reset(seed=1)
    obs, reward, terminated, truncated, info = penv.step(np.array([1, 2, 3, 4]))
    assert obs.shape == (4, 4)
    reward_dtype = np.float32 if backend == "tensor" else np.float64  # torch's default float, on the device
    assert reward.dtype == reward_dtype and terminated.dtype == bool and truncated.dtype == bool
    np.testing.assert_array_equal(obs[:, 2], [1, 2, 3, 4])
    np.testing.assert_array_equal(reward, [1, 11, 21, 31])
    assert info == {}  # odd counts carry no info
    *_, info = penv.step([0, 0, 0, 0])
    np.testing.assert_array_equal(info["count"], [2, 2, 2, 2])
    assert info["_count"].all()


def test_step_batch_alignment(make_penv):
    penv = make_penv(counting_envs([5] * 3))
    penv.reset(seed=0)
    results = penv.step([4, 3, 2], align="batch")
    assert len(results) == 3
    for tag, (obs, reward, terminated, truncated, info) in enumerate(results):
        assert obs.shape == (4,) and obs[0] == tag and obs[2] == 4 - tag
        assert reward == tag * 10 + 1 and isinstance(reward, float)
        assert terminated is False and truncated is False and info == {}
    obs_info = penv.reset(seed=0, align="batch")
    assert [o[0] for o, _ in obs_info] == [0, 1, 2] and "seed_draw" in obs_info[0][1]


def test_dict_and_tuple_observations(make_penv):
    penv = make_penv([DictObsEnv] * 3)
    obs, _ = penv.reset(seed=3)
    assert obs["position"].shape == (3, 2) and obs["grid"].shape == (3, 2, 3)
    assert obs["pair"][0].shape == (3,) and obs["pair"][1].shape == (3, 1)
    obs, *_ = penv.step(np.zeros((3, 2), np.float32))
    assert penv.observation_space.contains(obs)
    (single, *_), *_ = penv.step(np.zeros((3, 2), np.float32), align="batch")
    assert penv.single_observation_space.contains(single)


def test_ids_select_envs_and_order_results(make_penv):
    penv = make_penv(counting_envs([9] * 5))
    penv.reset(seed=0)
    obs, reward, *_ = penv.step([1, 2], id=[3, 0])
    np.testing.assert_array_equal(obs[:, 0], [3, 0])
    np.testing.assert_array_equal(obs[:, 2], [1, 2])
    assert penv.get_env_attr("step_calls") == [1, 0, 0, 1, 0]
    obs, _ = penv.reset(id=np.array([4, 1]))
    np.testing.assert_array_equal(obs[:, 0], [4, 1])
    obs, *_ = penv.step([0], id=2)
    assert obs.shape == (1, 4) and obs[0, 0] == 2


def test_env_instances_and_factories_mix(make_penv):
    penv = make_penv([CountingEnv(0), counting(1)])
    obs, _ = penv.reset()
    np.testing.assert_array_equal(obs[:, 0], [0, 1])


def test_make_builds_registered_envs(backend):
    options = build(backend).options
    with ParallelEnv.make("CartPole-v1", num_envs=3, para_mode=backend, backend_options=options) as penv:
        obs, _ = penv.reset(seed=0)
        assert obs.shape == (3, 4)
        assert [spec.id for spec in penv.get_env_attr("spec")] == ["CartPole-v1"] * 3


# ------------------------------------------------------------------ seeds


def test_int_seed_is_reproducible_and_per_env(make_penv):
    penv = make_penv(counting_envs([3] * 4))
    first, _ = penv.reset(seed=7)
    again, _ = penv.reset(seed=7)
    other, _ = penv.reset(seed=8)
    np.testing.assert_array_equal(first, again)
    assert len(set(first[:, 3])) == 4  # every env its own stream
    assert not np.array_equal(first[:, 3], other[:, 3])
    alone, _ = penv.reset(seed=7, id=[2])
    assert alone[0, 3] == first[2, 3]  # an env's seed does not depend on who resets with it


def test_seed_list_and_options(make_penv):
    penv = make_penv(counting_envs([3] * 3))
    obs, _ = penv.reset(seed=[5, None, 5], options={"start": 2})
    assert obs[0, 3] == obs[2, 3]
    np.testing.assert_array_equal(obs[:, 1], [2, 2, 2])
    obs, _ = penv.reset(options=[{"start": 1}, None, {"start": 4}])
    np.testing.assert_array_equal(obs[:, 1], [1, 0, 4])


# ------------------------------------------------------------------ asynchronous policies


@pytest.mark.parametrize("terminate", [True, False])
def test_restart_resets_in_the_same_step(make_penv, terminate):
    penv = make_penv(counting_envs([2, 3], terminate), asynchronous="restart")
    penv.reset(seed=0)
    penv.step([1, 1])
    obs, reward, terminated, truncated, info = penv.step([2, 2])
    done = terminated if terminate else truncated
    np.testing.assert_array_equal(done, [True, False])
    assert obs[0, 1] == 0 and obs[0, 2] == -1  # the first obs of the new episode
    np.testing.assert_array_equal(info["reset"], [True, False])
    np.testing.assert_array_equal(info["_reset"], [True, False])
    assert info["ended_state"][0][:3].tolist() == [0, 2, 2]  # tag, count, last action
    assert info["_ended_state"].tolist() == [True, False]
    per_env = penv.step([3, 3], align="batch")
    assert per_env[1][4]["reset"] is True and per_env[1][4]["ended_state"][1] == 3


def test_restart_reports_an_ended_episode_only_in_the_step_that_ended_it(make_penv):
    penv = make_penv(counting_envs([2, 5, 2]), asynchronous="restart")
    penv.reset(seed=0)
    penv.step([1, 1, 1])
    penv.send([2, 2], id=[0, 1])  # env 0's episode ends; env 2 waits
    _, _, terminated, _, info = penv.recv()
    assert terminated.tolist() == [True, False] and info["_ended_state"].tolist() == [True, False]
    _, _, terminated, _, info = penv.step([3, 3], id=[1, 0])  # env 0 is in its new episode
    assert terminated.tolist() == [False, False] and "ended_state" not in info and "reset" not in info
    penv.send([4], id=[2])
    penv.send([4], id=[0])  # env 0 ends its second episode, env 2 its first
    per_env = penv.recv(align="batch")
    assert [result[4]["ended_state"][:2].tolist() for result in per_env] == [[2, 2], [0, 2]]  # tag, last count
    assert [result[4]["reset"] for result in per_env] == [True, True]
    _, _, terminated, _, info = penv.step([0, 0, 0])
    assert terminated.tolist() == [False, False, False] and "ended_state" not in info


@pytest.mark.parametrize("copy", [True, False])
def test_copy_false_lends_the_result_buffers_that_the_next_step_rewrites(make_penv, backend, copy):
    penv = make_penv(counting_envs([9, 9]), asynchronous="continue", copy=copy)
    assert penv.reuses_result_buffers is not copy
    penv.reset(seed=0)
    obs, reward, *_ = penv.step([1, 2])
    first = obs.copy(), reward.copy()
    again, reward_again, *_ = penv.step([3, 4])
    assert again[:, 2].tolist() == [3, 4]
    if backend != "tensor":  # (its results reach this test as NumPy copies)
        # Lent: the first step's arrays now hold the second's results; copied: they are the caller's own.
        np.testing.assert_array_equal(obs, again if not copy else first[0])
        np.testing.assert_array_equal(reward, reward_again if not copy else first[1])
    kept = penv.step([1], id=[1])[0]  # a call on some envs always gives fresh arrays
    penv.step([2, 2])
    assert kept[0, 2] == 1


@pytest.mark.parametrize("asynchronous", ["restart", "continue"])
def test_large_observations_are_the_callers_own_and_every_later_call_writes_its_rows(make_penv, asynchronous):
    # In-process buffers hand such observations over and allocate new ones
    # rather than copy them; no row of the new ones may leak out unwritten.
    penv = make_penv([lambda tag=tag: WideCountingEnv(tag, episode_length=2) for tag in range(3)],
                     asynchronous=asynchronous)
    obs, _ = penv.reset(seed=0)
    first, *_, info = penv.step([1, 1, 1])
    kept = first.copy()
    second, *_, info = penv.step([2, 2, 2])
    np.testing.assert_array_equal(first, kept)  # the caller's own: the next step wrote elsewhere
    assert second[:, 1].tolist() == ([0, 0, 0] if asynchronous == "restart" else [2, 2, 2])
    if asynchronous == "restart":
        assert info["_ended_state"].all() and info["ended_state"][:, 2].tolist() == [2, 2, 2]
    assert [row[4:].min() == row[4:].max() == tag for tag, row in enumerate(second)] == [True] * 3
    partial, *_ = penv.step([3], id=[1])
    assert partial[0, :3].tolist() == [1, 1 if asynchronous == "restart" else 3, 3] and partial[0, 4:].max() == 1
    reset_obs, _ = penv.reset(id=[2])
    assert reset_obs[0, :3].tolist() == [2, 0, -1] and reset_obs[0, 4:].min() == 2
    third, *_ = penv.step([4, 4, 4])
    assert third[:, 0].tolist() == [0, 1, 2] and [row[4:].min() == row[4:].max() for row in third] == [True] * 3
    np.testing.assert_array_equal(first, kept)


def test_observations_the_caller_keeps_stay_as_they_were_whatever_it_calls_next(make_penv):
    # Shared buffers hand a step's observations over in spare slots and write
    # into one again only once the caller has let go of it and of its views.
    penv = make_penv([lambda tag=tag: WideCountingEnv(tag, episode_length=1000) for tag in range(3)],
                     asynchronous="continue")
    penv.reset(seed=0)
    kept, expected = [], []
    for count in range(1, 6):
        obs, *_ = penv.step([count % 5] * 3)
        assert obs[:, 1].tolist() == [count] * 3 and [row[4:].min() == row[4:].max() == tag
                                                     for tag, row in enumerate(obs)] == [True] * 3
        keep = {2: obs[1], 5: obs}.get(count)  # a view of a row, the last batch, else nothing
        if keep is not None:
            kept.append(keep)
            expected.append(keep.copy())
        del obs, keep
    penv.reset(id=[1])  # a call of some envs right after the step of every env the caller keeps
    penv.step([1, 1], id=[0, 2])
    obs, *_ = penv.step([2, 2, 2])
    assert obs[:, 1].tolist() == [7, 1, 7]
    for keep, values in zip(kept, expected, strict=True):
        np.testing.assert_array_equal(keep, values)


def test_a_step_of_every_env_taken_in_parts_hands_each_env_its_own_rows(make_penv):
    # Env 3 is slow: a recv of some takes the others' rows of a step of every
    # env while its own is still being written, and they are stepped again meanwhile.
    penv = make_penv([lambda tag=tag: WideCountingEnv(tag, episode_length=1000, delay=0.2 if tag == 3 else 0.0)
                      for tag in range(4)], asynchronous="continue")
    penv.reset(seed=0)
    counts = [0, 0, 0, 0]
    held = []
    for _ in range(3):
        penv.send([1, 1, 1, 1])
        counts = [count + 1 for count in counts]
        waiting = {0, 1, 2, 3}
        while waiting:
            obs, *_, info = penv.recv(wait_num=1)
            held.append((obs, obs.copy()))
            for row, env_id in zip(obs, info["env_id"].tolist(), strict=True):
                assert row[0] == env_id and row[1] == counts[env_id] and row[4:].min() == row[4:].max() == env_id
                waiting.discard(env_id)
            fast = sorted({0, 1, 2} - waiting)
            if waiting and fast:  # steps of some envs while env 3's step of every env is under way
                stepped, *_ = penv.step([2] * len(fast), id=fast)
                for env_id in fast:
                    counts[env_id] += 1
                assert stepped[:, 1].tolist() == [counts[env_id] for env_id in fast]
    for obs, values in held:
        np.testing.assert_array_equal(obs, values)


def test_restart_reports_the_info_of_its_reset(make_penv):
    penv = make_penv(counting_envs([1, 2]), asynchronous="restart")
    penv.reset(seed=0)
    obs, *_, info = penv.step([1, 1])
    assert info["_reset_info"].tolist() == [True, False]
    assert info["reset_info"]["_seed_draw"].tolist() == [True, False]
    assert info["reset_info"]["seed_draw"][0] == obs[0, 3]  # the new episode's first draw
    (_, _, _, _, own), _ = penv.step([2, 2], align="batch")
    assert own["reset_info"] == {"seed_draw": penv.get_env_attr("draw", id=0)[0]}


def test_idle_stops_finished_envs_only(make_penv):
    penv = make_penv(counting_envs([1, 3]), asynchronous="idle")
    penv.reset(seed=0)
    *_, terminated, _, _ = penv.step([1, 1])
    np.testing.assert_array_equal(terminated, [True, False])
    obs, reward, terminated, truncated, info = penv.step([2, 2])
    np.testing.assert_array_equal(obs[0], np.zeros(4))
    assert reward[0] == 0 and terminated[0] and not truncated[0]
    np.testing.assert_array_equal(info["idle"], [True, False])
    np.testing.assert_array_equal(info["_idle"], [True, False])
    assert obs[1, 1] == 2 and not terminated[1]
    assert penv.get_env_attr("step_calls") == [1, 2]  # None results never call the env
    assert penv.step([3, 3], align="batch")[0] == (None, None, True, False, {})
    penv.reset(id=[0])
    obs, *_ = penv.step([4, 4])
    assert obs[0, 1] == 1 and penv.get_env_attr("step_calls") == [2, 3]  # env 1 ended at its 3rd step


# Steps past the end under None on purpose: the warning it gives is tests/test_first_all_done_warning.py's.
@pytest.mark.filterwarnings("ignore::parallelenv.AllEnvsFinishedWarning")
def test_none_policy_finishes_all_when_one_finishes(make_penv):
    penv = make_penv(counting_envs([1, 5, 5]), asynchronous=None)
    penv.reset(seed=0)
    _, _, terminated, _, info = penv.step([1, 1, 1])
    np.testing.assert_array_equal(terminated, [True, False, False])
    assert "idle" not in info  # the step that finishes still returns real results
    obs, reward, terminated, truncated, info = penv.step([1, 1, 1])
    assert terminated.all() and not truncated.any() and (reward == 0).all() and (obs == 0).all()
    assert info["idle"].all()
    assert penv.step([1, 1, 1], align="batch") == [(None, None, True, False, {})] * 3
    assert penv.get_env_attr("step_calls") == [1, 1, 1]
    penv.reset()
    _, _, terminated, _, info = penv.step([1, 1, 1])
    assert "idle" not in info and terminated.tolist() == [True, False, False]


def test_continue_steps_past_the_end(make_penv):
    penv = make_penv(counting_envs([1, 2]), asynchronous="continue")
    penv.reset(seed=0)
    for _ in range(3):
        obs, _, terminated, _, info = penv.step([1, 1])
    np.testing.assert_array_equal(obs[:, 1], [3, 3])
    assert terminated.all() and "reset" not in info and "idle" not in info
    assert penv.get_env_attr("step_calls") == [3, 3]


# ------------------------------------------------------------------ attributes and methods


def test_get_and_set_env_attr(make_penv):
    penv = make_penv(counting_envs([3] * 4))
    assert penv.get_env_attr("gravity") == [9.8] * 4
    penv.set_env_attr("gravity", 1.5, id=[2, 0])
    assert penv.get_env_attr("gravity") == [1.5, 9.8, 1.5, 9.8]
    assert penv.get_env_attr("gravity", id=[3, 2]) == [9.8, 1.5]
    assert penv.get_env_attr("no_such_attribute", id=[0, 1]) == [None, None]
    assert penv.get_env_attr("spec", id=[1]) == [None]


def test_attrs_reach_through_gymnasium_wrappers(backend):
    options = build(backend).options
    with ParallelEnv.make("CartPole-v1", num_envs=2, para_mode=backend, backend_options=options) as penv:
        penv.set_env_attr("gravity", 3.0, id=[1])
        assert penv.get_env_attr("gravity") == [9.8, 3.0]


def test_customized_method(make_penv):
    penv = make_penv(counting_envs([3] * 3))
    assert penv.customized_method("double", data=[1, 2], id=[2, 0]) == [2, 4]
    assert penv.customized_method("describe") == ["env 0", "env 1", "env 2"]


# ------------------------------------------------------------------ cross-backend equality


def plain_cartpole_rollout(seeds: list[int], actions: np.ndarray) -> list[tuple]:
    """Gymnasium's own envs stepped by hand, reset in the step that ends them."""
    envs = [gym.make("CartPole-v1") for _ in seeds]
    obs = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)])
    trajectory = [(obs,)]
    for step_actions in actions:
        rows, ended = [], {}
        for i, (env, action) in enumerate(zip(envs, step_actions, strict=True)):
            o, r, te, tr, _ = env.step(action)
            if te or tr:
                ended[i] = o
                o, _ = env.reset()
            rows.append((o, r, te, tr))
        obs, rew, term, trunc = (np.array(x) for x in zip(*rows, strict=True))
        trajectory.append((obs.astype(np.float32), rew, term, trunc, ended))
    return trajectory


def test_cartpole_matches_gymnasium_bit_for_bit(make_penv):
    n, steps = 4, 120
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    expected = plain_cartpole_rollout(list(env_seeds(123, np.arange(n))), actions)
    penv = make_penv([lambda: gym.make("CartPole-v1")] * n, asynchronous="restart")
    obs, _ = penv.reset(seed=123)
    np.testing.assert_array_equal(obs, expected[0][0])
    for step_actions, (e_obs, e_rew, e_term, e_trunc, e_ended) in zip(actions, expected[1:], strict=True):
        obs, rew, term, trunc, info = penv.step(step_actions)
        np.testing.assert_array_equal(obs, e_obs)
        np.testing.assert_array_equal(rew, e_rew)
        np.testing.assert_array_equal(term, e_term)
        np.testing.assert_array_equal(trunc, e_trunc)
        assert set(np.flatnonzero(info.get("_ended_state", np.zeros(n, bool)))) == set(e_ended)
        for i, final in e_ended.items():
            np.testing.assert_array_equal(info["ended_state"][i], final)


def dict_env_rollout(make: object, n: int, steps: int) -> list:
    actions = np.random.default_rng(1).uniform(-1, 1, size=(steps, n, 2)).astype(np.float32)
    penv = make([DictObsEnv] * n, asynchronous="restart")
    record = [penv.reset(seed=11)]
    for step_actions in actions:
        record.append(penv.step(step_actions))
    penv.close()
    return record


def assert_same_nested(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            assert_same_nested(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_nested(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def test_dict_env_trajectories_equal_the_dummy_backend(make_penv):
    record = dict_env_rollout(make_penv, 3, 30)
    reference = dict_env_rollout(lambda envs, **kw: ParallelEnv(envs, para_mode="dummy", **kw), 3, 30)
    assert_same_nested(record, reference)


# ------------------------------------------------------------------ the backend README shows


