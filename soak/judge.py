"""Whether a resource stayed flat: robust to noise, strict about a trend.

A series sampled after the warm-up is judged by the median of its last
third against the median of its first third: one spike (a worker being
replaced as the sample is taken, a garbage collection) moves neither, while
a leak of any steady rate moves the last third away from the first. The
allowance is absolute (MiB, a count), so that it reads the same on every
machine and in every run length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SAMPLES = 3


@dataclass(frozen=True)
class Verdict:
    """One row of the soak's table: a resource's start, end, growth, and whether it passed."""

    resource: str
    unit: str
    start: float
    end: float
    allowance: float
    passed: bool
    rule: str  # how start and end were read, and against what the allowance was held

    @property
    def growth(self) -> float:
        return self.end - self.start


def flat(resource: str, unit: str, series: Sequence[float], allowance: float) -> Verdict:
    """Passed when the last third's median is at most ``allowance`` above the first third's."""
    if len(series) < MIN_SAMPLES:
        return Verdict(resource, unit, float("nan"), float("nan"), allowance, False,
                       f"only {len(series)} samples, {MIN_SAMPLES} needed")
    third = len(series) // 3
    start, end = float(np.median(series[:third])), float(np.median(series[-third:]))
    return Verdict(resource, unit, start, end, allowance, end - start <= allowance, "median of last third - first")


def bounded(resource: str, unit: str, start: float, values: Sequence[float], bound: float, rule: str) -> Verdict:
    """Passed when no value exceeds ``bound`` (its allowance reads as the room ``bound`` leaves above ``start``)."""
    if not values:
        return Verdict(resource, unit, start, float("nan"), bound - start, False, "no samples")
    end = float(max(values))
    return Verdict(resource, unit, start, end, bound - start, end <= bound, rule)
