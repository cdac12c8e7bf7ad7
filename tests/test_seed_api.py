"""The seed API document's contract: customized_method's keyword dictionaries, its defaults, garage's worker seeds."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from envs import CountingEnv, counting

from parallelenv import EnvError, ParallelEnv
from parallelenv.rollout import VecWorker


def counting_envs(n: int) -> list:
    return [counting(tag) for tag in range(n)]


def labelled(env: Any, ids: Any = None, *, label: Any) -> Any:
    """A function run as an env method: ``label tag`` per env (the tensor backend passes ``ids`` and a list)."""
    if ids is None:
        return f"{label} {env.tag}"
    return [f"{one} {tag}" for one, tag in zip(label, env.tag[ids].tolist(), strict=True)]


# ------------------------------------------------------------------ customized_method's data


def test_each_dict_is_that_envs_keyword_arguments(make_penv):
    penv = make_penv(counting_envs(4))
    # The keywords are matched by name, whatever their order in the dict.
    assert penv.customized_method("echo", data=[{"x": 1, "y": 2}, {"y": 4, "x": 3}], id=[3, 1]) == [
        (3, 1, 2),
        (1, 3, 4),
    ]
    # The example: env3.echo(x=10), env1.echo(x=20); y keeps its default.
    assert penv.customized_method("echo", data=[{"x": 10}, {"x": 20}], id=[3, 1]) == [(3, 10, None), (1, 20, None)]
    assert penv.customized_method("echo", data=[{"x": "a", "y": "b"}] * 4) == [(i, "a", "b") for i in range(4)]


def test_any_other_entry_is_the_single_positional_argument(make_penv):
    penv = make_penv(counting_envs(3))
    assert penv.customized_method("echo", data=[5, "a"], id=[0, 2]) == [(0, 5, None), (2, "a", None)]
    # A list or tuple is one argument too, not unpacked.
    assert penv.customized_method("echo", data=[[1, 2], (3, 4)], id=[1, 0]) == [(1, [1, 2], None), (0, (3, 4), None)]
    assert penv.customized_method("double", data=[1, 2], id=[2, 0]) == [2, 4]


def test_a_function_gets_the_keywords_too(make_penv):
    penv = make_penv(counting_envs(3))
    assert penv.customized_method(labelled, data=[{"label": "a"}, {"label": "b"}], id=[2, 0]) == ["a 2", "b 0"]


def test_a_keyword_the_method_does_not_take_is_the_envs_error(make_penv):
    penv = make_penv(counting_envs(3))
    with pytest.raises(EnvError) as caught:
        penv.customized_method("echo", data=[{"x": 1, "z": 3}], id=[2])
    assert (caught.value.env_index, caught.value.method, caught.value.exc_type) == (2, "echo", "TypeError")
    assert "'z'" in caught.value.message
    assert penv.customized_method("echo", data=[{"x": 1}], id=[2]) == [(2, 1, None)]  # still usable


def test_entries_of_different_kinds(make_penv, backend):
    """Each CPU env runs its own entry, so entries may differ; a batched env runs one call for all of them."""
    penv = make_penv(counting_envs(3))
    mixed, uneven = [{"x": 1}, 2], [{"x": 1}, {"x": 2, "y": 3}]
    if backend == "tensor":
        with pytest.raises(TypeError, match=r"data\[1\] is a int, but data\[0\] a dict of keyword arguments"):
            penv.customized_method("echo", data=mixed, id=[0, 1])
        with pytest.raises(ValueError, match=r"data\[1\] has the keywords \['x', 'y'\], but data\[0\] has \['x'\]"):
            penv.customized_method("echo", data=uneven, id=[0, 1])
    else:
        assert penv.customized_method("echo", data=mixed, id=[0, 1]) == [(0, 1, None), (1, 2, None)]
        assert penv.customized_method("echo", data=uneven, id=[0, 1]) == [(0, 1, None), (1, 2, 3)]


def test_the_tensor_backend_batches_each_keyword_over_the_envs(no_leaks):
    pytest.importorskip("torch")
    from tensor_envs import CountingTwin

    def received(env: Any, ids: Any, *args: Any, **keywords: Any) -> list[Any]:
        return [(ids.tolist(), args, keywords)] * len(ids)

    with ParallelEnv(CountingTwin([CountingEnv(tag) for tag in range(4)]), para_mode="tensor") as penv:
        values = penv.customized_method(received, data=[{"x": 1, "y": "a"}, {"y": "b", "x": 3}], id=[3, 1])
        assert values == [([3, 1], (), {"x": [1, 3], "y": ["a", "b"]})] * 2
        assert penv.customized_method(received, data=[5, 6], id=[0, 2]) == [([0, 2], ([5, 6],), {})] * 2
        assert penv.customized_method(received, data=[{}, {}], id=[0, 2]) == [([0, 2], (), {})] * 2


# ------------------------------------------------------------------ defaults


# Steps past the end under None on purpose: the warning it gives is tests/test_first_all_done_warning.py's.
@pytest.mark.filterwarnings("ignore::parallelenv.AllEnvsFinishedWarning")
def test_a_parallel_env_with_no_other_argument_is_dummy_with_policy_none(no_leaks):
    with ParallelEnv([counting(0, 2), counting(1, 5)]) as penv:
        assert (penv.para_mode, penv.asynchronous) == ("dummy", None)
        assert type(penv.backend).__name__ == "DummyBackend"
        penv.reset(seed=0)
        penv.step([1, 1])
        _, _, terminated, _, _ = penv.step([1, 1])
        assert terminated.tolist() == [True, False]  # env 0 ends, and with policy None that finishes both
        _, reward, terminated, _, info = penv.step([1, 1])
        assert terminated.tolist() == [True, True] and reward.tolist() == [0, 0]
        assert info["idle"].tolist() == [True, True]
    with ParallelEnv.make("CartPole-v1", 2) as penv:
        assert (penv.para_mode, penv.asynchronous) == ("dummy", None)


def test_the_signatures_state_the_seed_documents_defaults():
    expected = {"para_mode": "dummy", "asynchronous": None, "num_cpus": None, "num_gpus": 0, "no_warning": True}
    for function in (ParallelEnv.__init__, ParallelEnv.make):
        parameters = inspect.signature(function).parameters
        assert {name: parameters[name].default for name in expected} == expected, function


def test_the_tensor_backend_has_the_same_default_policy(no_leaks):
    pytest.importorskip("torch")
    from parallelenv.envs import CartPole

    with ParallelEnv(CartPole(num_envs=2, device="cpu"), para_mode="tensor") as penv:
        assert penv.asynchronous is None
    with ParallelEnv.make("CartPole-v1", 2, "tensor", device="cpu") as penv:
        assert penv.asynchronous is None


# ------------------------------------------------------------------ VecWorker's worker_number


def stay(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), dtype=np.int64)


def four_workers(para_mode: str, seed: int, envs_each: int = 8) -> tuple[list[int], list[float]]:
    """The env seeds of four workers of one base seed, and the random draws of their envs' first reset."""
    seeds: list[int] = []
    draws: list[float] = []
    for number in range(4):
        penv = ParallelEnv(counting_envs(envs_each), para_mode=para_mode, asynchronous="restart")
        with VecWorker(penv, stay, seed=seed, worker_number=number) as worker:
            seeds.extend(worker.env_seeds)
            draws.extend(worker.collect(1).obs[0, :, 3].tolist())  # the first collect starts the envs
    return seeds, draws


@pytest.mark.parametrize("para_mode", ["dummy", "subproc"])
def test_workers_of_one_seed_never_share_an_env_seed(no_leaks, para_mode):
    seeds, draws = four_workers(para_mode, seed=2024)
    assert len(seeds) == 32 and len(set(seeds)) == 32
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    # Each env was reset with its seed: its first draw is that seed's first number.
    assert draws == [np.random.default_rng(s).random() for s in seeds]
    assert four_workers(para_mode, seed=2024) == (seeds, draws)  # a second run: the same 32


def test_worker_seeds_are_derived_not_offset(no_leaks):
    def env_seeds(seed: Any, worker_number: int, num_envs: int = 8) -> tuple[Any, ...]:
        with ParallelEnv(counting_envs(num_envs)) as penv:
            return VecWorker(penv, stay, seed=seed, worker_number=worker_number).env_seeds

    # seed + worker_number or seed + i would make these overlap.
    assert not set(env_seeds(7, 1)) & set(env_seeds(8, 0))
    assert not set(env_seeds(7, 0)[1:]) & set(env_seeds(8, 0))
    expected = tuple(
        int(np.random.SeedSequence(7, spawn_key=(3, i)).generate_state(1, np.uint64)[0]) for i in range(8)
    )
    assert env_seeds(7, 3) == expected
    assert env_seeds(None, 3) == (None,) * 8
    assert env_seeds([5, None, 6], 3, num_envs=3) == (5, None, 6)  # a list is used as given


def test_worker_init_restarts_every_env_from_its_seed(no_leaks):
    with ParallelEnv(counting_envs(3), asynchronous="restart") as penv:
        worker = VecWorker(penv, stay, seed=1, worker_number=2)
        worker.worker_init()
        first = penv.get_env_attr("draw")
        worker.collect(5)
        worker.worker_init()
        assert penv.get_env_attr("draw") == first == [np.random.default_rng(s).random() for s in worker.env_seeds]
        worker.start_episode(seed=1)  # a base seed for start_episode is derived the same way
        assert penv.get_env_attr("draw") == first


def test_a_first_rollout_starts_the_envs_from_their_seeds(no_leaks):
    with ParallelEnv(counting_envs(3)) as penv:  # policy None: the three episodes end together
        worker = VecWorker(penv, stay, seed=1, worker_number=2)
        episodes = worker.rollout()
        first_draws = episodes.observations[episodes.starts, 3].tolist()
        assert first_draws == [np.random.default_rng(worker.env_seeds[i]).random() for i in episodes.env_ids]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"worker_number": -1}, ValueError, "worker_number=-1"),
        ({"worker_number": 1.5}, ValueError, "worker_number=1.5"),
        ({"worker_number": True}, ValueError, "worker_number=True"),
        ({"seed": -3}, ValueError, "seed must be non-negative"),
        ({"seed": [1, 2]}, ValueError, "seed has 2 entries for 3 envs"),
    ],
)
def test_bad_seeds_and_worker_numbers_are_refused(no_leaks, kwargs, error, match):
    with ParallelEnv(counting_envs(3)) as penv:
        with pytest.raises(error, match=match):
            VecWorker(penv, stay, **kwargs)
