"""Fixtures shared by the whole suite.

``backend`` parametrises a test over every registered para_mode;
``make_penv`` builds ParallelEnvs on it, closes them after the test and
fails the test if a child process or shared-memory segment outlived them.
"""

from __future__ import annotations

import multiprocessing.forkserver
import os
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from parallelenv import ParallelEnv
from parallelenv.backends import backend_names
from parallelenv.backends.shm import NAME_PREFIX

BACKENDS = [name for name in backend_names() if name in ("dummy", "subproc")]
# Small groups so that every subproc test has several workers with several envs each.
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {"subproc": {"num_workers": 2}}


def _infrastructure_pids() -> set[int]:
    """Long-lived helpers multiprocessing starts once per session, not per ParallelEnv."""
    pids = set()
    forkserver_pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if forkserver_pid:
        pids.add(forkserver_pid)
    tracker_pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    if tracker_pid:
        pids.add(tracker_pid)
    return pids


def live_children() -> list[psutil.Process]:
    infrastructure = _infrastructure_pids()
    children = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in infrastructure and child.status() != psutil.STATUS_ZOMBIE:
                children.append(child)
        except psutil.NoSuchProcess:
            pass
    return children


def our_segments() -> set[str]:
    prefix = f"{NAME_PREFIX}{os.getpid()}_"
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


def assert_nothing_left(before: set[int]) -> None:
    leaked = [p for p in live_children() if p.pid not in before]
    # close() joins its workers; a process may still be in the middle of exiting.
    gone, alive = psutil.wait_procs(leaked, timeout=5)
    assert not alive, f"child processes outlived close(): {[(p.pid, p.name()) for p in alive]}"
    assert not our_segments(), f"shared memory left behind: {our_segments()}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_penv(backend: str) -> Iterator[Callable[..., ParallelEnv]]:
    """``make_penv(envs, **kwargs)``: a ParallelEnv on this test's backend."""
    before = {p.pid for p in live_children()}
    made: list[ParallelEnv] = []

    def make(envs: Any, **kwargs: Any) -> ParallelEnv:
        options = {**BACKEND_OPTIONS.get(backend, {}), **kwargs}
        if backend == "subproc":
            options["num_workers"] = min(options.get("num_workers", 2), len(envs))
        penv = ParallelEnv(envs, para_mode=backend, **options)
        made.append(penv)
        return penv

    yield make
    for penv in made:
        penv.close()
    assert_nothing_left(before)


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """For tests that build ParallelEnvs themselves: fail if anything outlives them."""
    before = {p.pid for p in live_children()}
    yield
    assert_nothing_left(before)
