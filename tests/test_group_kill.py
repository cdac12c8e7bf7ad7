"""A job killed as a whole leaves nothing in ``/dev/shm`` (docs/design.rst, "Resources").

Ctrl-C of a shell pipeline, ``timeout -k``, a batch scheduler cancelling the
job and a container stop all SIGKILL the caller, its workers and
multiprocessing's helpers at once: no ``close()``, no ``atexit``, and no
resource tracker left to unlink a name. Whatever a subproc ParallelEnv puts in
``/dev/shm`` must have no name by the time it steps (the countdown's, the
shared buffers'), or a day of killed jobs fills the tmpfs.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from parallelenv.backends.subproc.shm import NAME_PREFIX

TESTS_DIR = Path(__file__).resolve().parent
SHM = Path("/dev/shm")

pytestmark = [
    pytest.mark.skipif(not SHM.is_dir() or not hasattr(os, "killpg"), reason="needs /dev/shm and process groups"),
]

# Builds a subproc ParallelEnv with a worker per core (so that steps are counted: the countdown is in use),
# says so, and steps until it is killed.
STEPPING = """
import sys
from envs import counting
from parallelenv import ParallelEnv

penv = ParallelEnv([counting(tag, 10**9) for tag in range(4)], para_mode="subproc", num_workers=2, {options})
penv.reset(seed=0)
penv.step([1] * 4)
print("STEPPING", flush=True)
while True:
    penv.step([1] * 4)
"""


# A pool of worker processes whose policy has a state dict shares its weights in one block of shared memory.
COLLECTING = """
import torch
from envs import counting
from parallelenv import RolloutPool

class Chooser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 5)

    def forward(self, obs):
        return self.layer(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

policy = Chooser()
with RolloutPool([counting(tag, 10**9) for tag in range(4)], policy, num_workers=2, seed=0) as pool:
    pool.obtain_samples(0, 8, agent_update=policy.state_dict())
    print("STEPPING", flush=True)
    for itr in range(1, 10**9):
        pool.obtain_samples(itr, 8, agent_update=policy.state_dict())
"""
JOBS = {
    "subproc": STEPPING.format(options=""),
    # A replacement worker must find the shared buffers after their name is gone.
    "subproc, restarting": STEPPING.format(options="on_worker_failure='restart'"),
    "pool": COLLECTING,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job", list(JOBS))
def test_a_process_group_killed_while_stepping_leaves_dev_shm_as_it_was(tmp_path, job):
    if job == "pool":
        pytest.importorskip("torch")
    script = tmp_path / "stepping.py"
    script.write_text(JOBS[job])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    before = set(os.listdir(SHM))
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                           env=env, start_new_session=True)
    try:
        line = _read_line(job, deadline=time.monotonic() + 90)
        assert line == b"STEPPING", (line, job.stderr.read() if job.poll() is not None else b"")
        group = _members(job.pid)
        assert len(group) >= 3, group  # the script, its workers, multiprocessing's helpers
        held = _shm_names_held(group)
        os.killpg(job.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(group, timeout=30)  # reaped by us (the script) or by init (the rest)
        assert not [p for p in alive if _running(p)], alive
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        job.stdout.close()
        job.stderr.close()
    # Other tests may come and go in /dev/shm meanwhile: what counts is what the job held or named.
    new = set(os.listdir(SHM)) - before
    left = sorted(name for name in new if name in held or name.startswith(f"{NAME_PREFIX}{job.pid}_"))
    assert not left, f"left in /dev/shm by a killed job: {left}"


def _read_line(job: subprocess.Popen, deadline: float) -> bytes:
    """The script's first line of output, or b"" once it ends or ``deadline`` passes."""
    ready, _, _ = select.select([job.stdout], [], [], max(0.0, deadline - time.monotonic()))
    return job.stdout.readline().strip() if ready else b""


def _members(pgid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def _shm_names_held(processes: list[psutil.Process]) -> set[str]:
    """The names in /dev/shm that ``processes`` map or hold open (named semaphores are mapped too)."""
    names = set()
    for process in processes:
        try:
            with open(f"/proc/{process.pid}/maps") as maps:
                paths = [line.split(maxsplit=5)[-1].strip() for line in maps if " /dev/shm/" in line]
            paths += [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
        except (FileNotFoundError, ProcessLookupError):  # it ended while we looked
            continue
        names.update(Path(path.removesuffix(" (deleted)")).name for path in paths if path.startswith("/dev/shm/"))
    return names


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
