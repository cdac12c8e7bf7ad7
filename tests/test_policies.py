"""The policy objects: what each answers, and that nothing else reads the ``asynchronous`` string."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from parallelenv import POLICIES, ParallelEnv
from parallelenv.policies import AllFinish, Continue, Idle, Policy, Restart, resolve_policy

PACKAGE = Path(__file__).resolve().parent.parent / "parallelenv"

# name: (class, restarts_finished_envs, tracks_finished, ends_all, autoreset mode or None: refused)
ANSWERS = {
    None: (AllFinish, False, True, True, None),
    "idle": (Idle, False, True, False, AutoresetMode.NEXT_STEP),
    "restart": (Restart, True, False, False, AutoresetMode.SAME_STEP),
    "continue": (Continue, False, False, False, AutoresetMode.NEXT_STEP),
}


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def test_every_policy_is_answered_for() -> None:
    assert set(POLICIES) == set(ANSWERS)


@pytest.mark.parametrize("name", list(ANSWERS))
def test_resolve_policy_gives_the_singleton(name: str | None) -> None:
    policy = resolve_policy(name)
    assert policy is POLICIES[name]
    assert type(policy) is ANSWERS[name][0]
    assert isinstance(policy, Policy)
    assert policy.name == name


@pytest.mark.parametrize("bad", ["Idle", "reset", "", 0, ["idle"]])
def test_resolve_policy_names_the_valid_ones(bad: object) -> None:
    with pytest.raises(ValueError, match=r"is not a policy; use one of None, 'idle', 'restart', 'continue'"):
        resolve_policy(bad)  # type: ignore[arg-type]  # a wrong type on purpose


@pytest.mark.parametrize("name", list(ANSWERS))
def test_flags(name: str | None) -> None:
    policy = POLICIES[name]
    _, restarts, tracks, ends_all, _ = ANSWERS[name]
    assert (policy.restarts_finished_envs, policy.tracks_finished, policy.ends_all) == (restarts, tracks, ends_all)


@pytest.mark.parametrize("name", [name for name, answer in ANSWERS.items() if answer[4] is not None])
def test_autoreset_mode(name: str) -> None:
    assert POLICIES[name].autoreset_mode() is ANSWERS[name][4]


def test_one_finishing_all_has_no_autoreset_mode() -> None:
    with pytest.raises(ValueError, match=r"asynchronous=None has no Gymnasium autoreset mode.*'restart' \(SAME_STEP\)"):
        POLICIES[None].autoreset_mode()


@pytest.mark.parametrize("dumps, loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)])
@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_pickled_policy_is_the_same_object(name: str | None, dumps, loads) -> None:
    # BackendConfig carries the policy to worker processes and Ray actors.
    assert loads(dumps(POLICIES[name])) is POLICIES[name]


# ------------------------------------------------------------------ the finished mask


def test_live_is_the_unfinished_envs_among_ids() -> None:
    finished = np.array([False, True, False, True])
    ids = np.array([3, 0, 1])
    for policy in POLICIES.values():
        np.testing.assert_array_equal(policy.live(finished, ids), [False, True, False])


@pytest.mark.parametrize("name", ["restart", "continue"])
def test_untracking_policies_leave_the_mask_alone(name: str) -> None:
    finished = np.zeros(4, dtype=bool)
    POLICIES[name].after_step(finished, np.array([0, 2]), np.array([True, True]))
    assert not finished.any()


def test_idle_finishes_only_the_envs_that_ended() -> None:
    finished = np.array([False, False, False, True])
    POLICIES["idle"].after_step(finished, np.array([2, 0, 1]), np.array([True, False, False]))
    np.testing.assert_array_equal(finished, [False, False, True, True])
    POLICIES["idle"].after_step(finished, np.array([0]), np.array([False]))
    np.testing.assert_array_equal(finished, [False, False, True, True])


def test_one_env_finishing_finishes_all() -> None:
    finished = np.zeros(4, dtype=bool)
    POLICIES[None].after_step(finished, np.array([1, 2]), np.array([False, False]))
    assert not finished.any()
    POLICIES[None].after_step(finished, np.array([1, 2]), np.array([False, True]))
    assert finished.all()


# ------------------------------------------------------------------ who asks


@pytest.mark.parametrize("name", list(ANSWERS))
def test_parallel_env_policy_is_the_resolved_object(name: str | None) -> None:
    with ParallelEnv([cartpole] * 2, para_mode="dummy", asynchronous=name) as penv:
        assert penv.policy is POLICIES[name]
        assert penv.asynchronous == name  # the user's string, for repr


def test_parallel_env_policy_is_read_only() -> None:
    with ParallelEnv([cartpole], para_mode="dummy", asynchronous="idle") as penv, pytest.raises(AttributeError):
        penv.policy = POLICIES["restart"]  # type: ignore[misc]  # read-only on purpose


def test_tensor_parallel_env_policy_is_the_resolved_object() -> None:
    pytest.importorskip("torch")
    from parallelenv.envs import CartPole

    with ParallelEnv(CartPole(2, device="cpu"), para_mode="tensor", asynchronous="restart") as penv:
        assert penv.policy is POLICIES["restart"]


def test_unknown_policy_is_refused_before_a_backend_starts() -> None:
    with pytest.raises(ValueError, match="asynchronous='sometimes' is not a policy"):
        ParallelEnv([cartpole], para_mode="subproc", asynchronous="sometimes")


# A test of the policy's name outside policies.py: ``asynchronous == ...``,
# ``.asynchronous is None``, ``x in ("idle", "continue")``, ``== "restart"``.
STRING_TEST = re.compile(
    r"asynchronous\s*(==|!=|is\s+(not\s+)?None\b|(not\s+)?in\s+[\w(\[{])"
    r"|(==|!=)\s*[\"'](restart|idle|continue)[\"']"
    r"|[\"'](restart|idle|continue)[\"']\s*(==|!=|\bin\b)"
    r"|\bin\s*[(\[{][^)\]}]*[\"'](restart|idle|continue)[\"']"
)


def test_only_the_policy_module_reads_the_policy_name() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "policies.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if STRING_TEST.search(line)
    ]
    assert not found, "ask the policy object (penv.policy) instead:\n" + "\n".join(found)


def test_importing_the_policies_imports_neither_torch_nor_ray() -> None:
    code = "import sys, parallelenv, parallelenv.policies; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
