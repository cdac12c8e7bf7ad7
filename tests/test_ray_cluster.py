"""One Ray cluster per process: started once, reused, shut down at exit or on request, and only if it is ours;
what the actors ask is checked against it before they are created.

The test session has its own cluster running, so the start-up tests run this
module as a script (``python test_ray_cluster.py ours|users``), in a fresh
process, as users run theirs. The script counts its calls of ``ray.init``,
prints what it saw as one JSON line, and another from an exit hook that runs
after parallelenv's.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import HAS_RAY, assert_gone
from envs import CountingEnv, SlowToBuildEnv, counting

import parallelenv
from parallelenv import ParallelEnv, ParallelEnvError, WorkerDiedError, WorkerStartError
from parallelenv.backends import progress
from parallelenv.backends.ray import cluster as ray_cluster
from parallelenv.backends.ray import resources as ray_resources
from parallelenv.backends.ray.cluster import shutdown_ray
from parallelenv.backends.ray.resources import Ask

pytestmark = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed")
THIS = Path(__file__).resolve()
SCRIPT_TIMEOUT_S = 300  # two local cluster starts and five ParallelEnvs on two busy cores
LEFT_OPEN: list[ParallelEnv] = []  # the script's ParallelEnvs that only the exit hooks close
RAY_MODES = ["ray", "ray-subproc"]


class ClosingEnv(CountingEnv):
    """Leaves a file when closed: its close ran where it lives, so Ray was still up."""

    def __init__(self, tag: int, closed_dir: str) -> None:
        super().__init__(tag)
        self.closed_dir = closed_dir

    def close(self) -> None:
        Path(self.closed_dir, f"closed{self.tag}").touch()


# ---------------------------------------------------------------- in the test session


def test_shutdown_ray_is_public():
    assert parallelenv.shutdown_ray is shutdown_ray
    assert "shutdown_ray" in parallelenv.__all__


@pytest.mark.timeout(120)
def test_a_cluster_we_did_not_start_is_left_running(ray_session):
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray") as penv:
        penv.reset(seed=0)
        assert shutdown_ray() is False  # not ours: nothing to refuse, nothing to shut down
    assert shutdown_ray() is False
    assert ray_session.is_initialized()
    assert ray_session.get(ray_session.put(7)) == 7


# ---------------------------------------------------------------- what the actors ask, beside what the cluster has
# (docs/design.rst, "Resources"): refused at once when it can never be met, "did not start" after a wait.


def test_an_ask_counts_each_actors_share_and_the_room_each_node_has():
    ask = Ask.of({"num_cpus": 0.5, "num_gpus": 0.25, "resources": {"licence": 1}, "scheduling_strategy": "SPREAD"}, 4)
    assert ask.total() == {"CPU": 2.0, "GPU": 1.0, "licence": 4.0}
    assert ask.room_on({"CPU": 2.0, "GPU": 1.0, "licence": 3.0}) == 3  # the licences run out first
    assert ask.room_on({"CPU": 8.0}) == 0
    assert Ask.of({"num_cpus": 2 / 3}, 3).room_on({"CPU": 2.0}) == 3  # a share computed as 2/3 is not more
    assert Ask.of({}, 2).per_actor == {"CPU": 1.0}  # Ray places an actor that names no CPUs on a free one
    assert "3 Ray actors ask 2 CPUs in all (0.6667 CPU each)" in Ask.of({"num_cpus": 2 / 3}, 3).describe()


IMPOSSIBLE = {  # on the session's cluster: one node, 2 CPUs, no GPU
    "more CPUs than the cluster": ({"num_cpus": 8}, "8 CPUs", "2 CPUs in all"),
    "a GPU it has not": ({"num_gpus": 2}, "2 GPUs", "no 'GPU' resource on any node"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", RAY_MODES)
@pytest.mark.parametrize("ask", IMPOSSIBLE, ids=list(IMPOSSIBLE))
def test_an_ask_the_cluster_can_never_hold_is_refused_at_once(ray_session, no_leaks, mode, ask):
    options, asked, has = IMPOSSIBLE[ask]
    begun = time.monotonic()
    with pytest.raises(WorkerStartError) as caught:
        ParallelEnv([counting(i) for i in range(4)], para_mode=mode, **options)
    assert time.monotonic() - begun < 10
    error = caught.value
    assert isinstance(error, WorkerDiedError) and error.env_indices == [0, 1, 2, 3]
    assert asked in str(error) and has in str(error) and "can never start them" in str(error)
    assert "did not start" in str(error) and "died" not in str(error)
    assert error.cluster["CPU"] == 2.0 and error.asked == {"CPU": 8.0} | error.asked


@pytest.fixture
def busy_cluster(ray_session):
    """Every CPU of the session's cluster held by a placement group, as another job's actors hold them."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": ray_session.cluster_resources()["CPU"]}])
    ray_session.get(group.ready(), timeout=30)
    yield ray_session
    remove_placement_group(group)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", RAY_MODES)
def test_an_ask_that_waits_for_busy_cpus_says_so_and_ends_as_did_not_start(busy_cluster, no_leaks, caplog, mode):
    options = {"num_actors": 2, "num_workers_per_actor": 1} if mode == "ray-subproc" else {}
    with pytest.raises(WorkerStartError) as caught:
        ParallelEnv([counting(i) for i in range(2)], para_mode=mode, start_timeout=2, **options)
    error = caught.value
    assert "did not start" in str(error) and "died" not in str(error)
    assert "0 of 2 Ray actors started, and none in the last 2 s (start_timeout)" in str(error)
    assert "ask 2 CPUs in all" in str(error) and "2 CPUs, 0 CPUs free now" in str(error)
    assert (error.asked, error.cluster, error.free) == ({"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 0.0})
    said = [record.getMessage() for record in caplog.records if "waiting" in record.getMessage()]
    assert len(said) == 1 and "waiting up to 2 s (start_timeout) for other actors or tasks to free 2 CPUs" in said[0]


@pytest.mark.timeout(120)
def test_actors_that_did_not_start_leave_nothing_holding_the_cluster(ray_session, no_leaks):
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 2}])
    ray_session.get(group.ready(), timeout=30)
    try:
        with pytest.raises(WorkerStartError):
            ParallelEnv([counting(i) for i in range(2)], para_mode="ray", start_timeout=1)
    finally:
        remove_placement_group(group)
    # Actors left queued would take the CPUs freed now, and this one, asking for all of them, would not start.
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray", start_timeout=30) as penv:
        pids = penv.backend.pids()
        assert penv.reset(seed=0)[0].shape == (2, 4)
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_a_slow_start_says_how_many_actors_have_started(ray_session, no_leaks, capfd, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.2)
    monkeypatch.setattr(ray_resources, "WAIT_POLL_S", 0.1)
    envs = [lambda i=i: SlowToBuildEnv(i, 1.5 * i) for i in range(2)]  # the second actor starts later
    with ParallelEnv(envs, para_mode="ray") as penv:
        penv.reset(seed=0)
    lines = [line for line in capfd.readouterr().err.splitlines() if "Ray actors" in line]
    assert lines and all(re.match(r"parallelenv: started [01] of 2 Ray actors \(\d+ s\)$", line) for line in lines)


def test_missing_ray_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the package
    with pytest.raises(ImportError, match=r"parallelenv\[ray\]"):
        ray_cluster.import_ray()


# ---------------------------------------------------------------- in a script of its own


def run_script(kind: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Run this module as a script; returns what it saw, what its exit hook saw, and its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(THIS.parent), str(THIS.parent.parent)])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, str(THIS), kind, str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    reports = {key: value for line in done.stdout.splitlines() if line.startswith("{")
               for key, value in json.loads(line).items()}
    seen, at_exit = reports["seen"], reports["at_exit"]
    assert_gone(seen["processes"])  # every process started under the script: Ray's daemons, workers, actors
    return seen, at_exit, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_ray_parallel_envs_one_after_another_start_ray_once(tmp_path):
    seen, at_exit, stderr = run_script("ours", tmp_path)
    assert seen["starts_for_two"] == 1  # the second ParallelEnv reused the first one's cluster
    assert seen["up_between"] and seen["up_after_both"]
    assert seen["refused_while_open"] and seen["usable_after_refusal"]
    assert seen["shut_down"] and not seen["up_after_shutdown"]
    assert seen["shut_down_again"] is False
    assert seen["starts"] == 2  # only a ParallelEnv after shutdown_ray() starts a new one
    # The ParallelEnv left open was closed at exit while Ray was up, then our cluster shut down.
    assert at_exit == {"env_closed": True, "ray_up": False}
    assert "Started a local Ray instance" not in stderr  # Ray's INFO lines are silenced


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_a_cluster_the_user_started_survives_close_shutdown_ray_and_our_exit_hook(tmp_path):
    seen, at_exit, _ = run_script("users", tmp_path)
    assert seen["starts"] == 0
    assert seen["up_after_close"] and seen["shut_down"] is False and seen["up_after_shutdown_ray"]
    assert at_exit == {"env_closed": True, "ray_up": True}  # Ray's own exit hook shuts it down later


# ---------------------------------------------------------------- the script


def count_starts(ray: Any) -> list[dict[str, Any]]:
    """Wrap ``ray.init``: the list grows by its keyword arguments at every call."""
    starts: list[dict[str, Any]] = []
    real_init = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        starts.append(kwargs)
        return real_init(*args, **kwargs)

    ray.init = init
    return starts


def report_at_exit(ray: Any, closed_dir: str) -> None:
    """Registered before any ParallelEnv, so that it runs after parallelenv's exit hook, before Ray's."""

    def report() -> None:
        at_exit = {"env_closed": Path(closed_dir, "closed0").exists(), "ray_up": ray.is_initialized()}
        print(json.dumps({"at_exit": at_exit}), flush=True)

    atexit.register(report)


def closing_envs(closed_dir: str) -> list[Any]:
    return [lambda i=i: ClosingEnv(i, closed_dir) for i in range(2)]


def ours(ray: Any, seen: dict[str, Any], closed_dir: str) -> None:
    starts = count_starts(ray)
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray") as penv:
        penv.reset(seed=0)
    seen["up_between"] = ray.is_initialized()
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray-subproc", num_actors=1,
                     num_workers_per_actor=1) as penv:
        penv.reset(seed=0)
    seen["starts_for_two"] = len(starts)
    seen["up_after_both"] = ray.is_initialized()
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray") as penv:
        penv.reset(seed=0)
        try:
            shutdown_ray()
            seen["refused_while_open"] = False
        except ParallelEnvError:
            seen["refused_while_open"] = True
        seen["usable_after_refusal"] = penv.step([0, 0])[1].tolist() == [1.0, 11.0]
    seen["shut_down"] = shutdown_ray()
    seen["up_after_shutdown"] = ray.is_initialized()
    seen["shut_down_again"] = shutdown_ray()
    leave_open(closing_envs(closed_dir))
    seen["starts"] = len(starts)


def users(ray: Any, seen: dict[str, Any], closed_dir: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # its workers inherit our PYTHONPATH
    starts = count_starts(ray)
    with ParallelEnv([counting(i) for i in range(2)], para_mode="ray") as penv:
        penv.reset(seed=0)
    seen["up_after_close"] = ray.is_initialized() and ray.get(ray.put(7)) == 7
    seen["shut_down"] = shutdown_ray()
    seen["up_after_shutdown_ray"] = ray.is_initialized()
    leave_open(closing_envs(closed_dir))
    seen["starts"] = len(starts)


def leave_open(envs: list[Any]) -> None:
    """A Ray ParallelEnv referred to until the interpreter exits, as a script's global would be."""
    LEFT_OPEN.append(ParallelEnv(envs, para_mode="ray"))
    LEFT_OPEN[-1].reset(seed=0)


def main(kind: str, closed_dir: str) -> None:
    import ray

    report_at_exit(ray, closed_dir)
    seen: dict[str, Any] = {"kind": kind}
    {"ours": ours, "users": users}[kind](ray, seen, closed_dir)
    seen["processes"] = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps({"seen": seen}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
