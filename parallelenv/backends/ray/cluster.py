"""Which Ray cluster the Ray backends use, and who may shut it down.

One cluster per process. A cluster that is already connected
(``ray.is_initialized()``) or named by ``RAY_ADDRESS`` is used as it is and
never shut down by us. Otherwise the first Ray backend starts a local one
(quiet, no dashboard) and every later one reuses it: it stays up when the
last backend closes, since a start costs seconds and a training script often
builds one ParallelEnv after another. A cluster we started shuts down at
interpreter exit, or earlier through :func:`shutdown_ray`, never while a
backend uses it.

At interpreter exit (the end of a script, Ctrl-C) the backends still open
are closed before Ray shuts down: Ray's own exit hook would otherwise run
first, and a backend closing after it would start a second local cluster
just to talk to actors that are already gone.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from parallelenv.errors import ParallelEnvError
from parallelenv.extras import missing_extra

EXIT_LOCK_WAIT_S = 1.0
# Set (unless the caller set them) before we start a local cluster. Ray
# reads them at each start. Not RAY_AUTH_MODE, whose notice is the one left:
# Ray reads it once, at import, so that setting it later breaks the start.
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # ray.init's own default, said first: no usage-stats prompt (nightly wheels)
}

# How many worker processes the raylet of a cluster we start lets start at once
# (Ray's RayConfig worker_maximum_startup_concurrency). Ray's default is one
# per core: n actors then start in n/cores rounds one after another, and the
# raylet warns ("... 4x the maximum expected startup concurrency") once 4x that
# many have started, which an actor per env reaches on every laptop. Starting
# them together is as fast as Ray starts actors, and moves the warning to 4x this.
ACTOR_STARTS_AT_ONCE = 64

# The node id of the head of the local cluster we started, while it may still
# be running: a cluster started after it (by anyone) has another.
_state: dict[str, Any] = {"started_node": None, "exit_hook": False}
_users: weakref.WeakSet[Any] = weakref.WeakSet()
# acquire() and shutdown_ray() in different threads: one start, and no
# shutdown between a start and the backend that asked for it.
_lock = threading.Lock()


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ImportError(missing_extra("the Ray backends need Ray", "ray")) from None
    return ray


def acquire(user: Any) -> ModuleType:
    """Connect to the cluster to use, starting a local one if there is none; returns the ray module.

    ``user`` is a backend with a ``close()``; the cluster is not shut down
    while it is open.
    """
    ray = import_ray()
    with _lock:
        if not ray.is_initialized():
            _connect(ray)
        if not _state["exit_hook"]:
            # `import ray` registered Ray's shutdown hook before this; exit hooks run last-in, first-out.
            atexit.register(_at_exit)
            _state["exit_hook"] = True
        _users.add(user)
    return ray


def _connect(ray: ModuleType) -> None:
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}  # Ray's warnings and errors still show
    _state["started_node"] = None
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **quiet)
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    # Workers get the driver's import path, so that env classes from the
    # caller's own modules (scripts, tests) unpickle there.
    import_path = os.pathsep.join(p for p in sys.path if p)
    system_config = {}
    if "RAY_worker_maximum_startup_concurrency" not in os.environ:  # the caller's own choice stands
        system_config["worker_maximum_startup_concurrency"] = max(ACTOR_STARTS_AT_ONCE, os.cpu_count() or 1)
    try:
        with environ_holding("PYTHONPATH", import_path):
            ray.init(include_dashboard=False, _system_config=system_config, **quiet)
    except ValueError as error:
        # A cluster already runs on this machine (`ray start`): ray.init joins it, with its own settings.
        if "existing cluster" not in str(error):
            raise
        ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": import_path}}, **quiet)
    _state["started_node"] = ray.get_runtime_context().get_node_id()


@contextlib.contextmanager
def environ_holding(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` inside, as it was after.

    The processes of a cluster that ray.init starts inherit the driver's
    environment, and its workers the raylet's: an import path given so reaches
    every worker at no cost, where one given as a job's ``runtime_env`` makes
    the raylet set up that environment for each worker it starts, which
    slows the start of every actor.
    """
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def connected() -> bool:
    """Whether Ray is still connected: calls into it now would not start a new cluster."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def release(user: Any) -> None:
    """One Ray backend fewer. The cluster stays up for the next one (see :func:`shutdown_ray`)."""
    _users.discard(user)  # no lock: a close at exit must not wait for a thread stuck in a start


def shutdown_ray() -> bool:
    """Shut down the local Ray cluster that parallelenv started, now rather than at interpreter exit.

    The first Ray ParallelEnv of a process starts a local cluster when Ray
    is not initialized; later ones reuse it, and it shuts down by itself at
    interpreter exit. Call this to free its processes and memory earlier. A
    cluster that you started (``ray.init`` before the first ParallelEnv, or
    ``RAY_ADDRESS``) is yours: it is left running, and this returns False.

    It refuses, rather than waits, while a Ray ParallelEnv is open: only
    closing it would end the wait.

    Returns:
        True if a cluster was shut down; False if parallelenv had none running.

    Raises:
        ParallelEnvError: a Ray ParallelEnv still uses the cluster; ``close()`` it first.

    Example:
        >>> import parallelenv
        >>> parallelenv.shutdown_ray()  # no Ray ParallelEnv has started a cluster here
        False
    """
    with _lock:
        open_users = len(_users)
        if open_users and _ours():
            raise ParallelEnvError(
                f"{open_users} Ray ParallelEnv(s) still use the Ray cluster parallelenv started: close() them first"
            )
        return _shutdown_ours()


def _ours() -> bool:
    """Whether Ray is connected to the local cluster we started (not to one started after it)."""
    ray = sys.modules.get("ray")
    if _state["started_node"] is None or ray is None:
        return False
    if ray.is_initialized() and ray.get_runtime_context().get_node_id() == _state["started_node"]:
        return True
    _state["started_node"] = None  # shut down by someone else
    return False


def _shutdown_ours() -> bool:
    """Shut down the cluster we started, if Ray is still connected to it; under ``_lock``."""
    if not _ours():
        return False
    sys.modules["ray"].shutdown()
    _state["started_node"] = None
    return True


def _at_exit() -> None:
    for user in list(_users):
        try:
            user.close()
        except Exception:  # exiting: close what can be closed
            pass
    # A thread stuck in a start holds the lock: Ray's own exit hook then shuts down.
    if _lock.acquire(timeout=EXIT_LOCK_WAIT_S):
        try:
            _shutdown_ours()
        finally:
            _lock.release()
