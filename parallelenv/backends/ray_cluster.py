"""Which Ray cluster the Ray backends use, and who may shut it down.

A cluster that is already connected (``ray.is_initialized()``) or named by
``RAY_ADDRESS`` is used as it is and never shut down by us. Otherwise the
first Ray backend starts a local one (no dashboard) and the last one to
close shuts it down again.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

_state = {"started_by_us": False, "users": 0}


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "the Ray backends need Ray: pip install 'parallelenv[ray]' (or pip install ray)"
        ) from None
    return ray


def acquire() -> ModuleType:
    """Connect to the cluster to use, starting a local one if there is none; returns the ray module."""
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
    _state["users"] += 1
    return ray


def release() -> None:
    """One Ray backend fewer; the last shuts down a cluster we started."""
    _state["users"] = max(0, _state["users"] - 1)
    if _state["users"] == 0 and _state["started_by_us"]:
        import ray

        ray.shutdown()
        _state["started_by_us"] = False
