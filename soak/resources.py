"""What the soak watches: the parent's memory, descriptors, threads, children and shared memory, and
its workers' memory, read from /proc and psutil at one moment."""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
from dataclasses import dataclass, field

import psutil

from parallelenv import ParallelEnv
from parallelenv.backends.subproc.shm import NAME_PREFIX

MIB = 2**20


@dataclass(frozen=True)
class Sample:
    """The resources at one moment of a soak; ``workers`` maps each live worker's pid to its RSS in MiB."""

    parent_rss_mb: float
    fds: int
    threads: int
    children: int
    segments: int
    ray_processes: int
    workers: dict[int, float] = field(default_factory=dict)


def helper_pids() -> set[int]:
    """Processes multiprocessing starts once per interpreter (forkserver, resource tracker), not per ParallelEnv."""
    helpers = {getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
               getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)}
    return {pid for pid in helpers if pid}


def descendants() -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Our live descendants, as (ours, Ray's): Ray starts and reaps its own (its cluster, its actors).

    Told apart by the child of ours each descends from, not by their own
    command lines: once Ray is imported, the forkserver passes its paths
    (``.../ray/thirdparty_files``) to every worker it starts.
    """
    helpers = helper_pids()
    ours, rays = [], []
    for child in psutil.Process().children():
        try:
            tree = child.children(recursive=True)
            if child.pid in helpers:
                ours += tree
            elif any("ray" in part for part in child.cmdline()):
                rays += [child, *tree]
            else:
                ours += [child, *tree]
        except psutil.NoSuchProcess:
            pass  # ended while we looked
    return live(ours), live(rays)


def live(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running (a zombie has ended: its parent has yet to reap it)."""
    running = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


def segments() -> set[str]:
    """Our shared-memory segments in /dev/shm (memfd buffers, where /dev/shm is small, count as fds)."""
    prefix = f"{NAME_PREFIX}{os.getpid()}_"
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


def rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / MIB
    except psutil.Error:  # replaced, or not on this machine
        return None


def worker_pids(penv: ParallelEnv) -> list[int]:
    """Every process the backend started that is alive now: workers, Ray actors and the workers under them.

    A worker that died since the last step is noticed by the next one; until
    then a Ray backend cannot be asked for its pids, and this sample has none.
    """
    try:
        return penv.backend.pids()
    except Exception:  # the Ray backends raise the dead actor's error, whatever Ray named it
        return []


def sample(penv: ParallelEnv) -> Sample:
    parent = psutil.Process()
    ours, rays = descendants()
    workers = {pid: rss for pid in worker_pids(penv) if (rss := rss_mb(pid)) is not None}
    return Sample(parent.memory_info().rss / MIB, len(os.listdir("/proc/self/fd")), parent.num_threads(),
                  len(ours), len(segments()), len(rays), workers)
