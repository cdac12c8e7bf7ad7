"""One Ray cluster per process: started once, reused, shut down at exit or on request, and only if it is ours.

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
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import HAS_RAY, assert_gone
from envs import CountingEnv, counting

import parallelenv
from parallelenv import ParallelEnv, ParallelEnvError
from parallelenv.backends.ray import cluster as ray_cluster
from parallelenv.backends.ray.cluster import shutdown_ray

pytestmark = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed")
THIS = Path(__file__).resolve()
SCRIPT_TIMEOUT_S = 300  # two local cluster starts and five ParallelEnvs on two busy cores
LEFT_OPEN: list[ParallelEnv] = []  # the script's ParallelEnvs that only the exit hooks close


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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
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
