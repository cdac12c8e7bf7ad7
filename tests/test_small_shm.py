"""subproc under a small /dev/shm, such as Docker gives a container unless ``--shm-size`` says otherwise.

Each test runs a Python child in a mount namespace of its own, with a 64 MiB
tmpfs mounted on its /dev/shm: that needs root (CI runs as root) and a kernel
that lets it mount; elsewhere the tests skip and say why. The child builds
the ParallelEnv, checks what it returns, and checks that nothing is left in
the small /dev/shm nor mapped or open in the child once it is closed; the
``no_leaks`` fixture checks that no process outlived it.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

SMALL_SHM_MIB = 64
OBS_BYTES = 2**20
TESTS_DIR = Path(__file__).resolve().parent


class MegabyteEnv(gym.Env):
    """A 1 MiB observation, every byte ``tag + step count`` (mod 256)."""

    observation_space = spaces.Box(0, 255, (OBS_BYTES,), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.count = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.count += 1
        return self._obs(), float(self.tag), False, False, {}

    def _obs(self) -> np.ndarray:
        return np.full(OBS_BYTES, (self.tag + self.count) % 256, np.uint8)


def _mappings_of_ours() -> list[str]:
    """Shared memory this process still maps or holds open: a named segment, or a memfd of ours."""
    with open("/proc/self/maps") as maps:
        mapped = [line.split()[-1] for line in maps if "penv_" in line]
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor
        if "penv_" in target:
            held.append(target)
    return mapped + held


def _names_a_memfd(path: str) -> bool:
    try:
        return os.readlink(path).startswith("/memfd:penv_")
    except FileNotFoundError:
        return False


def _run_in_child(num_envs: int, expect_backing: str, kill_a_worker: bool = False) -> None:
    """What the child runs: ``num_envs`` envs stepped on subproc, their memory where ``expect_backing`` says.

    ``kill_a_worker``: kill the worker of the last env and reset, so that its
    replacement attaches to the buffers the first workers attached to.
    """
    from parallelenv import ParallelEnv

    stats = os.statvfs("/dev/shm")
    assert stats.f_blocks * stats.f_frsize == SMALL_SHM_MIB * 2**20, "not under the small /dev/shm"
    tags = np.arange(num_envs)
    healing = {"on_worker_failure": "restart"} if kill_a_worker else {}
    with ParallelEnv(_megabyte_envs(num_envs), para_mode="subproc", num_workers=2, **healing) as penv:
        obs, _ = penv.reset(seed=0)
        assert (obs == (tags % 256).astype(np.uint8)[:, None]).all()
        for count in range(1, 3):
            obs, rewards, terminated, truncated, _ = penv.step(np.zeros(num_envs, dtype=np.int64))
            assert (obs == ((tags + count) % 256).astype(np.uint8)[:, None]).all()
            np.testing.assert_array_equal(rewards, tags.astype(np.float64))
            assert not terminated.any() and not truncated.any()
        if kill_a_worker:
            os.kill(penv.backend.env_pids()[-1], signal.SIGKILL)
            obs, _ = penv.reset(seed=0)
            assert (obs == (tags % 256).astype(np.uint8)[:, None]).all()
            obs, *_ = penv.step(np.zeros(num_envs, dtype=np.int64))
            assert (obs == ((tags + 1) % 256).astype(np.uint8)[:, None]).all()
            assert len(penv.failures) == 1
        assert penv.backend.shared_memory.backing == expect_backing
    assert penv.backend.buffers is None  # closed; the segment stays mapped while the caller holds obs
    del obs  # handed over in a spare slot, the last array over the segment
    _assert_nothing_left()


def _megabyte_envs(num_envs: int) -> list[Any]:
    return [functools.partial(MegabyteEnv, i) for i in range(num_envs)]


def _assert_nothing_left() -> None:
    assert os.listdir("/dev/shm") == [], os.listdir("/dev/shm")
    assert _mappings_of_ours() == [], _mappings_of_ours()


def _race_in_child() -> None:
    """/dev/shm looks roomy when measured, as when another process fills it just after."""
    from parallelenv.backends.subproc import shm

    shm._free_shm_bytes = lambda: 2**40
    _run_in_child(80, "memfd")


def _refused_in_child() -> None:
    """Memory outside /dev/shm cannot be had either: a clear error, before any worker writes."""
    from parallelenv import ParallelEnv
    from parallelenv.backends.subproc.shm import SHM_HEADROOM, SharedMemoryError

    def no_memory(*args: Any) -> int:
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    os.memfd_create = no_memory
    try:
        ParallelEnv(_megabyte_envs(80), para_mode="subproc", num_workers=2)
    except SharedMemoryError as error:
        message = str(error)
    else:
        raise AssertionError("the buffers were made")
    need = int(re.search(r"80 envs need (\d+) MiB", message).group(1))
    shm_size = int(re.search(r"docker run --shm-size=(\d+)m", message).group(1))
    assert need >= 80 and shm_size * 2**20 >= need * 2**20 + SHM_HEADROOM, message
    _assert_nothing_left()


def _in_small_shm(code: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in a new mount namespace whose /dev/shm is a 64 MiB tmpfs."""
    mount = f"mount -t tmpfs -o size={SMALL_SHM_MIB}m tmpfs /dev/shm"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$0" -c "$1"',
         sys.executable, code],
        capture_output=True, text=True, timeout=timeout, cwd=TESTS_DIR, env=env,
    )


@functools.cache
def _why_not_mountable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "a tmpfs in a mount namespace is Linux's"
    if shutil.which("unshare") is None:
        return "no unshare command to make a mount namespace"
    if os.geteuid() != 0:
        return "mounting a small /dev/shm needs root (CI runs as root)"
    probe = _in_small_shm("pass", timeout=30)
    if probe.returncode != 0:
        return f"this machine does not let us mount a tmpfs in a mount namespace: {probe.stderr.strip()}"
    return None


@pytest.fixture
def small_shm() -> None:
    reason = _why_not_mountable()
    if reason:
        pytest.skip(reason)


# What each test's child calls, from this module.
CHILDREN = {
    # 80 MiB of observations: the segment does not fit a 64 MiB /dev/shm, whose
    # overflow killed the workers with SIGBUS as they first wrote the rows past it.
    "more_envs_than_dev_shm_holds_run_in_memory_it_does_not_cap": "_run_in_child(80, 'memfd')",
    "envs_that_fit_stay_in_dev_shm": "_run_in_child(4, '/dev/shm')",
    "a_worker_restarted_attaches_to_the_memory_outside_dev_shm": "_run_in_child(80, 'memfd', kill_a_worker=True)",
    # Every page of the segment is allocated at creation, so a /dev/shm too
    # small for it fails there, and the buffers go outside it.
    "dev_shm_filled_after_it_was_measured_is_no_sigbus": "_race_in_child()",
    "buffers_that_no_memory_holds_raise_a_clear_error": "_refused_in_child()",
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("child", CHILDREN.values(), ids=CHILDREN.keys())
def test_under_a_small_dev_shm(small_shm, no_leaks, child):
    done = _in_small_shm(f"import test_small_shm; test_small_shm.{child}")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux's")
@pytest.mark.parametrize("on_worker_failure", ["raise", "restart"])
def test_buffers_in_a_memfd_reach_the_workers_and_leave_nothing(no_leaks, monkeypatch, on_worker_failure):
    # Runs where no small /dev/shm can be mounted (no root): /dev/shm looks full.
    from parallelenv import ParallelEnv
    from parallelenv.backends.subproc import shm

    monkeypatch.setattr(shm, "_free_shm_bytes", lambda: 0)
    envs = [functools.partial(MegabyteEnv, i) for i in range(3)]
    with ParallelEnv(envs, para_mode="subproc", num_workers=2, on_worker_failure=on_worker_failure) as penv:
        assert penv.backend.shared_memory.backing == "memfd"
        obs, _ = penv.reset(seed=0)
        obs, *_ = penv.step([0, 0, 0])
        assert (obs == np.array([1, 2, 3], dtype=np.uint8)[:, None]).all()
        # The memfd can be opened by its name only while a new worker may need to.
        assert _names_a_memfd(penv.backend.shared_memory.name) == (on_worker_failure == "restart")
        if on_worker_failure == "restart":  # and its new worker opens it
            os.kill(penv.backend.env_pids()[2], signal.SIGKILL)
            obs, _ = penv.reset(seed=0)
            obs, *_ = penv.step([0, 0, 0])
            assert (obs == np.array([1, 2, 3], dtype=np.uint8)[:, None]).all() and len(penv.failures) == 1
    assert (obs == np.array([1, 2, 3], dtype=np.uint8)[:, None]).all()  # still the caller's after close()
    del obs  # the last array over the buffers: they are unmapped with it
    assert _mappings_of_ours() == []
