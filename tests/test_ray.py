"""What only the Ray backends have: actors that die, nodes that leave (the cluster itself: test_ray_cluster.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAS_RAY, assert_gone, host_of
from envs import counting

from parallelenv import ParallelEnv, WorkerDiedError, WorkerStartError

pytestmark = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed")
TESTS_DIR = Path(__file__).resolve().parent
RAY_MODES = ["ray", "ray-subproc"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", RAY_MODES)
def test_a_killed_actor_raises_worker_died_naming_its_envs(ray_session, mode):
    options = {"num_actors": 2, "num_workers_per_actor": 1} if mode == "ray-subproc" else {}
    penv = ParallelEnv([counting(i, 100) for i in range(4)], para_mode=mode, **options)
    pids = penv.backend.pids()
    penv.reset(seed=0)
    victim_pid = host_of(penv.backend, 3)[0]  # the last actor: env 3's, or envs 2 and 3's
    os.kill(victim_pid, signal.SIGKILL)
    # Ray learns of the death later: a step sent in between may still be answered.
    assert_gone([victim_pid])
    with pytest.raises(WorkerDiedError) as caught:
        penv.step([0, 0, 0, 0])
    assert caught.value.env_indices == {"ray": [3], "ray-subproc": [2, 3]}[mode]
    with pytest.raises(WorkerDiedError):
        penv.get_env_attr("gravity")
    penv.close()
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_a_dead_worker_process_inside_an_actor_names_only_its_envs(ray_session):
    penv = ParallelEnv([counting(i, 100) for i in range(4)], para_mode="ray-subproc",
                       num_actors=1, num_workers_per_actor=2)
    pids = penv.backend.pids()
    penv.reset(seed=0)
    os.kill(penv.backend.env_pids()[2], 9)  # the worker of envs 2 and 3
    with pytest.raises(WorkerDiedError) as caught:
        penv.step([0, 0, 0, 0])
    assert caught.value.env_indices == [2, 3]
    assert "SIGKILL" in caught.value.reason
    penv.close()
    assert_gone(pids)


@pytest.mark.slow
@pytest.mark.timeout(400)
# make test loses a node under ray-subproc here and in tests/test_healing.py; make test-long under ray too
@pytest.mark.parametrize("mode", [pytest.param("ray", marks=pytest.mark.long), "ray-subproc"])
def test_losing_a_node_names_exactly_its_envs(mode):
    """A head and two worker nodes (ray.cluster_utils.Cluster), in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)])}
    done = subprocess.run([sys.executable, str(TESTS_DIR / "ray_multinode.py"), mode], env=env,
                          capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["nodes_used"] == 2  # the envs were spread over both worker nodes
    assert seen["expected"] and seen["raised"] == seen["expected"], seen
    assert seen["seconds"] < 60, seen
    assert seen["closed"], seen


class Runner:
    """A framework's actor (an RLlib env runner, say) that holds every CPU of the cluster and builds
    a Ray ParallelEnv inside it."""

    def build(self, mode: str) -> None:
        ParallelEnv([counting(i) for i in range(2)], para_mode=mode, start_timeout=2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", RAY_MODES)
def test_a_parallel_env_inside_an_actor_holding_the_cpus_says_it_did_not_start(ray_session, mode):
    runner = ray_session.remote(num_cpus=ray_session.cluster_resources()["CPU"])(Runner).remote()
    try:
        with pytest.raises(WorkerStartError) as caught:  # raised in the actor, unpickled here whole
            ray_session.get(runner.build.remote(mode), timeout=90)
    finally:
        ray_session.kill(runner)
    error = caught.value
    assert isinstance(error, WorkerDiedError) and error.env_indices == [0, 1]
    assert error.asked == {"CPU": 2.0} and error.free == {"CPU": 0.0}
    assert "did not start" in str(error) and "none in the last 2 s (start_timeout)" in str(error)
