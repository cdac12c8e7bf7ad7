"""One timed repeat of one pair in a fresh interpreter (``benchmarks._one``).

A crash or a hang becomes an error row rather than stopping the run; the
process group is killed at the end, so nothing a wrapper leaves behind runs
on into the next measurement.
"""

from __future__ import annotations

import contextlib
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

from benchmarks.machine import wait_for_quiet
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


def measure_once(pair: Pair, log_dir: Path, timeout: float, round_index: int,
                 parallelenv_from: Path | None = None) -> Measurement:
    """One repeat of ``pair`` in its own process; ``parallelenv_from`` holds REV's package."""
    wait_for_quiet()
    log_path = log_dir / re.sub(r"[^\w.@+-]", "_", f"{pair.workload}-{pair.label}-{round_index + 1}.log")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks._one", "--workload", pair.workload,
                   "--wrapper", pair.wrapper, "--steps", str(pair.steps), "--repeats", "1",
                   "--result", str(result_path)]
        if parallelenv_from is not None:
            command += ["--parallelenv-from", str(parallelenv_from)]
        with log_path.open("w") as log:
            returncode = _run_in_own_group(command, log, timeout, parallelenv_from)
        if result_path.exists():
            result = Measurement(**json.loads(result_path.read_text()))
        else:
            result = _crashed(pair, returncode, log_path, timeout)
    result.wrapper, result.revision = pair.label, pair.revision
    return result


def _run_in_own_group(command: list[str], log: Any, timeout: float, parallelenv_from: Path | None) -> int | None:
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
    child = subprocess.Popen(command, cwd=parallelenv_from or REPO_ROOT, env=env, stdout=log, stderr=log,
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
    spec = WRAPPERS[pair.wrapper]
    if returncode is None:
        error = f"timed out after {timeout:g} s"
    else:
        tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        error = f"process exited with code {returncode}: {tail[-1][:200] if tail else 'no output'}"
    return Measurement(pair.workload, pair.wrapper, spec.kind, spec.ours,
                       WORKLOADS[pair.workload].num_envs, pair.steps, error=error)
