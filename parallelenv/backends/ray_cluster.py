"""Which Ray cluster the Ray backends use, and who may shut it down.

A cluster that is already connected (``ray.is_initialized()``) or named by
``RAY_ADDRESS`` is used as it is and never shut down by us. Otherwise the
first Ray backend starts a local one (no dashboard) and the last one to
close shuts it down again.

At interpreter exit (the end of a script, Ctrl-C) the backends still open
are closed before Ray shuts down: Ray's own exit hook would otherwise run
first, and a backend closing after it would start a second local cluster
just to talk to actors that are already gone.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from types import ModuleType
from typing import Any

_state = {"started_by_us": False, "exit_hook": False}
_users: weakref.WeakSet[Any] = weakref.WeakSet()


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "the Ray backends need Ray: pip install 'parallelenv[ray]' (or pip install ray)"
        ) from None
    return ray


def acquire(user: Any) -> ModuleType:
    """Connect to the cluster to use, starting a local one if there is none; returns the ray module.

    ``user`` is a backend with a ``close()``, which the cluster outlives.
    """
    ray = import_ray()
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            # Workers get the driver's import path, so that env classes from the
            # caller's own modules (scripts, tests) unpickle there.
            runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
            ray.init(include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
            _state["started_by_us"] = True
    if not _state["exit_hook"]:
        # Registered after ray.init registered Ray's: exit hooks run last-in, first-out.
        atexit.register(_close_users)
        _state["exit_hook"] = True
    _users.add(user)
    return ray


def connected() -> bool:
    """Whether Ray is still connected: calls into it now would not start a new cluster."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def release(user: Any) -> None:
    """One Ray backend fewer; the last shuts down a cluster we started."""
    _users.discard(user)
    if not _users and _state["started_by_us"]:
        import ray

        ray.shutdown()
        _state["started_by_us"] = False


def _close_users() -> None:
    for user in list(_users):
        try:
            user.close()
        except Exception:  # exiting: close what can be closed
            pass
