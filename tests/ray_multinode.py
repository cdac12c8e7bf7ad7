"""Run by test_ray.py in a process of its own: a ParallelEnv over a 3-node Ray cluster.

A head and two worker nodes on this machine; the envs must spread over both
worker nodes; removing one must make the next step raise WorkerDiedError
naming exactly the envs that lived there, in bounded time, or, with
``restart`` as second argument, rebuild them on the surviving node; and
close() must still succeed. Prints one JSON line with what it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import numpy as np
import ray
from conftest import host_of
from envs import counting
from ray.cluster_utils import Cluster

from parallelenv import ParallelEnv, WorkerDiedError


def main(mode: str, on_worker_failure: str) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False},
    )
    # Rebuilt envs need room on the node that survives: there each node has a spare core.
    healing = on_worker_failure == "restart"
    workers = [cluster.add_node(num_cpus=2 if healing else 1) for _ in range(2)]
    cluster.wait_for_nodes()
    # The nodes' processes inherit this script's PYTHONPATH (tests/ and the checkout), as its workers need.
    ray.init(address=cluster.address, log_to_driver=False)
    seen: dict = {"mode": mode}
    try:
        options = {"num_cpus": 2, "start_timeout": 60} if healing else {}
        penv = ParallelEnv([counting(i, 1000) for i in range(4)], para_mode=mode, on_worker_failure=on_worker_failure,
                           **options)
        penv.reset(seed=0)
        penv.step([0, 0, 0, 0])
        nodes = penv.backend.env_nodes()
        seen["nodes_used"] = len(set(nodes))
        doomed = workers[0]
        seen["expected"] = [i for i, node in enumerate(nodes) if node == doomed.node_id]
        # A machine that is lost takes its processes with it: the raylet, and
        # the actors (with their worker processes) that ran there.
        doomed_pids = {pid for env_id in seen["expected"] for pid in host_of(penv.backend, env_id)}
        cluster.remove_node(doomed, allow_graceful=False)
        for pid in doomed_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        seen["doomed"] = doomed.node_id
        try:
            _, _, _, _, info = penv.step([0, 0, 0, 0])
            seen["raised"] = None
            seen["restarted"] = np.flatnonzero(info.get("_worker_restarted", np.zeros(4, bool))).tolist()
            seen["nodes_after"] = sorted(set(penv.backend.env_nodes()))
        except WorkerDiedError as died:
            seen["raised"] = sorted(died.env_indices)
            seen["reason"] = died.reason
        seen["seconds"] = time.monotonic() - started
        penv.close()
        seen["closed"] = True
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "raise")
