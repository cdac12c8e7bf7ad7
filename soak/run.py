"""One backend's soak: step under faults and recycling for a while, sample the resources, judge them."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import psutil

from parallelenv import ParallelEnv, Recycling
from parallelenv.healing import ENV_ERROR, WORKER_RECYCLED
from parallelenv.recycling import resident_mb
from soak import resources
from soak.faults import Fault, FaultPlan, inject
from soak.judge import Verdict, bounded, flat
from soak.profiles import Profile
from soak.resources import Sample

WARM_UP = 0.15  # of the run, before the first sample: imports, allocator pools, the first restarts
NUM_SAMPLES = 60
MIN_SAMPLE_EVERY_S = 0.1
GONE_WITHIN_S = 15.0  # close() joins its workers; Ray reaps a killed actor in its own time
# Absolute allowances, so that a verdict reads the same in a one-minute and a one-day run.
ALLOWANCE = {"parent RSS": 16.0, "fds": 4, "threads": 4, "children": 0, "/dev/shm segments": 0,
             "Ray processes": 4, "worker RSS": 16.0}


@dataclass
class Outcome:
    """What a soak of one backend did and found."""

    para_mode: str
    num_envs: int
    seconds: float = 0.0
    steps: int = 0
    injected: Counter[str] = field(default_factory=Counter)  # by fault
    logged: Counter[str] = field(default_factory=Counter)  # by kind of penv.failures, recycles included
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def env_steps_per_s(self) -> float:
        return self.steps * self.num_envs / self.seconds if self.seconds else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(verdict.passed for verdict in self.verdicts)


def fresh_worker_mb(profile: Profile) -> float | None:
    """A new worker's RSS with one env reset, on this machine: where the memory limit of recycling starts."""
    if profile.recycle_headroom_mb is None:
        return None
    with ParallelEnv(profile.factories()[:1], para_mode=profile.para_mode) as probe:
        probe.reset(seed=0)
        return resident_mb(probe.backend.pids()[0])


def soak(profile: Profile, seconds: float, seed: int = 0, min_faults: int = 0) -> Outcome:
    """Step ``profile``'s ParallelEnv for ``seconds`` under faults, then check what it logged and left.

    ``min_faults``: go on past ``seconds`` until that many faults are injected
    (a short run on a loaded machine, where the steps of ``seconds`` are few).
    """
    fresh_mb = fresh_worker_mb(profile)
    recycle = profile.recycling(fresh_mb)
    children_before = {process.pid for process in resources.descendants()[0]}
    segments_before = resources.segments()
    outcome = Outcome(profile.para_mode, profile.num_envs)
    with tempfile.TemporaryDirectory(prefix="soak-markers-") as markers:
        penv = ParallelEnv(profile.factories(markers), para_mode=profile.para_mode, recycle=recycle,
                           **profile.healing(), **profile.options)
        try:
            samples, expected = _run(penv, profile, seconds, seed, min_faults, outcome, markers)
            outcome.logged = Counter(failure.kind for failure in penv.failures)
            outcome.verdicts.append(_log_verdict(penv, expected))
            if profile.snapshot_every is not None:
                outcome.verdicts.append(_kept_verdict(penv, expected, profile.snapshot_every))
        finally:
            penv.close()
    workers = {pid for sample in samples for pid in sample.workers}
    outcome.verdicts += _parent_verdicts(samples) + _worker_verdicts(samples, profile, recycle, fresh_mb)
    outcome.verdicts += _leftover_verdicts(children_before, segments_before, workers)
    return outcome


def _run(penv: ParallelEnv, profile: Profile, seconds: float, seed: int, min_faults: int,
         outcome: Outcome, markers: str) -> tuple[list[Sample], list[Fault]]:
    """The steps, faults and samples; returns the samples and the faults injected."""
    plan = FaultPlan(profile.faults, profile.fault_every, profile.num_envs, seed)
    expected: list[Fault] = []
    samples: list[Sample] = []
    penv.reset(seed=seed)
    start = time.monotonic()
    end = start + seconds
    sample_every = max(MIN_SAMPLE_EVERY_S, seconds * (1 - WARM_UP) / NUM_SAMPLES)
    next_sample = start + seconds * WARM_UP
    while (now := time.monotonic()) < end or len(expected) < min_faults:
        if now >= next_sample:
            samples.append(resources.sample(penv))
            next_sample += sample_every
        actions = np.zeros(profile.num_envs, dtype=np.int64)
        fault = plan.at(outcome.steps)
        if fault is not None:
            inject(penv, fault, actions, markers)
            expected.append(fault)
            outcome.injected[fault.what] += 1
        penv.step(actions)
        outcome.steps += 1
    outcome.seconds = time.monotonic() - start
    return samples, expected


def _log_verdict(penv: ParallelEnv, expected: list[Fault]) -> Verdict:
    """Every fault injected is logged, in order, with its kind and naming its env; nothing else but recycles."""
    logged = [failure for failure in penv.failures if failure.kind != WORKER_RECYCLED]
    mismatches = [i for i, (failure, fault) in enumerate(zip(logged, expected, strict=False))
                  if failure.kind != fault.kind or fault.env_id not in failure.env_ids]
    passed = len(logged) == len(expected) and not mismatches
    rule = "each fault logged in order, its kind, its env" if passed else (
        f"first mismatch at fault {mismatches[0]}: {expected[mismatches[0]]} logged as "
        f"{logged[mismatches[0]].kind} of envs {logged[mismatches[0]].env_ids}" if mismatches
        else "counts differ")
    return Verdict("failures logged", "", len(expected), len(logged), 0, passed, rule)


def _kept_verdict(penv: ParallelEnv, expected: list[Fault], every: int) -> Verdict:
    """Every env of a worker lost to a fault went on from its snapshot (``SurvivedFailure.restored``): no
    episode cut. Excused: an env with no snapshot to go back to, as it is before its first, or after an env
    error rebuilt it and until its next snapshot (``every`` steps, and as many again for a snapshot due
    while some envs were busy)."""
    logged = [failure for failure in penv.failures if failure.kind != WORKER_RECYCLED]
    rebuilt_at: dict[int, list[int]] = {}
    for fault in expected:
        if fault.kind == ENV_ERROR:
            rebuilt_at.setdefault(fault.env_id, []).append(fault.step)
    lost, kept = 0, 0
    for failure, fault in zip(logged, expected, strict=False):
        if failure.kind == ENV_ERROR:
            continue
        for env_id in failure.env_ids:
            if fault.step <= 2 * every or any(fault.step - 2 * every <= step <= fault.step
                                              for step in rebuilt_at.get(env_id, [])):
                continue
            lost += 1
            kept += env_id in failure.restored
    return Verdict("episodes kept", "", lost, kept, 0, kept == lost,
                   "each env of a lost worker restored from its snapshot, none cut")


def _parent_verdicts(samples: list[Sample]) -> list[Verdict]:
    series = {
        "parent RSS": ("MiB", [s.parent_rss_mb for s in samples]),
        "fds": ("", [s.fds for s in samples]),
        "threads": ("", [s.threads for s in samples]),
        "children": ("", [s.children for s in samples]),
        "/dev/shm segments": ("", [s.segments for s in samples]),
        "Ray processes": ("", [s.ray_processes for s in samples]),
    }
    return [flat(name, unit, values, ALLOWANCE[name]) for name, (unit, values) in series.items()
            if name != "Ray processes" or any(values)]


def _worker_verdicts(samples: list[Sample], profile: Profile, recycle: Recycling | None,
                     fresh_mb: float | None) -> list[Verdict]:
    """The smallest worker stays flat; each worker generation (a pid) stays within what recycling allows it."""
    if not profile.has_workers:
        return []
    allowance = ALLOWANCE["worker RSS"]
    least = [min(s.workers.values()) for s in samples if s.workers]
    verdicts = [flat("worker RSS, least", "MiB", least, allowance)]
    seen: dict[int, list[float]] = {}
    for s in samples:
        for pid, rss in s.workers.items():
            seen.setdefault(pid, []).append(rss)
    if recycle is not None and recycle.memory_mb is not None:
        limit = recycle.memory_mb
        verdicts.append(bounded("worker RSS, max", "MiB", fresh_mb or 0.0, [max(v) for v in seen.values()],
                                limit + allowance, f"below Recycling(memory_mb={limit:.0f}) + allowance"))
    elif profile.recycle_steps is not None:
        budget = profile.recycle_steps * profile.leak_kb / 1024
        verdicts.append(bounded("worker RSS, growth", "MiB", 0.0, [max(v) - min(v) for v in seen.values()],
                                budget + allowance, f"per worker, below {profile.recycle_steps} steps' leak"))
    return verdicts


def _leftover_verdicts(children_before: set[int], segments_before: set[str], workers: set[int]) -> list[Verdict]:
    """Nothing the ParallelEnv started outlives its close(): no child, no worker or actor, no segment."""
    ours, rays = resources.descendants()
    # Ray's processes are ours by descent too: a pid of a worker seen alive that is not among them
    # ended, and was given to another process since.
    started = [p for p in ours if p.pid not in children_before] + [p for p in rays if p.pid in workers]
    _, alive = psutil.wait_procs(started, timeout=GONE_WITHIN_S)
    alive = resources.live(alive)
    left = resources.segments() - segments_before
    return [Verdict("processes after close()", "", 0, len(alive), 0, not alive, "none of ours, no actor"),
            Verdict("segments after close()", "", 0, len(left), 0, not left, "none of ours in /dev/shm")]

