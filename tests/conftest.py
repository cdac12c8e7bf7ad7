"""Fixtures shared by the whole suite.

``backend`` parametrises a test over every registered para_mode, as
:data:`BUILDS` says to build it; ``make_penv`` builds ParallelEnvs on it,
closes them after the test and fails the test if a child process, an actor
or a shared-memory segment outlived them. A registered backend that
:data:`BUILDS` does not know stops the run at collection.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from toy_backend import ToyBackend

from parallelenv import ParallelEnv, register_backend
from parallelenv.backends import Backend, backend_names
from parallelenv.backends.base import available_cpus

# soak/ lives beside tests/: put the checkout on the path for the scripts the tests start, which import
# this module through the test modules with only tests/ on theirs.
sys.path.append(str(Path(__file__).resolve().parent.parent))
from soak.resources import descendants, segments  # noqa: E402

register_backend("toy", ToyBackend)  # a backend written in the tests, from the protocol alone


def tensor_twin(envs: Any, **options: Any) -> Any:
    """One batched twin of the envs on the tensor backend, its results seen as NumPy (tensor_envs.py)."""
    from tensor_envs import NumpyView, twin

    return NumpyView(ParallelEnv(twin(envs), para_mode="tensor", **options))


@dataclass(frozen=True)
class Build:
    """How the suite builds a ParallelEnv on one backend."""

    needs: str | None = None  # the package of the backend's extra: without it, its tests skip
    options: dict[str, Any] = field(default_factory=dict)  # ParallelEnv options (capped at one group per env)
    make: Callable[..., Any] | None = None  # make(envs, **options) instead of ParallelEnv(envs, para_mode=...)


BUILDS: dict[str, Build] = {
    "dummy": Build(),
    "toy": Build(),
    # Small groups, so that a test has several workers (or actors) with several envs each.
    "subproc": Build(options={"num_workers": 2}),
    "ray": Build(needs="ray"),
    # Two workers per actor: an actor's reply then merges several workers' replies.
    "ray-subproc": Build(needs="ray", options={"num_actors": 2, "num_workers_per_actor": 2}),
    "tensor": Build(needs="torch", make=tensor_twin),
}
HAS_RAY = importlib.util.find_spec("ray") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
RAY_BACKENDS = tuple(name for name, spec in BUILDS.items() if spec.needs == "ray")
BACKENDS = backend_names()
TESTS_DIR = Path(__file__).resolve().parent


def live_children() -> list[psutil.Process]:
    """Our live descendants but multiprocessing's helpers and Ray's own processes (Ray leaks are checked
    by actor pids instead), told apart by the child of ours each descends from: once Ray is imported, every
    worker the forkserver starts names Ray's paths in its command line (soak.resources.descendants)."""
    return descendants()[0]


our_segments = segments


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie: a zombie has exited, and reaping it is its parent's business."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(processes: Iterable[int | psutil.Process], timeout: float = 15.0) -> None:
    """Fail unless every process (a pid or a handle) exits within ``timeout`` (stretched on a busy machine).

    It never reaps them: multiprocessing's join, or Ray's, does, and a process reaped here would leave
    it without the exit status.
    """
    handles = []
    for process in processes:
        try:
            handles.append(process if isinstance(process, psutil.Process) else psutil.Process(process))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout * slowness()
    while (left := [p for p in handles if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left, f"actor or worker processes outlived close(): {[p.pid for p in left]}"


def assert_nothing_left(before: set[int]) -> None:
    leaked = [p for p in live_children() if p.pid not in before]
    # close() joins its workers; a process may still be in the middle of exiting.
    gone, alive = psutil.wait_procs(leaked, timeout=5 * slowness())
    assert not alive, f"child processes outlived close(): {[(p.pid, p.name()) for p in alive]}"
    assert not our_segments(), f"shared memory left behind: {our_segments()}"


# How much longer than on a quiet machine a deadline may wait: the load per core when a test starts,
# from 1 (quiet) up to this cap; PARALLELENV_TEST_SLOWNESS sets it outright.
MAX_SLOWNESS = 6.0


def slowness() -> float:
    """How many times slower than on a quiet machine work runs now: the 1-minute load per usable core.

    A deadline in a test bounds a hang, not the machine's speed: at a load of
    14 on 2 cores a test that takes 60 s when quiet took 3.5 times as long.
    """
    chosen = os.environ.get("PARALLELENV_TEST_SLOWNESS")
    if chosen:
        return float(chosen)
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average to read
        return 1.0
    return min(MAX_SLOWNESS, max(1.0, load / available_cpus()))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's timeout (its mark's, or setup.cfg's) times :func:`slowness`, read as the test starts;
    before pytest-timeout, a wrapper too, reads it."""
    factor = slowness()
    marker = item.get_closest_marker("timeout")
    if marker is None:
        args, kwargs = (item.config.getoption("timeout") or item.config.getini("timeout"),), {}
    else:
        args, kwargs = marker.args, dict(marker.kwargs)
    seconds = args[0] if args else kwargs.pop("timeout", None)
    if factor > 1.0 and seconds:  # None or 0: no timeout to scale
        item.add_marker(pytest.mark.timeout(float(seconds) * factor, *args[1:], **kwargs), append=False)
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules marked ``local_backends`` run on Ray only the tests marked ``every_backend``;
    modules marked ``numpy_backends`` do not run on the tensor backend.

    The conformance suite runs on every backend; the error, lifecycle and id
    tests check mostly the front object, the same for every backend, and a
    Ray ParallelEnv takes seconds to start on two cores.
    """
    unknown = [name for name in backend_names() if name not in BUILDS]
    if unknown:
        raise pytest.UsageError(
            f"backend(s) {unknown} are registered, but tests/conftest.py's BUILDS does not say how to build them: "
            "add an entry, so that the conformance suite runs them"
        )
    deselected = []
    for item in items:
        if HAS_TORCH and getattr(item, "callspec", None) and item.callspec.params.get("backend") == "tensor":
            from tensor_envs import NOT_FOR_TENSOR

            reason = NOT_FOR_TENSOR.get(getattr(item, "originalname", item.name))
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"not for the tensor backend: {reason}"))
        backend = getattr(item, "callspec", None) and item.callspec.params.get("backend")
        if backend in RAY_BACKENDS and item.get_closest_marker("local_backends") and not item.get_closest_marker(
            "every_backend"
        ):
            deselected.append(item)
        elif backend == "tensor" and item.get_closest_marker("numpy_backends"):
            deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray cluster for the whole session, as the Ray backends' tests need."""
    import ray

    from parallelenv.backends.ray.cluster import environ_holding

    # The import path through the environment, which the cluster's processes inherit, as the library
    # gives it: with a job's runtime_env every actor start cost ~60% more CPU (a ParallelEnv of two
    # actors: 1.6 s of the machine's CPU against 1.0 s), and the Ray tests are most of the suite's time.
    with environ_holding("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)])):
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,  # its handlers would outlive pytest's captured streams
        )
    yield ray
    ray.shutdown()


def build(name: str) -> Build:
    """How to build backend ``name``; the test skips when the package of its extra is missing."""
    spec = BUILDS[name]
    if spec.needs is not None and importlib.util.find_spec(spec.needs) is None:
        pytest.skip(f"para_mode={name!r} needs {spec.needs}, which is not installed")
    return spec


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if build(request.param).needs == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.fixture
def make_penv(backend: str) -> Iterator[Callable[..., ParallelEnv]]:
    """``make_penv(envs, **kwargs)``: a ParallelEnv on this test's backend."""
    before = {p.pid for p in live_children()}
    made: list[ParallelEnv] = []
    started: list[int] = []  # what each backend started: Ray's processes are not our children

    def make(envs: Any, **kwargs: Any) -> ParallelEnv:
        spec = build(backend)
        options = {**spec.options, **kwargs}
        for groups in ("num_workers", "num_actors"):
            if groups in options:
                options[groups] = min(options[groups], len(envs))
        penv = spec.make(envs, **options) if spec.make else ParallelEnv(envs, para_mode=backend, **options)
        made.append(penv)
        started.extend(penv.backend.pids())
        return penv

    yield make
    for penv in made:
        penv.close()
    assert_nothing_left(before)
    assert_gone(started)


def host_of(backend: Backend, env_id: int) -> list[int]:
    """The processes ``backend`` started that run env ``env_id``, outermost first.

    ``[worker]`` for subproc, ``[actor]`` for ray, ``[actor, worker]`` for
    ray-subproc; ``[]`` for a backend that runs its envs in the caller.
    """
    started = set(backend.pids())
    env_pid = backend.env_pids()[env_id]
    chain = [env_pid, *(parent.pid for parent in psutil.Process(env_pid).parents())]
    return [pid for pid in reversed(chain) if pid in started]


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """For tests that build ParallelEnvs themselves: fail if anything outlives them."""
    before = {p.pid for p in live_children()}
    yield
    assert_nothing_left(before)
