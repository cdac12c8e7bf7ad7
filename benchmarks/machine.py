"""What a result was measured on: CPU, cores, memory, Python, library versions, date.

README.rst quotes the table with its date and machine, so both travel with
every output. Versions come from package metadata, so nothing heavy (torch,
ray) is imported just to print them.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

LIBRARIES = ("parallelenv", "gymnasium", "numpy", "stable-baselines3", "tianshou",
             "torch", "ray", "cloudpickle", "psutil")


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo where there is one."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (a container may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def versions() -> dict[str, str]:
    """Installed versions of the libraries in the run; missing ones left out."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def load_average() -> float | None:
    """The 1-minute load average: other work on a shared machine skews timings."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return None


def describe() -> dict[str, Any]:
    """Everything the report's header says about where and when it ran."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": versions(),
    }


def machine_line(info: dict[str, Any]) -> str:
    """One line for the table's header, e.g. ``Intel Xeon ..., 2 cores, ...``."""
    libs = ", ".join(f"{name} {version}" for name, version in info["versions"].items())
    return (f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"{info['os']}, Python {info['python']}; {libs}")


@dataclass(frozen=True)
class Wait:
    """How one :func:`wait_for_quiet` went."""

    waited_s: float  # 0 when the CPU was idle at once
    busy_percent: float  # at the end
    idle: bool  # False: it gave up after its patience, the CPU still busy


def wait_for_quiet(busy_percent: float = 10.0, patience_s: float = 20.0,
                   on_busy: Callable[[float, float], None] | None = None) -> Wait:
    """Return once the machine is idle again, or after ``patience_s``.

    Processes started just before (64 workers of the previous pair, or the
    worker pool Ray starts after ``ray.init`` returns) take a while to boot
    or die; measured while that goes on, a wrapper loses up to half its speed.
    ``on_busy(busy_percent, waited_s)`` is called every half second it waits,
    so that a caller can say what it waits for: on a machine kept busy by
    others, this wait is the whole patience each time.
    """
    start, waited = time.monotonic(), 0.0
    while (busy := psutil.cpu_percent(interval=0.5)) > busy_percent:
        waited = time.monotonic() - start
        if waited >= patience_s:
            return Wait(waited, busy, idle=False)
        if on_busy is not None:
            on_busy(busy, waited)
    return Wait(waited, busy, idle=True)


@contextlib.contextmanager
def seen_cores(count: int) -> Iterator[None]:
    """Make this process see ``count`` usable cores until the block ends.

    parallelenv's subproc backend picks its path by the cores it may run on
    (``available_cpus()``: ``os.sched_getaffinity``, else ``os.cpu_count``):
    a worker per core sleeps the caller on one countdown (counted steps), more
    workers than cores read each pipe. Reporting a wider affinity here, in
    the measuring process alone, lets a 2-core machine take the path of a
    machine with a core per worker; the workers, started afresh by the
    forkserver, see the real cores. Only the caller's CPU per step carries
    over to that machine: the wall-clock rate still has two cores to share.
    """
    saved = {name: getattr(os, name) for name in _CORE_QUERIES if hasattr(os, name)}
    cores = set(range(count))
    replacements = {"sched_getaffinity": lambda pid: set(cores), "cpu_count": lambda: count,
                    "process_cpu_count": lambda: count}
    for name in saved:
        setattr(os, name, replacements[name])
    try:
        yield
    finally:
        for name, query in saved.items():
            setattr(os, name, query)


_CORE_QUERIES = ("sched_getaffinity", "cpu_count", "process_cpu_count")  # the last one from Python 3.13
