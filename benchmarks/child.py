"""One timed repeat of one pair in a fresh interpreter (``benchmarks._one``).

A crash or a hang becomes an error row rather than stopping the run; the
process group is killed at the end, so nothing a wrapper leaves behind runs
on into the next measurement.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.measure import Measurement
from benchmarks.workloads import WORKLOADS
from benchmarks.wrappers import WRAPPERS

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pair:
    """One row of the table: a wrapper on a workload, with the working tree's parallelenv or REV's."""

    workload: str
    wrapper: str
    steps: int
    revision: str | None = None  # --against REV: this row imports REV's parallelenv

    @property
    def label(self) -> str:
        """The wrapper as the table names it, e.g. ``parallelenv-subproc@HEAD``."""
        return self.wrapper if self.revision is None else f"{self.wrapper}@{self.revision}"


def unavailable(pair: Pair) -> str | None:
    """Why ``pair`` cannot run here, found without importing anything or starting a process."""
    modules = WORKLOADS[pair.workload].requires + WRAPPERS[pair.wrapper].requires
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        from parallelenv.extras import install_command

        return f"{', '.join(missing)} not installed ({install_command('bench')})"
    return None


def not_measured(pair: Pair, skipped: str | None = None, error: str | None = None) -> Measurement:
    """The row of a pair that has no numbers, saying why."""
    spec = WRAPPERS[pair.wrapper]
    return Measurement(pair.workload, pair.label, spec.kind, spec.ours, WORKLOADS[pair.workload].num_envs,
                       pair.steps, revision=pair.revision, skipped=skipped, error=error)


def measure_once(pair: Pair, log_dir: Path, timeout: float, round_index: int,
                 parallelenv_from: Path | None = None) -> Measurement:
    """One repeat of ``pair`` in its own process; ``parallelenv_from`` holds REV's package."""
    log_path = log_dir / re.sub(r"[^\w.@+-]", "_", f"{pair.workload}-{pair.label}-{round_index + 1}.log")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks._one", "--workload", pair.workload,
                   "--wrapper", pair.wrapper, "--steps", str(pair.steps), "--repeats", "1",
                   "--result", str(result_path)]
        if parallelenv_from is not None:
            command += ["--parallelenv-from", str(parallelenv_from)]
        with log_path.open("w") as log:
            # Else in a scratch folder: MuJoCo writes its MUJOCO_LOG.TXT into the working folder.
            returncode = _run_in_own_group(command, log, timeout, parallelenv_from, parallelenv_from or Path(tmp))
        if not result_path.exists():
            return _crashed(pair, returncode, log_path, timeout)
        result = Measurement(**json.loads(result_path.read_text()))
    result.wrapper, result.revision = pair.label, pair.revision
    return result


def _run_in_own_group(command: list[str], log: Any, timeout: float, parallelenv_from: Path | None,
                      cwd: Path) -> int | None:
    """Run ``command``; kill its whole process group at the end. None on timeout."""
    env = dict(os.environ)
    # Workers that unpickle env factories (subprocesses, Ray actors) import
    # benchmarks.workloads by path; make it importable from anywhere. REV's
    # parallelenv, when asked for, goes first, and is the working folder too:
    # Python 3.11's forkserver ignores the parent's sys.path and imports its
    # preloads (parallelenv's worker module) with the working folder first.
    first = [parallelenv_from] if parallelenv_from is not None else []
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, first), str(REPO_ROOT), env.get("PYTHONPATH")]))
    # Its own session, so that it and anything it leaves behind can be
    # stopped together by process group without touching anything else.
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=log,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        returncode: int | None = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return returncode


def _crashed(pair: Pair, returncode: int | None, log_path: Path, timeout: float) -> Measurement:
    if returncode is None:
        return not_measured(pair, error=f"timed out after {timeout:.0f} s")
    tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    return not_measured(pair, error=f"process exited with code {returncode}: {tail[-1][:200] if tail else 'no output'}")
