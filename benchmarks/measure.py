"""Timing and memory of one (workload, wrapper) pair, inside its own process."""

from __future__ import annotations

import contextlib
import importlib
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks.registry import Runner, Unsupported, WrapperSpec
from benchmarks.workloads import Workload

RESET_SEED = 0
# Processes that multiprocessing keeps for the whole interpreter, whoever used
# them first; they are not a wrapper's leftovers.
_INTERPRETER_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


@dataclass
class Measurement:
    """The outcome of one pair; ``skipped``/``error`` explain missing numbers."""

    workload: str
    wrapper: str  # as the table names it: with "@REV" when measured against another revision
    kind: str
    ours: bool
    num_envs: int
    steps: int
    rates: list[float] = field(default_factory=list)  # env-steps/s per repeat
    # CPU time (user + sys) of the measuring process alone, not its children,
    # per batch step, per repeat: what the caller's core pays for the wrapper.
    parent_cpu_us_per_step: list[float] = field(default_factory=list)
    startup_s: float | None = None  # median over the repeats once merged
    peak_rss_mib: float | None = None  # summed over the process tree
    peak_pss_mib: float | None = None
    leftover_processes: int = 0
    workers: int | None = None  # processes stepping the envs; None: the caller's own (or its threads)
    cores_seen: int | None = None  # the cores parallelenv was made to see (seen_cores); None: the real ones
    env_step_s: float | None = None  # one step of the workload's env alone, where it waits (sleep*): measured
    revision: str | None = None  # the git revision of parallelenv; None: the working tree's
    parallelenv_path: str | None = None  # the package the process imported, if it did
    skipped: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def merge(cls, parts: list[Measurement]) -> Measurement:
        """One pair's repeats, each measured in its own process, as one measurement."""
        startups = [part.startup_s for part in parts if part.startup_s is not None]
        return cls(
            **{name: getattr(parts[0], name) for name in
               ("workload", "wrapper", "kind", "ours", "num_envs", "steps", "revision", "parallelenv_path")},
            rates=[rate for part in parts for rate in part.rates],
            parent_cpu_us_per_step=[cpu for part in parts for cpu in part.parent_cpu_us_per_step],
            startup_s=statistics.median(startups) if startups else None,
            peak_rss_mib=_largest(part.peak_rss_mib for part in parts),
            peak_pss_mib=_largest(part.peak_pss_mib for part in parts),
            leftover_processes=max(part.leftover_processes for part in parts),
            workers=next((part.workers for part in parts if part.workers is not None), None),
            cores_seen=next((part.cores_seen for part in parts if part.cores_seen is not None), None),
            env_step_s=_median_of(part.env_step_s for part in parts),
            skipped=next((part.skipped for part in parts if part.skipped), None),
            error=next((part.error for part in parts if part.error), None),
        )


def _largest(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def _median_of(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


class PeakMemory:
    """Peak of the summed RSS (and PSS) of this process and all its descendants.

    A background thread samples during start-up and warm-up; it is paused
    while the clock runs, since walking 65 processes' /proc entries costs
    tens of ms of the very cores being measured, and :meth:`sample` is called
    after each timed repeat instead. RSS counts a page shared by several
    processes once per process (forked workers share most of theirs); PSS
    splits it between them, so its sum is the memory really used. Workers
    started by a forkserver are its children, and it is ours, so a recursive
    walk finds them too.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self._interval_s = interval_s
        self._root = psutil.Process()
        self._stop = threading.Event()
        # Held while sampling, so that a pause waits out a sample in progress.
        self._lock = threading.Lock()
        self._paused = False
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)
        self.peak_rss = 0
        self.peak_pss = 0

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No sampling inside the block; one sample right after it."""
        with self._lock:
            self._paused = True
        try:
            yield
        finally:
            with self._lock:
                self._sample()
                self._paused = False

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._lock:
                if not self._paused:
                    self._sample()

    def _sample(self) -> None:
        rss = pss = 0
        for proc in [self._root, *self._root.children(recursive=True)]:
            # A worker may exit between the listing and the read.
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                info = proc.memory_full_info()
                rss += info.rss
                pss += info.pss
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)


def measure(workload: Workload, spec: WrapperSpec, steps: int, repeats: int) -> Measurement:
    """Start-up, then ``repeats`` timed replays of the same actions."""
    result = Measurement(workload.name, spec.name, spec.kind, spec.ours,
                         workload.num_envs, steps)
    result.skipped = _missing_module(workload.requires + spec.requires)
    if result.skipped:
        return result
    memory = PeakMemory() if workload.measure_memory else None
    try:
        with memory or contextlib.nullcontext(), spec.session():
            _run(workload, spec, steps, repeats, result, memory)
    except Unsupported as exc:
        result.skipped = str(exc)
    except Exception as exc:  # a peer's failure is a row of the report, not a crash
        traceback.print_exc()
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if memory is not None and result.error is None:
        result.peak_rss_mib = memory.peak_rss / 2**20
        result.peak_pss_mib = memory.peak_pss / 2**20
    result.leftover_processes = len(_leftover_children())
    result.parallelenv_path = imported_from("parallelenv")
    return result


def imported_from(package: str) -> str | None:
    """The folder of ``package`` as this process imported it; None if it did not."""
    module = sys.modules.get(package)
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve().parent) if path else None


def _run(workload: Workload, spec: WrapperSpec, steps: int, repeats: int,
         result: Measurement, memory: PeakMemory | None) -> None:
    actions = workload.actions(steps)
    # Warm up on the first tenth of the same actions: caches, lazy imports and
    # worker start-up finish before the clock starts.
    warmup = actions[: max(1, steps // 10)]
    if workload.wait_s:  # before any worker runs: the step as long as it is alone
        result.env_step_s = env_step_seconds(workload)
    layout = {"envs_per_worker": workload.envs_per_worker} if spec.per_worker and workload.envs_per_worker else {}
    start = time.perf_counter()
    runner = spec.make(workload.factories(), **layout)
    with _closing(runner):
        result.workers, result.cores_seen = runner.workers, runner.cores_seen
        runner.reset(RESET_SEED)
        result.startup_s = time.perf_counter() - start
        runner.run(warmup)
        for _ in range(repeats):
            with memory.paused() if memory else contextlib.nullcontext():
                rate, cpu_s = _timed(runner, actions)
            result.rates.append(rate)
            result.parent_cpu_us_per_step.append(cpu_s / len(actions) * 1e6)


def _timed(runner: Runner, actions: Any) -> tuple[float, float]:
    """Env-steps per wall second, and this process's CPU seconds (children excluded)."""
    cpu_start, start = time.process_time(), time.perf_counter()
    env_steps = runner.run(actions)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    own_rate = runner.own_rate()
    return env_steps / wall_s if own_rate is None else own_rate, cpu_s


def env_step_seconds(workload: Workload, steps: int = 20) -> float:
    """The median length of a step of one of ``workload``'s envs, stepped alone in this process.

    A sleep of T lasts T and then some (the timer's slack, the wake-up):
    the efficiency of the many-worker workloads is over what it really lasts.
    """
    env = workload.make_env()
    try:
        env.reset(seed=RESET_SEED)
        action = workload.actions(1)[0, 0]
        lengths = []
        for _ in range(steps):
            start = time.perf_counter()
            env.step(action)
            lengths.append(time.perf_counter() - start)
        return statistics.median(lengths)
    finally:
        env.close()


@contextlib.contextmanager
def _closing(runner: Runner) -> Iterator[Runner]:
    try:
        yield runner
    finally:
        runner.close()


def _missing_module(modules: tuple[str, ...]) -> str | None:
    """Why the workload or the wrapper cannot run here, or None when their imports work."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a broken install raises more than ImportError
            return f"import {module} failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


def _leftover_children(grace_s: float = 3.0) -> list[psutil.Process]:
    """Descendants still alive after close, once they have had time to exit."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if not _is_helper(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True  # gone already
    return any(helper in cmdline for helper in _INTERPRETER_HELPERS)
