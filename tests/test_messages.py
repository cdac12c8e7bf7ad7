"""The library speaks for itself: a missing extra, a device torch cannot give, our own checks, negative ids."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import psutil
import pytest
from envs import CountingEnv, counting

import parallelenv
from parallelenv import EnvError, ParallelEnv, ParallelEnvError
from parallelenv.backends import backend_names
from parallelenv.errors import SharedEnvError
from parallelenv.extras import EXTRAS_WITH_TORCH

# What a user without an extra runs, and the extra it needs.
WITHOUT = {
    "sb3": ("stable_baselines3", "import parallelenv.integrations.sb3"),
    "ray": ("ray", "from parallelenv import ParallelEnv; ParallelEnv.make('CartPole-v1', 2, para_mode='ray')"),
    "torch, tensor backend": ("torch", "import parallelenv.tensor"),
    "torch, output": ("torch", "from parallelenv import ParallelEnv; ParallelEnv.make('CartPole-v1', 2, output='torch')"),
    "tqdm": ("tqdm", "from parallelenv.rollout.vec_worker import _progress; _progress(range(3), True)"),
    "torch, shipped tensor envs": ("torch", "from parallelenv.envs import CartPole"),
}
EXTRA = {"stable_baselines3": "sb3", "ray": "ray", "torch": "torch", "tqdm": "demo"}

HIDDEN = """
import sys
sys.modules[sys.argv[1]] = None  # as if it were not installed: importing it raises ModuleNotFoundError
try:
    exec(sys.argv[2])
except ImportError as error:
    print(type(error).__name__, error)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(WITHOUT))
def test_a_missing_extra_says_which_to_install(case):
    module, code = WITHOUT[case]
    done = subprocess.run([sys.executable, "-c", HIDDEN, module, code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    extra = EXTRA[module]
    # The extra by name, and the command that works from a clone (README: not on PyPI), pins included.
    assert f"the extra parallelenv[{extra}] installs: from the clone's root, pip install -e '.[{extra}]' -c " \
           "constraints.txt" in done.stdout, done.stdout
    assert ("CUDA build of torch" in done.stdout) == (extra != "ray"), done.stdout  # SB3 and the demo bring torch


def test_every_install_message_comes_from_one_place():
    # One voice: no other module spells a pip command, so none can drift from the one that works;
    # the benchmark harness and the soak ask the same helper.
    root = Path(parallelenv.__file__).parent.parent
    modules = [path for folder in ("parallelenv", "benchmarks", "soak") for path in (root / folder).rglob("*.py")]
    spelling = [str(path.relative_to(root)) for path in modules if "pip install" in path.read_text()]
    assert spelling == ["parallelenv/extras.py"]


@pytest.mark.parametrize("extra", sorted(set(EXTRA.values()) | {"all", "sb3"}))
def test_the_extras_messages_name_are_setup_cfgs(extra):
    setup = configparser.ConfigParser()
    setup.read(Path(parallelenv.__file__).parent.parent / "setup.cfg")
    assert extra in setup["options.extras_require"]
    assert ("torch" in setup["options.extras_require"][extra] or extra == "sb3") == (extra in EXTRAS_WITH_TORCH)


@pytest.mark.parametrize("machine", ["a CPU-only torch", "no GPU", "fewer GPUs"])
def test_cuda_that_torch_cannot_give_is_said_in_our_words(monkeypatch, machine):
    torch = pytest.importorskip("torch")
    from parallelenv.envs import CartPole

    built, available, count = {"a CPU-only torch": (False, False, 0), "no GPU": (True, False, 0),
                               "fewer GPUs": (True, True, 1)}[machine]
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    device = "cuda:1" if machine == "fewer GPUs" else "cuda"
    why = {"a CPU-only torch": "is a CPU-only build. Install a CUDA build of torch", "no GPU": "finds no CUDA GPU",
           "fewer GPUs": "has 1 CUDA GPU"}[machine]
    with pytest.raises(ValueError, match=rf"device='{device}' asks for a CUDA GPU, but .*{why}.*pass device='cpu'"):
        CartPole(2, device=device)
    with pytest.raises(ValueError, match=why):
        ParallelEnv.make("CartPole-v1", 2, para_mode="tensor", device=device)
    with pytest.raises(ValueError, match=why):  # torch output of a NumPy backend, before any env is built
        ParallelEnv.make("CartPole-v1", 2, output="torch", device=device)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["instance twice", "instance and a wrapper of it"])
def test_one_env_given_twice_is_our_check_not_an_envs_error(make_penv, backend, shape):
    if backend == "tensor":
        pytest.skip("the tensor backend takes one batched env")
    env = CountingEnv(1)
    envs = {"instance twice": [counting(0), env, env],
            "instance and a wrapper of it": [counting(0), env, gym.wrappers.TimeLimit(env, 5)]}[shape]
    with pytest.raises(SharedEnvError, match="env 2 is the same env instance as env 1") as caught:
        make_penv(envs)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ParallelEnvError)
    assert not isinstance(caught.value, EnvError)  # no env raised it, and make() did not fail


@pytest.mark.timeout(60)
@pytest.mark.parametrize("para_mode", backend_names())
@pytest.mark.parametrize("envs", [["CartPole-v1"] * 2, [counting(0), "CartPole-v1"], "CartPole-v1"],
                         ids=["ids", "a factory and an id", "one id"])
def test_a_string_given_as_an_env_names_parallelenv_make(para_mode, envs):
    # Refused where the user gave it, before any worker, actor or cluster starts:
    # not an env that raised in make(), as it read when found where envs are built.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(TypeError, match="is the string 'CartPole-v1'.*: a string is not an env or a factory of one") \
            as caught:
        ParallelEnv(envs, para_mode=para_mode)
    assert not isinstance(caught.value, EnvError)
    num_envs = "N" if isinstance(envs, str) else "2"
    assert f"ParallelEnv.make('CartPole-v1', num_envs={num_envs}, para_mode=...)" in str(caught.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_factories_of_one_env_built_in_the_caller_are_our_check_too(no_leaks):
    env = CountingEnv(1)
    with pytest.raises(SharedEnvError, match="env 2 is the same env instance as env 1"):
        ParallelEnv([counting(0), lambda: env, lambda: env], para_mode="dummy")


@pytest.mark.parametrize("call", ["step", "reset", "get_env_attr", "send"])
def test_a_negative_id_is_explained(no_leaks, call):
    with ParallelEnv([counting(i) for i in range(4)]) as penv:
        penv.reset(seed=0)
        run = {"step": lambda: penv.step([1], id=[-1]), "reset": lambda: penv.reset(id=-1),
               "get_env_attr": lambda: penv.get_env_attr("tag", id=[0, -1]), "send": lambda: penv.send([1], id=-1)}
        with pytest.raises(ValueError, match=r"id -1 is negative: ids are env indices from 0 to 3, and negative ids "
                                             r"are not taken as counting from the end; .* use 3"):
            run[call]()
        with pytest.raises(ValueError, match=r"id -5 is negative: ids are env indices from 0 to 3, .* end$"):
            penv.step([1], id=[-5])


STARTS_RAY = """
import functools
import time

import gymnasium as gym

from parallelenv import ParallelEnv

if __name__ == "__main__":
    with ParallelEnv([functools.partial(gym.make, "CartPole-v1")] * 16, para_mode="ray") as penv:
        penv.reset(seed=0)
        penv.step(penv.action_space.sample())
        time.sleep(2)  # the raylet's warnings reach the driver a moment after the workers start
"""
RAYLET_WARNING = "the maximum expected startup concurrency"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("concurrency", [None, "2"], ids=["ours", "ray-default-on-2-cores"])
def test_the_local_cluster_the_library_starts_says_nothing_of_its_workers(tmp_path, concurrency):
    pytest.importorskip("ray")
    script = tmp_path / "starts_ray.py"
    script.write_text(STARTS_RAY)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_maximum_startup_concurrency")}
    if concurrency is not None:  # the control: Ray's own limit on a 2-core machine, which the test must see warn
        env["RAY_worker_maximum_startup_concurrency"] = concurrency
    # Ray's temp folder of its own: ray.init joins the cluster that the default one names as the last started
    # (another test's multi-node cluster, under xdist), where the script's actors found no CPU free, and that
    # cluster's end killed them. A short path: Ray's sockets live under it.
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp", ignore_cleanup_errors=True) as ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280,
                              cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert (RAYLET_WARNING in said) == (concurrency is not None), said
