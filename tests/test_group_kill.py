"""A job killed as a whole leaves nothing in ``/dev/shm``, nor for long in the temp folder
(docs/design.rst, "Resources").

Ctrl-C of a shell pipeline, ``timeout -k``, a batch scheduler cancelling the
job and a container stop all SIGKILL the caller, its workers and
multiprocessing's helpers at once: no ``close()``, no ``atexit``, and no
resource tracker left to unlink a name. Whatever a subproc ParallelEnv puts in
``/dev/shm`` must have no name by the time it steps (the countdown's, the
shared buffers'), or a day of killed jobs fills the tmpfs. The forkserver's
folder in the temp folder cannot go with such a job (its socket is needed for
every worker started later); the next job that starts a forkserver there
removes it.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from parallelenv.backends.subproc import forkserver_folder
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
# A job that starts a forkserver in the same temp folder, and ends as it should.
NEXT_JOB = """
from envs import counting
from parallelenv import ParallelEnv

with ParallelEnv([counting(tag, 10) for tag in range(2)], para_mode="subproc", num_workers=2) as penv:
    penv.reset(seed=0)
"""
JOBS = {
    "subproc": STEPPING.format(options=""),
    # A replacement worker must find the shared buffers after their name is gone.
    "subproc, restarting": STEPPING.format(options="on_worker_failure='restart'"),
    "pool": COLLECTING,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job", list(JOBS))
def test_a_process_group_killed_while_stepping_leaves_dev_shm_as_it_was(tmp_path, start_job, temp_folder, job):
    if job == "pool":
        pytest.importorskip("torch")
    before = set(os.listdir(SHM))
    pid, group = start_job(JOBS[job], temp_folder)
    held = _shm_names_held(group)
    os.killpg(pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(group, timeout=30)  # reaped by start_job (the script) or by init (the rest)
    assert not [p for p in alive if _running(p)], alive
    # Other tests may come and go in /dev/shm meanwhile: what counts is what the job held or named.
    new = set(os.listdir(SHM)) - before
    left = sorted(name for name in new if name in held or name.startswith(f"{NAME_PREFIX}{pid}_"))
    assert not left, f"left in /dev/shm by a killed job: {left}"
    # Nothing of the job was left to remove the forkserver's folder (else this test shows nothing)...
    assert [folder.name for folder in temp_folder.iterdir()], "the killed job left no folder to remove"
    # ... so the next job does.
    _run_next_job(tmp_path, temp_folder)
    assert not list(temp_folder.iterdir()), "left in the temp folder by a killed job and the next"


@pytest.mark.timeout(120)
def test_a_caller_killed_alone_leaves_no_folder_once_its_workers_are_gone(start_job, temp_folder):
    pid, group = start_job(JOBS["subproc"], temp_folder)
    os.kill(pid, signal.SIGKILL)
    # The workers notice the caller's death and end; the forkserver, once they have, removes its folder as it ends.
    _, alive = psutil.wait_procs(group, timeout=60)
    assert not [p for p in alive if _running(p)], alive
    assert not list(temp_folder.iterdir()), "left in the temp folder by a killed caller"


@pytest.mark.timeout(60)
def test_the_sweep_removes_only_marked_folders_whose_caller_is_gone(temp_folder):
    # One caller gone without its exit's cleanup, one still there; a folder of someone else's, and one
    # marked on another machine sharing the temp folder.
    marking = ("import os, sys; from parallelenv.backends.subproc import forkserver_folder; "
               "forkserver_folder.mark_and_sweep(); print('MARKED', flush=True); sys.stdin.read(); os._exit(0)")
    env = {**os.environ, "TMPDIR": str(temp_folder)}
    there = subprocess.Popen([sys.executable, "-c", marking], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert _read_line(there, deadline=time.monotonic() + 30) == b"MARKED"
        [there_folder] = temp_folder.glob("pymp-*")
        gone = subprocess.run([sys.executable, "-c", marking], input="", capture_output=True, text=True, env=env,
                              timeout=30, check=True)
        assert gone.stdout == "MARKED\n", gone.stderr
        [gone_folder] = set(temp_folder.glob("pymp-*")) - {there_folder}
        unmarked = temp_folder / "pymp-unmarked"
        unmarked.mkdir()
        elsewhere = temp_folder / "pymp-elsewhere"
        elsewhere.mkdir()
        (elsewhere / forkserver_folder.MARK).write_text("another-host/4026531836 1 1")
        forkserver_folder.sweep(temp_folder)
        assert sorted(temp_folder.glob("pymp-*")) == sorted([there_folder, unmarked, elsewhere])
    finally:
        there.stdin.close()
        there.wait(timeout=30)
        there.stdout.close()
    forkserver_folder.sweep(temp_folder)
    assert sorted(temp_folder.glob("pymp-*")) == sorted([unmarked, elsewhere])


def _job_env(temp_folder: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(temp_folder),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def temp_folder():
    """A temp folder of the test's own for the jobs it runs, with a short path: the forkserver's socket
    goes in a folder inside it, and a socket's path has at most 107 bytes (pytest's tmp_path can be longer)."""
    folder = Path(tempfile.mkdtemp(prefix="pe-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def start_job(tmp_path):
    """Starts a script in a process group of its own and, once it steps, gives its pid and its group's
    processes; kills what is left of the group at the end."""
    started = []

    def start(source: str, temp_folder: Path) -> tuple[int, list[psutil.Process]]:
        script = tmp_path / "stepping.py"
        script.write_text(source)
        job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=tmp_path, env=_job_env(temp_folder), start_new_session=True)
        started.append(job)
        line = _read_line(job, deadline=time.monotonic() + 90)
        assert line == b"STEPPING", (line, job.stderr.read() if job.poll() is not None else b"")
        group = _members(job.pid)
        assert len(group) >= 3, group  # the script, its workers, multiprocessing's helpers
        return job.pid, group

    yield start
    for job in started:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(timeout=30)
        job.stdout.close()
        job.stderr.close()


def _run_next_job(tmp_path: Path, temp_folder: Path) -> None:
    script = tmp_path / "next_job.py"
    script.write_text(NEXT_JOB)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env=_job_env(temp_folder), timeout=90)
    assert done.returncode == 0, done.stderr


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
