"""VecWorker: transitions and episodes with a policy, under every asynchronous policy, plain and
overlapped; replace_envs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import gymnasium as gym
import numpy as np
import pytest
from conftest import TESTS_DIR
from envs import CountingEnv, DictObsEnv, FaultyEnv, OtherSpaceEnv, counting

from parallelenv import EnvError, NoPendingCallError, ParallelEnv
from parallelenv.arrays import is_tensor, to_numpy, to_torch, tree_map
from parallelenv.calls import Arguments
from parallelenv.infos import env_info, vector_info
from parallelenv.rollout import VecWorker

# The tensor backend is left out: VecWorker over the tensor backend has its own tests at the end of this module.
pytestmark = [pytest.mark.local_backends, pytest.mark.numpy_backends]

RESETTING = ["restart", "idle", "continue"]
EVERY_POLICY = [*RESETTING, None]
# collect with every env stepping together, and with halves stepping while the policy acts for the other half.
both_modes = pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])


def counting_envs(lengths: list[int]) -> list:
    return [counting(tag, length) for tag, length in enumerate(lengths)]


def cycle_actions(obs: np.ndarray) -> np.ndarray:
    """A deterministic policy of CountingEnv's obs: the action says which step it was chosen at."""
    return ((obs[:, 0] + obs[:, 1]) % 5).astype(np.int64)


def lean_policy(obs: np.ndarray) -> np.ndarray:
    """CartPole: push the way the pole leans (episodes of a few dozen steps)."""
    return (obs[:, 2] > 0).astype(np.int64)


# ------------------------------------------------------------------ collect


@both_modes
@pytest.mark.parametrize("asynchronous", EVERY_POLICY)
def test_next_obs_of_an_ended_episode_is_its_real_last_obs(make_penv, asynchronous, overlap):
    lengths = [2, 3, 4, 5]
    worker = VecWorker(make_penv(counting_envs(lengths), asynchronous=asynchronous), cycle_actions, seed=0,
                       overlap=overlap)
    batch = worker.collect(12)
    obs, next_obs, action = batch.obs, batch.next_obs, batch.action
    ended = batch.terminated | batch.truncated
    # Every transition is one real step of its env: the count goes up by one
    # and the obs records the action taken, also where an episode ended.
    np.testing.assert_array_equal(next_obs[..., 1], obs[..., 1] + 1)
    np.testing.assert_array_equal(next_obs[..., 2], action)
    np.testing.assert_array_equal(next_obs[..., 0], np.broadcast_to(np.arange(4), (12, 4)))
    # The next step starts where the transition led, or from a fresh episode.
    np.testing.assert_array_equal(obs[1:][~ended[:-1]], next_obs[:-1][~ended[:-1]])
    assert (obs[1:, :, 1][ended[:-1]] == 0).all()
    if asynchronous is None:  # env 0 ends every second step and takes the others with it
        assert ended.all(axis=1)[1::2].all() and not ended[0::2].any()
        np.testing.assert_array_equal(batch.terminated[1::2], np.broadcast_to([True, False, False, False], (6, 4)))
    else:
        np.testing.assert_array_equal(batch.terminated, ended)
        for i, length in enumerate(lengths):
            np.testing.assert_array_equal(np.flatnonzero(ended[:, i]), np.arange(length - 1, 12, length))


def plain_loop_returns(seeds: tuple[int, ...], num_steps: int) -> list[tuple[int, int, float]]:
    """``(step, env, return)`` of the episodes CartPole envs seeded ``seeds`` end in ``num_steps`` steps,
    one env at a time."""
    ended = []
    for i, env_seed in enumerate(seeds):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=env_seed)
        total = 0.0
        for t in range(num_steps):
            obs, reward, terminated, truncated, _ = env.step(int(lean_policy(obs[None])[0]))
            total += reward
            if terminated or truncated:
                ended.append((t, i, total))
                obs, _ = env.reset()
                total = 0.0
        env.close()
    return sorted(ended)


@both_modes
@pytest.mark.parametrize("asynchronous", RESETTING)
def test_episode_returns_equal_a_plain_loop(make_penv, asynchronous, overlap):
    penv = make_penv([lambda: gym.make("CartPole-v1")] * 3, asynchronous=asynchronous)
    worker = VecWorker(penv, lean_policy, seed=7, overlap=overlap)
    first, second = worker.collect(60), worker.collect(90)  # a collect goes on where the last stopped
    expected = plain_loop_returns(worker.env_seeds, 150)
    returns = np.concatenate([first.episode_returns, second.episode_returns])
    assert len(expected) > 6
    np.testing.assert_array_equal(returns, [r for _, _, r in expected])
    np.testing.assert_array_equal(np.concatenate([first.episode_lengths, second.episode_lengths]), returns)
    rewards = np.concatenate([first.reward, second.reward])
    assert rewards.sum() == 150 * 3  # CartPole pays 1 a step


@both_modes
def test_dict_and_tuple_observations_are_the_same_under_every_resetting_policy(make_penv, overlap):
    batches = []
    for asynchronous in RESETTING:
        penv = make_penv([lambda: DictObsEnv(3), lambda: DictObsEnv(4)], asynchronous=asynchronous)
        policy = lambda obs: np.full((len(obs["position"]), 2), 0.1, np.float32)  # noqa: E731
        batches.append(VecWorker(penv, policy, seed=0, overlap=overlap).collect(9))
    assert batches[0].terminated.sum() == 5
    for other in batches[1:]:
        for field in ("obs", "next_obs"):
            tree_map(np.testing.assert_array_equal, getattr(batches[0], field), getattr(other, field))
    assert batches[0].next_obs["pair"][1].shape == (9, 2, 1)


@both_modes
def test_max_episode_length_cuts_episodes_as_truncations(make_penv, overlap):
    penv = make_penv(counting_envs([3, 100]), asynchronous="restart")
    worker = VecWorker(penv, cycle_actions, seed=0, max_episode_length=4, overlap=overlap)
    batch = worker.collect(8)
    np.testing.assert_array_equal(np.flatnonzero(batch.terminated[:, 0]), [2, 5])
    np.testing.assert_array_equal(np.flatnonzero(batch.truncated[:, 1]), [3, 7])
    assert not batch.terminated[:, 1].any()
    np.testing.assert_array_equal(batch.next_obs[[3, 7], 1, 1], [4, 4])  # the real obs of the cut step
    np.testing.assert_array_equal(batch.obs[4, 1, 1], 0)
    np.testing.assert_array_equal(batch.episode_lengths, [3, 4, 3, 4])


def test_a_progress_bar_shows_on_request(make_penv, capsys):
    worker = VecWorker(make_penv(counting_envs([3, 3]), asynchronous="restart"), cycle_actions, seed=0)
    batch = worker.collect(5, progress=True)
    assert batch.num_steps == 5
    assert "5/5" in capsys.readouterr().err


# ------------------------------------------------------------------ overlapped collection

TRANSITION_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs", "episode_returns",
                     "episode_lengths")


@pytest.mark.parametrize("asynchronous", EVERY_POLICY)
def test_overlapped_collection_gives_each_env_the_actions_and_transitions_of_plain_collection(make_penv, asynchronous):
    lengths = [2, 3, 5, 7, 4]  # halves of two and three envs; 5 and 7 are cut by max_episode_length
    batches, episodes = {}, {}
    for overlap in (False, True):
        worker = VecWorker(make_penv(counting_envs(lengths), asynchronous=asynchronous), cycle_actions, seed=3,
                           max_episode_length=4, overlap=overlap)
        batches[overlap] = [worker.collect(13), worker.collect(6)]  # the second goes on where the first stopped
        episodes[overlap] = worker.rollout()  # and the episode API where collection left the envs
    for plain, overlapped in zip(batches[False], batches[True], strict=True):
        for field in TRANSITION_FIELDS:
            np.testing.assert_array_equal(getattr(overlapped, field), getattr(plain, field), err_msg=field)
    # A CountingEnv's obs holds the action it was given and a draw from its seeded RNG, which each reset
    # advances: equal transitions mean each env got the same actions, in the same order, and the same resets.
    first = batches[True][0]
    np.testing.assert_array_equal(first.next_obs[..., 2], first.action)
    assert first.terminated.any() and first.truncated.any()
    assert episodes[True].env_ids.tolist() == episodes[False].env_ids.tolist()
    np.testing.assert_array_equal(episodes[True].observations, episodes[False].observations)


class Recorded(ParallelEnv):
    """A ParallelEnv that logs which envs each send and recv was for."""

    log: list[str]

    def send(self, actions, id=None):
        self.log.append("S" + "".join(map(str, id)))
        super().send(actions, id=id)

    def recv(self, wait_num=None, timeout=None, align="item"):
        results = super().recv(wait_num, timeout, align)
        self.log.append("R" + "".join(map(str, results[4]["env_id"].tolist())))
        return results


@pytest.mark.parametrize(
    ("asynchronous", "expected"),
    [
        # One half's policy call (P) while the other half is in flight: sent (S), not yet received (R).
        # The halves are the even and the odd envs.
        ("restart", "P02 S02 P13 S13 R02 P02 S02 R13 P13 S13 R02 P02 S02 R13 P13 S13 R02 R13"),
        # One env's end ends all: half 0 waits for half 1's results before its next step.
        (None, "P02 S02 P13 S13 R0213 P02 S02 P13 S13 R0213 P02 S02 P13 S13 R0213"),
    ],
)
def test_overlap_computes_one_halfs_actions_while_the_other_half_steps(asynchronous, expected):
    # The toy backend runs one queued call each time it is asked for replies: the order is exact.
    with Recorded(counting_envs([100] * 4), para_mode="toy", asynchronous=asynchronous) as penv:
        penv.log = []

        def policy(obs):
            penv.log.append("P" + "".join(str(int(tag)) for tag in obs[:, 0]))
            return cycle_actions(obs)

        worker = VecWorker(penv, policy, seed=0, overlap=True)
        worker.worker_init()
        batch = worker.collect(3)
    assert " ".join(penv.log) == expected
    np.testing.assert_array_equal(batch.obs[:, :, 1], np.broadcast_to(np.arange(3)[:, None], (3, 4)))


@both_modes
def test_an_env_that_raises_is_named_and_leaves_no_call_in_flight(make_penv, overlap):
    envs = [*counting_envs([100] * 3), lambda: FaultyEnv(3, at_step=3)]
    worker = VecWorker(make_penv(envs, asynchronous="restart"), cycle_actions, seed=0, overlap=overlap)
    with pytest.raises(EnvError) as caught:
        worker.collect(5)
    assert (caught.value.env_index, caught.value.method, caught.value.message) == (3, "step", "env 3 broke on purpose")
    with pytest.raises(NoPendingCallError):
        worker.penv.recv()
    worker.penv.reset(seed=0)  # the ParallelEnv takes calls again (env 3 would raise at its next step)
    assert worker.penv.step(np.zeros(3, np.int64), id=[0, 1, 2])[1].tolist() == [1, 11, 21]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_envs", [7, 8])
def test_each_half_has_about_half_of_every_workers_envs(no_leaks, num_envs):
    # A worker steps its envs one after another: a half made of whole workers
    # would take as long to step as every env, and overlap nothing.
    with Recorded(counting_envs([100] * num_envs), para_mode="subproc", num_workers=2) as penv:
        penv.log = []
        host = penv.backend.env_pids()  # the process that steps each env
        VecWorker(penv, cycle_actions, seed=0, overlap=True).collect(3)
    workers = sorted(set(host))
    assert len(workers) == 2
    sends = [[int(i) for i in entry[1:]] for entry in penv.log if entry.startswith("S")]
    assert len(sends) == 6
    for ids in sends:
        for worker in workers:
            in_half, hosted = sum(host[i] == worker for i in ids), host.count(worker)
            assert abs(2 * in_half - hosted) <= 1, (ids, host)


def test_a_bad_action_in_overlapped_collection_names_the_envs_the_policy_acted_for(make_penv):
    worker = VecWorker(make_penv(counting_envs([5] * 4)), lambda obs: np.where(obs[:, 0] == 3, 7, 0), seed=0,
                       overlap=True)
    with pytest.raises(ValueError, match=r"actions\[1\] = 7 is outside Discrete\(5\) \(policy .*, called on envs \[1, 3\]\)"):
        worker.collect(2)
    with pytest.raises(NoPendingCallError):  # the first half's step, sent before, was received
        worker.penv.recv()


def test_a_bad_action_names_the_first_few_of_many_envs(no_leaks):
    with ParallelEnv(counting_envs([5] * 20), para_mode="dummy") as penv:
        worker = VecWorker(penv, lambda obs: np.where(obs[:, 0] == 19, 7, 0), seed=0, overlap=True)
        with pytest.raises(ValueError, match=r"called on envs \[1, 3, 5, 7, 9, 11, \.\.\. \(10 envs\)\]\)$"):
            worker.collect(1)


def test_overlap_refuses_a_parallel_env_that_returns_tensors(no_leaks):
    torch = pytest.importorskip("torch")
    from parallelenv.envs import CartPole

    with ParallelEnv(CartPole(num_envs=4, device="cpu"), para_mode="tensor", asynchronous="restart") as penv:
        worker = VecWorker(penv, lambda obs: torch.ones(len(obs), dtype=torch.int64), seed=0, overlap=True)
        with pytest.raises(ValueError, match="overlap=True steps NumPy envs: this ParallelEnv returns tensors"):
            worker.collect(2)


def test_a_half_that_came_in_several_returns_is_taken_whole_and_in_order():
    # recv hands over whatever has answered: half [0, 2, 4, 6] comes in two returns mixed with envs of the
    # other half, whose envs come in two as well, the second holding a key's values in another dtype.
    from parallelenv.rollout.overlap import _Arrivals

    def returned(env_ids, infos):
        n = len(env_ids)
        obs = {"x": np.array(env_ids, dtype=np.float32)[:, None].repeat(2, axis=1)}
        return (obs, np.array(env_ids, dtype=np.float64) / 10, np.array(env_ids) % 3 == 0, np.zeros(n, bool),
                vector_info(enumerate(infos), n))

    f32 = np.float32
    arrived = _Arrivals()
    wanted = np.array([0, 2, 4, 6])
    arrived.add(np.array([4, 1, 0]), returned([4, 1, 0], [{"f": f32(4)}, {"f": f32(1)}, {}]))
    assert arrived.missing(wanted) == 2
    arrived.add(np.array([6, 2]), returned([6, 2], [{"f": f32(6), "m": "six"}, {"f": f32(2)}]))
    assert arrived.missing(wanted) == 0
    obs, reward, terminated, truncated, info = arrived.take(wanted)
    np.testing.assert_array_equal(obs["x"][:, 0], [0, 2, 4, 6])
    assert obs["x"].dtype == np.float32 and obs["x"].shape == (4, 2)
    np.testing.assert_array_equal(reward, [0.0, 0.2, 0.4, 0.6])
    np.testing.assert_array_equal(terminated, [True, False, False, True])
    assert [env_info(info, p) for p in range(4)] == [{}, {"f": 2}, {"f": 4}, {"f": 6, "m": "six"}]
    assert info["f"].dtype == np.float32  # the returns' own arrays, rows copied
    assert arrived.missing(np.array([1, 3])) == 1
    arrived.add(np.array([3]), returned([3], [{"f": 3.5}]))  # float64 where the other return has float32
    obs, *_, info = arrived.take(np.array([3, 1]))
    np.testing.assert_array_equal(obs["x"][:, 0], [3, 1])
    assert [env_info(info, p) for p in range(2)] == [{"f": 3.5}, {"f": 1.0}]  # each env's info merged again
    assert arrived.missing(np.array([1])) == 1  # taken once
    # Merged again in the half's order, as a step merges them: the first env with the key (a float here)
    # makes its array, whichever return came first.
    arrived.add(np.array([0, 2]), returned([0, 2], [{}, {"x": 1}]))
    arrived.add(np.array([1, 3]), returned([1, 3], [{"x": 0.5}, {"x": 2.5}]))
    *_, info = arrived.take(np.array([0, 1, 2, 3]))
    assert [env_info(info, p) for p in range(4)] == [{}, {"x": 0.5}, {"x": 1.0}, {"x": 2.5}]


# ------------------------------------------------------------------ episodes


@pytest.mark.parametrize("asynchronous", EVERY_POLICY)
def test_step_episode_and_collect_episode_hand_back_whole_episodes(make_penv, asynchronous):
    worker = VecWorker(make_penv(counting_envs([2, 3]), asynchronous=asynchronous), cycle_actions)
    worker.start_episode(seed=1)
    completed = [worker.step_episode() for _ in range(6)]
    batch = worker.collect_episode()
    if asynchronous is None:
        assert completed == [False, True] * 3
        np.testing.assert_array_equal(batch.env_ids, [0, 1] * 3)
        np.testing.assert_array_equal(batch.truncations[batch.starts + 1], [False, True] * 3)
    else:
        assert completed == [False, True, True, True, False, True]
        np.testing.assert_array_equal(batch.env_ids, [0, 1, 0, 0, 1])
        np.testing.assert_array_equal(batch.lengths, [2, 3, 2, 2, 3])
        assert not batch.truncations.any()
    assert len(batch.infos) == batch.lengths.sum() == len(batch.rewards)
    for k, (start, length, i) in enumerate(zip(batch.starts, batch.lengths, batch.env_ids, strict=True)):
        rows = slice(start, start + length)
        np.testing.assert_array_equal(batch.observations[rows, 1], np.arange(length))
        np.testing.assert_array_equal(batch.observations[rows, 0], i)
        assert batch.returns[k] == batch.rewards[rows].sum()
        assert batch.last_observations[k, 1] == length
        assert batch.terminations[start + length - 1] or batch.truncations[start + length - 1]
        assert [info.get("count") for info in batch.infos[rows]] == [None, 2, None][:length]
    assert len(worker.collect_episode()) == 0  # handed over once


def test_rollout_runs_one_whole_episode(make_penv):
    worker = VecWorker(make_penv(counting_envs([4, 6, 5]), asynchronous="restart"), cycle_actions)
    batch = worker.rollout()
    assert len(batch) == 1 and batch.env_ids.tolist() == [0] and batch.lengths.tolist() == [4]
    batch = worker.rollout()  # a new episode everywhere: env 0 ends first again
    assert batch.env_ids.tolist() == [0]


# ------------------------------------------------------------------ updates


@pytest.mark.every_backend
def test_replace_envs_replaces_exactly_the_envs_named(make_penv):
    penv = make_penv(counting_envs([3, 3, 3, 3]))
    penv.reset(seed=0)
    penv.replace_envs([counting(11, 3), lambda: CountingEnv(13, 3)], id=[1, 3])
    obs, _ = penv.reset(seed=0)
    np.testing.assert_array_equal(obs[:, 0], [0, 11, 2, 13])
    assert penv.get_env_attr("tag") == [0, 11, 2, 13]


def describe_env(env: gym.Env, prefix: str = "env") -> str:
    return f"{prefix} {env.unwrapped.tag} at step {env.unwrapped.count}"


def test_customized_method_runs_a_function_where_each_env_lives(make_penv):
    penv = make_penv(counting_envs([3, 3, 3]))
    penv.reset(seed=0)
    assert penv.customized_method(describe_env, id=[2, 0]) == ["env 2 at step 0", "env 0 at step 0"]
    assert penv.customized_method(describe_env, data=["a", "b"], id=[0, 1]) == ["a 0 at step 0", "b 1 at step 0"]
    with pytest.raises(EnvError, match=r"env 1 raised TypeError in describe_env\(\)"):
        penv.customized_method(describe_env, data=[Arguments(("a", "b"))], id=[1])
    with pytest.raises(TypeError, match="non-empty str"):
        penv.customized_method(3)


@both_modes
def test_update_env_replaces_and_sets_attributes_of_the_envs_named(make_penv, overlap):
    worker = VecWorker(make_penv(counting_envs([5, 5, 5, 5])), cycle_actions, seed=0, overlap=overlap)
    worker.collect(2)
    worker.update_env({3: counting(13, 5), 1: counting(11, 5), 2: {"gravity": 1.5}})
    assert worker.penv.get_env_attr("tag") == [0, 11, 2, 13]
    assert worker.penv.get_env_attr("gravity") == [9.8, 9.8, 1.5, 9.8]
    batch = worker.collect(1)
    np.testing.assert_array_equal(batch.obs[0, :, 1], [2, 0, 2, 0])  # replaced envs begin a new episode
    np.testing.assert_array_equal(batch.next_obs[0, :, 0], [0, 11, 2, 13])


def test_update_env_refuses_bad_updates_before_changing_anything(make_penv):
    worker = VecWorker(make_penv(counting_envs([5, 5])), cycle_actions, seed=0)
    with pytest.raises(ValueError, match="id 2 is out of range for 2 envs"):
        worker.update_env({2: counting(5)})
    with pytest.raises(TypeError, match="id\\[0\\] = '1' is not an int"):
        worker.update_env({"1": counting(5)})
    with pytest.raises(TypeError, match="the update of env 1 is a int"):
        worker.update_env({0: {"gravity": 1.0}, 1: 3})
    assert worker.penv.get_env_attr("gravity") == [9.8, 9.8]
    with pytest.raises(TypeError, match="updates must be a mapping"):
        worker.update_env([counting(5)])
    with pytest.raises(EnvError) as caught:
        worker.update_env({1: OtherSpaceEnv})
    assert caught.value.env_index == 1 and "action_space Discrete(3)" in caught.value.message
    assert worker.penv.get_env_attr("tag") == [0, 1]
    assert worker.collect(1).num_steps == 1  # still usable


def test_an_unpicklable_new_env_is_named_before_anything_is_sent(no_leaks):
    locked = CountingEnv(7)
    locked.lock = threading.Lock()
    with ParallelEnv(counting_envs([5, 5]), para_mode="subproc", num_workers=1) as penv:
        with pytest.raises(TypeError, match="the sources entry .* of env 1 cannot be sent"):
            penv.replace_envs([locked], id=[1])
        penv.reset(seed=0)
        assert penv.get_env_attr("tag") == [0, 1]


def test_update_agent_takes_a_callable_or_parameters(make_penv):
    worker = VecWorker(make_penv(counting_envs([50])), lambda obs: np.zeros(1, np.int64), seed=0)
    assert worker.collect(1).action.tolist() == [[0]]
    worker.update_agent(lambda obs: np.full(1, 3))
    assert worker.collect(1).action.tolist() == [[3]]

    class Tabular:
        def __init__(self) -> None:
            self.action = 1

        def __call__(self, obs: np.ndarray) -> np.ndarray:
            return np.full(len(obs), self.action)

        def set_param_values(self, action: int) -> None:
            self.action = action

    worker.update_agent(Tabular())
    worker.update_agent(4)
    assert worker.collect(1).action.tolist() == [[4]]
    worker.update_agent(lambda obs: np.ones(1, np.int64))
    with pytest.raises(TypeError, match="cannot update a function policy with a int"):
        worker.update_agent(4)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("policy", "error", "message"),
    [
        (lambda obs: np.zeros(3, np.int64), ValueError, r"the policy's actions has shape \(3,\); expected \(2,\)"),
        (lambda obs: np.array([0, 7]), ValueError, r"the policy's actions\[1\] = 7 is outside Discrete\(5\)"),
        (lambda obs: np.array([0.5, 1.0]), TypeError, "the policy's actions of dtype float64 cannot be cast"),
        # One value where a batch is due is a TypeError, as Gymnasium's vector envs raise.
        (lambda obs: None, TypeError, r"the policy's actions is the single value None; expected a batch"),
    ],
)
def test_bad_policy_outputs_are_named(make_penv, policy, error, message):
    worker = VecWorker(make_penv(counting_envs([5, 5])), policy, seed=0)
    with pytest.raises(error, match=message):
        worker.collect(1)


def test_bad_worker_arguments_are_refused(no_leaks):
    with ParallelEnv(counting_envs([5]), para_mode="dummy") as penv:
        with pytest.raises(TypeError, match="policy must be callable"):
            VecWorker(penv, "random")
        with pytest.raises(TypeError, match="penv must be a ParallelEnv"):
            VecWorker(gym.make("CartPole-v1"), lean_policy)
        with pytest.raises(ValueError, match="max_episode_length=0"):
            VecWorker(penv, cycle_actions, max_episode_length=0)
        with pytest.raises(ValueError, match="output='jax'"):
            VecWorker(penv, cycle_actions, output="jax")
        with pytest.raises(ValueError, match="num_steps=0"):
            VecWorker(penv, cycle_actions).collect(0)
        with pytest.raises(ValueError, match="overlap=True steps two halves of the envs in turn; .* has 1 env"):
            VecWorker(penv, cycle_actions, overlap=True)
        with pytest.raises(TypeError, match="overlap must be True or False, not 'yes'"):
            VecWorker(penv, cycle_actions, overlap="yes")


# ------------------------------------------------------------------ torch


def test_a_torch_policy_drives_numpy_envs_and_results_come_as_tensors(make_penv):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

        def forward(self, obs):
            assert torch.is_tensor(obs) and obs.dtype == torch.float32
            return self.net(obs).argmax(dim=1)

    policy = Greedy()
    penv = make_penv([lambda: gym.make("CartPole-v1")] * 2, asynchronous="restart")
    worker = VecWorker(penv, policy, output="torch", device="cpu", seed=0)
    batch = worker.collect(30)
    assert torch.is_tensor(batch.obs) and batch.obs.shape == (30, 2, 4) and batch.obs.device.type == "cpu"
    assert torch.is_tensor(batch.reward) and batch.terminated.dtype == torch.bool
    assert not batch.obs.requires_grad  # collection builds no graph
    episode = worker.rollout()
    # One episode, or several that ended in the same step: their steps are concatenated.
    assert torch.is_tensor(episode.observations) and episode.observations.shape == (int(episode.lengths.sum()), 4)
    other = Greedy()
    worker.update_agent(other.state_dict())
    assert worker.policy is policy
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), other.parameters(), strict=True))


def test_overlapped_torch_results_are_plain_collections_in_env_order(make_penv):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    batches = {}
    for overlap in (False, True):
        penv = make_penv([lambda: gym.make("CartPole-v1")] * 5, asynchronous="restart")
        worker = VecWorker(penv, lambda obs: policy(obs).argmax(dim=1), output="torch", device="cpu", seed=0,
                           overlap=overlap)
        batches[overlap] = [worker.collect(25), worker.collect(5)]
    for plain, overlapped in zip(batches[False], batches[True], strict=True):
        for field in TRANSITION_FIELDS:
            expected, got = getattr(plain, field), getattr(overlapped, field)
            assert torch.is_tensor(got) == torch.is_tensor(expected), field
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=field)


def test_numpy_results_from_a_policy_that_returns_tensors(make_penv):
    torch = pytest.importorskip("torch")
    worker = VecWorker(make_penv(counting_envs([3, 3])), lambda obs: torch.ones(len(obs), dtype=torch.int64), seed=0)
    batch = worker.collect(2)
    assert isinstance(batch.action, np.ndarray) and batch.action.tolist() == [[1, 1], [1, 1]]


def test_rollout_with_numpy_imports_neither_torch_nor_ray():
    code = (
        "import sys, numpy as np\n"
        "import parallelenv, parallelenv.rollout, parallelenv.integrations.gymnasium\n"
        "from parallelenv import ParallelEnv\n"
        "from parallelenv.rollout import VecWorker\n"
        "with VecWorker(ParallelEnv.make('CartPole-v1', 2, 'dummy', asynchronous='restart'), lambda o: np.zeros(2, np.int64)) as w:\n"
        "    w.collect(3); w.rollout()\n"
        "    ParallelEnv.make('CartPole-v1', 2, 'dummy', asynchronous='restart').as_gymnasium().close()\n"
        "bad = [m for m in ('torch', 'ray', 'stable_baselines3') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=TESTS_DIR.parent, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def guide_block(after: str) -> str:
    """The first code block of the rollouts guide page after the line that starts with ``after``."""
    lines = (TESTS_DIR.parent / "docs" / "guide" / "rollouts.rst").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    start = next(i for i in range(start, len(lines)) if lines[i].startswith(".. code-block::")) + 1
    block = []
    for line in lines[start:]:
        if line and not line.startswith("   "):
            break
        block.append(line[3:])
    return textwrap.dedent("\n".join(block))


@pytest.mark.slow
def test_the_guides_training_loop_runs(tmp_path, no_leaks):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(guide_block("A complete training loop"))
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR.parent)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mean return" in done.stdout


class TorchResults(ParallelEnv):
    """A ParallelEnv whose results are tensors, as the tensor backend's are: the worker's other path."""

    def reset(self, *args, **kwargs):
        obs, info = super().reset(*args, **kwargs)
        return to_torch(obs, "cpu"), info

    def step(self, actions, *args, **kwargs):
        assert is_tensor(actions), "a tensor ParallelEnv is handed tensors"
        obs, reward, terminated, truncated, info = super().step(to_numpy(actions), *args, **kwargs)
        info = {key: to_torch(value, "cpu") if key.endswith("ended_state") else value for key, value in info.items()}
        return to_torch((obs, reward, terminated, truncated), "cpu") + (info,)


@pytest.mark.parametrize("asynchronous", ["restart", "idle"])
def test_tensor_results_stay_tensors_end_to_end(no_leaks, asynchronous):
    torch = pytest.importorskip("torch")
    seen = []

    def policy(obs):
        seen.append(type(obs))
        return (obs[:, 0] + obs[:, 1]).long() % 5

    with TorchResults(counting_envs([2, 3]), para_mode="dummy", asynchronous=asynchronous) as penv:
        worker = VecWorker(penv, policy, seed=0)
        batch = worker.collect(6)
        assert set(seen) == {torch.Tensor}
        assert all(torch.is_tensor(x) for x in (batch.obs, batch.action, batch.reward, batch.next_obs))
        torch.testing.assert_close(batch.next_obs[..., 1], batch.obs[..., 1] + 1)
        np.testing.assert_array_equal(batch.episode_lengths, [2, 3, 2, 2, 3])
        episodes = worker.rollout()
        assert torch.is_tensor(episodes.observations) and episodes.lengths.tolist() == [2]
        numpy_worker = VecWorker(penv, cycle_actions, output="numpy", seed=0)
        assert isinstance(numpy_worker.collect(2).obs, np.ndarray)


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA device")
def test_results_on_a_cuda_device(make_penv):
    import torch

    net = torch.nn.Linear(4, 2).to("cuda")
    worker = VecWorker(make_penv([lambda: gym.make("CartPole-v1")] * 2), lambda obs: net(obs).argmax(dim=1),
                       output="torch", device="cuda", seed=0)
    batch = worker.collect(20)
    assert all(x.device.type == "cuda" for x in (batch.obs, batch.action, batch.reward, batch.next_obs))
    assert worker.rollout().observations.device.type == "cuda"


@pytest.mark.parametrize("asynchronous", ["restart", "idle", None])
@pytest.mark.parametrize("copy", [False, True])
def test_a_tensor_backend_collects_on_its_device_whether_or_not_it_reuses_buffers(copy, asynchronous):
    torch = pytest.importorskip("torch")
    from parallelenv.envs import CartPole

    always_right = lambda obs: torch.ones(len(obs), dtype=torch.int64)  # noqa: E731  (episodes end within ~10 steps)
    with ParallelEnv(CartPole(num_envs=4, device="cpu"), para_mode="tensor", asynchronous=asynchronous,
                     copy=copy) as penv:
        assert penv.reuses_result_buffers is not copy
        batch = VecWorker(penv, always_right, seed=0).collect(40)
    assert torch.is_tensor(batch.obs) and batch.obs.shape == (40, 4, 4)
    ended = batch.terminated | batch.truncated
    assert ended.any() and not ended.all()
    # Each step's obs is its own: the obs after a step is the next step's obs, unless the episode ended.
    follows = (batch.obs[1:] == batch.next_obs[:-1]).all(-1)
    assert follows[~ended[:-1]].all() and not follows[ended[:-1]].any()
    # An ended episode's next_obs is its real last obs: past CartPole's angle limit.
    assert (batch.next_obs[..., 2].abs() > 0.2095)[batch.terminated].all()
    assert (batch.next_obs[..., 2].abs() <= 0.2095)[~batch.terminated].all()


@both_modes
@pytest.mark.timeout(60)
def test_an_episode_cut_by_a_rebuilt_worker_ends_truncated_where_it_was(no_leaks, overlap):
    import functools

    factories = [functools.partial(FaultyEnv, tag=i, at_step=3 if i == 1 else 10**9, how="exit") for i in range(4)]
    penv = ParallelEnv(factories, para_mode="subproc", num_workers=2, asynchronous="restart",
                       on_worker_failure="restart")
    with VecWorker(penv, cycle_actions, seed=0, overlap=overlap) as worker:
        batch = worker.collect(5)
    obs, next_obs = batch.obs[..., 1], batch.next_obs[..., 1]  # the step counts
    # The worker of envs 0 and 1 died in env 1's third step. Overlapped, env 0 (in the other half) had
    # finished that step and its fourth was under way. Each episode ends at its step the death cut,
    # truncated, its last transition leading nowhere new (never to the next episode's first obs), with
    # no reward; the next episode starts from the rebuilt env's first obs, with nothing reset twice.
    cut_at = {0: 3 if overlap else 2, 1: 2}
    for env, step in cut_at.items():
        assert batch.truncated[:, env].tolist() == [t == step for t in range(5)], env
        assert next_obs[step, env] == obs[step, env] and batch.reward[step, env] == 0, env
        assert (obs[step + 1, env], next_obs[step + 1, env]) == (0, 1), env
    np.testing.assert_array_equal(obs[:, 2:], np.broadcast_to(np.arange(5)[:, None], (5, 2)))  # untouched
    assert not batch.truncated[:, 2:].any()
    assert len(penv.failures) == 1


# ------------------------------------------------------------------ n episodes


@pytest.mark.parametrize("asynchronous", EVERY_POLICY)
def test_collect_episodes_hands_back_exactly_n_whole_episodes_in_the_order_they_completed(make_penv, asynchronous):
    worker = VecWorker(make_penv(counting_envs([2, 3]), asynchronous=asynchronous), cycle_actions, seed=0)
    batch = worker.collect_episodes(4)
    assert len(batch) == 4
    if asynchronous is None:  # env 0's end ends env 1's episode too, truncated
        assert batch.env_ids.tolist() == [0, 1, 0, 1] and batch.lengths.tolist() == [2] * 4
    else:
        assert batch.env_ids.tolist() == [0, 1, 0, 0] and batch.lengths.tolist() == [2, 3, 2, 2]
    for start, length, i in zip(batch.starts, batch.lengths, batch.env_ids, strict=True):
        np.testing.assert_array_equal(batch.observations[start : start + length, 1], np.arange(length))
        assert (batch.observations[start : start + length, 0] == i).all()
    again = worker.collect_episodes(1)  # a new episode in every env, as rollout() starts
    assert again.env_ids.tolist() == [0] and again.lengths.tolist() == [2]


def test_collect_episodes_seeds_the_envs_as_the_rest_of_the_worker_does(make_penv):
    batches = []
    for _ in range(2):
        penv = make_penv(counting_envs([2, 3]), asynchronous="restart")
        worker = VecWorker(penv, cycle_actions, seed=7, worker_number=3)
        batches.append(worker.collect_episodes(3))
        seeded, _ = penv.reset(seed=list(worker.env_seeds))
        first = batches[-1].observations[batches[-1].starts[:2]]  # env 0's first episode, then env 1's
        np.testing.assert_array_equal(first[:, 3], seeded[:, 3])  # the first reset drew from the worker's seeds
    np.testing.assert_array_equal(batches[0].observations, batches[1].observations)


def test_collect_episodes_refuses_a_count_that_is_not_positive(make_penv):
    worker = VecWorker(make_penv(counting_envs([2])), cycle_actions)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"num_episodes=.*; use a positive int"):
            worker.collect_episodes(bad)


def test_collect_episode_with_no_episode_recorded_says_why(make_penv):
    worker = VecWorker(make_penv(counting_envs([2, 3]), asynchronous="restart"), cycle_actions, seed=0)
    with pytest.raises(RuntimeError, match=r"none is recorded since the worker was made\. Run collect_episodes"):
        worker.collect_episode()
    worker.collect(4)
    with pytest.raises(RuntimeError, match=r"since collect\(\), which records transitions"):
        worker.collect_episode()
    assert len(worker.collect_episodes(2)) == 2  # it starts episodes of its own


def test_after_collect_step_episode_is_true_only_for_an_episode_collect_episode_hands_over(make_penv):
    worker = VecWorker(make_penv(counting_envs([3]), asynchronous="restart"), cycle_actions, seed=0)
    worker.collect(2)  # one step into the episode that ends at the next step: it began before recording
    assert [worker.step_episode() for _ in range(4)] == [False, False, False, True]
    batch = worker.collect_episode()
    assert batch.lengths.tolist() == [3]
    assert len(worker.collect_episode()) == 0  # recording: none completed since, an empty batch


@pytest.mark.timeout(60)
def test_an_episode_cut_short_by_a_rebuilt_env_is_not_counted(no_leaks, tmp_path):
    marker = tmp_path / "died-once"

    def env(tag: int) -> gym.Env:  # env 1 dies in its third step, its rebuilt self never
        dies = tag == 1 and not marker.exists()
        marker.touch() if dies else None
        return FaultyEnv(tag, at_step=3 if dies else 10**9, how="exit", episode_length=5)

    factories = [lambda tag=tag: env(tag) for tag in range(4)]
    penv = ParallelEnv(factories, para_mode="subproc", num_workers=2, asynchronous="restart",
                       on_worker_failure="restart")
    with VecWorker(penv, cycle_actions, seed=0) as worker:
        batch = worker.collect_episodes(8)
    assert len(penv.failures) == 1
    assert batch.lengths.tolist() == [5] * 8 and not batch.truncations.any()
    # Envs 0 and 1 shared the worker that died: their first episodes were cut short and are not in the batch.
    assert batch.env_ids.tolist() == [2, 3, 0, 1, 2, 3, 0, 1]
