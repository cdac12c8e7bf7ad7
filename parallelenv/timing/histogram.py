"""Durations kept as counts in log-spaced bins: cheap to add, to send, and to subtract.

A window of a run is the difference of two readings of the same
histograms, so a host keeps one set and never resets it. Percentiles are
read to within one bin: a bin spans 2**(1/20), about 3.5%, and a percentile
is the bin's geometric middle (within 1.8% of a value in it), clipped to
the largest duration seen.
"""

from __future__ import annotations

import math

import numpy as np

BINS_PER_DOUBLING = 20
SHORTEST_S = 2.0 ** -20  # about 1 µs: shorter durations count in the first bin
NUM_BINS = 31 * BINS_PER_DOUBLING  # up to 2**10 s, about 17 minutes: longer ones count in the last


class Histogram:
    """Count, sum and largest of a kind of duration, and their distribution over log-spaced bins."""

    __slots__ = ("count", "counts", "largest", "total")

    def __init__(self) -> None:
        self.counts = [0] * NUM_BINS
        self.count = 0
        self.total = 0.0
        self.largest = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        if seconds > self.largest:
            self.largest = seconds
        position = int((math.log2(seconds) + 20.0) * BINS_PER_DOUBLING) if seconds > SHORTEST_S else 0
        self.counts[position if position < NUM_BINS else NUM_BINS - 1] += 1

    def add_many(self, seconds: list[float]) -> None:
        """:meth:`add` of each duration, at once (a host keeps its envs' step times in a list, folded in
        now and then: a list's append costs a step far less than a bin's arithmetic)."""
        values = np.asarray(seconds, dtype=np.float64)
        self.count += len(values)
        self.total += float(values.sum())
        self.largest = max(self.largest, float(values.max()))
        positions = ((np.log2(np.maximum(values, SHORTEST_S)) + 20.0) * BINS_PER_DOUBLING).astype(np.int64)
        positions[values <= SHORTEST_S] = 0
        added = np.bincount(np.minimum(positions, NUM_BINS - 1), minlength=NUM_BINS)
        self.counts = (np.asarray(self.counts, dtype=np.int64) + added).tolist()

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100), to within a bin; 0.0 where nothing was counted."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(self.count * q / 100.0))
        seen = 0
        for position, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                middle = 2.0 ** ((position + 0.5) / BINS_PER_DOUBLING - 20.0)
                return min(middle, self.largest)
        return self.largest

    def since(self, earlier: Histogram | None) -> Histogram:
        """What was counted after ``earlier``, a reading of this same histogram (None: everything).
        The largest is the whole run's where the window's own cannot be told apart from it."""
        if earlier is None:
            return self.copy()
        window = Histogram()
        window.counts = [now - then for now, then in zip(self.counts, earlier.counts, strict=True)]
        window.count = self.count - earlier.count
        window.total = self.total - earlier.total
        top = max((p for p, c in enumerate(window.counts) if c), default=None)
        window.largest = 0.0 if top is None else min(self.largest, 2.0 ** ((top + 1) / BINS_PER_DOUBLING - 20.0))
        return window

    def merged(self, other: Histogram) -> Histogram:
        both = Histogram()
        both.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        both.count, both.total = self.count + other.count, self.total + other.total
        both.largest = max(self.largest, other.largest)
        return both

    def copy(self) -> Histogram:
        return Histogram().merged(self)

    def summary(self) -> dict[str, float]:
        """count, mean, p50, p99 and max, the durations in seconds."""
        return {"count": self.count, "mean": self.mean, "p50": self.percentile(50), "p99": self.percentile(99),
                "max": self.largest}

    def __getstate__(self) -> tuple[list[int], int, float, float]:
        return self.counts, self.count, self.total, self.largest

    def __setstate__(self, state: tuple[list[int], int, float, float]) -> None:
        self.counts, self.count, self.total, self.largest = state

    def __repr__(self) -> str:
        return (f"Histogram(count={self.count}, mean={self.mean * 1e3:.3f} ms, p50={self.percentile(50) * 1e3:.3f} ms, "
                f"max={self.largest * 1e3:.3f} ms)")
