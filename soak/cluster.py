"""The local Ray cluster the Ray soaks share: started once, shut down at the end.

Not :func:`parallelenv.backends.ray.cluster.acquire`, which sizes a cluster
to the machine and keeps it up until exit: the soak wants CI's two CPUs
whatever the machine, and its processes gone before it reports. Started
here, the cluster is the caller's in the library's eyes, which never shuts
down a cluster it did not start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NUM_CPUS = 2
ROOT = Path(__file__).resolve().parent.parent  # actors import soak.env from the checkout


@contextmanager
def local_ray(wanted: bool) -> Iterator[None]:
    """A local Ray cluster while the block runs, when ``wanted``."""
    if not wanted:
        yield
        return
    import ray

    path = os.pathsep.join(dict.fromkeys([str(ROOT), *(p for p in sys.path if p)]))
    ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield
    finally:
        ray.shutdown()
