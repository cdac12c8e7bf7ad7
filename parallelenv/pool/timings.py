"""A pool's collections timed: every worker's policy, envs and transport, summed, and which side bounds them.

With ``RolloutPool(stats=True)`` each worker's ParallelEnv measures
(``ParallelEnv(stats=True)``), and each batch it sends carries its
VecWorker's :class:`~parallelenv.rollout.CollectionTimes` since its last
batch; :class:`TimesPool` is the part of the pool that sums them.
"""

from __future__ import annotations

from typing import Any

from parallelenv.rollout.timings import NOTHING, CollectionTimes


class TimesPool:
    """RolloutPool's ``timings()`` (see the module's docstring)."""

    _stats: bool
    _run_times: CollectionTimes = NOTHING
    _recent_times: CollectionTimes = NOTHING

    def _count_times(self, times: CollectionTimes | None) -> None:
        if times is not None:
            self._run_times = self._run_times.merged(times)
            self._recent_times = self._recent_times.merged(times)

    def timings(self, recent: bool = False) -> CollectionTimes:
        """Every worker's collection time summed over the pool's life (or, ``recent=True``, since the
        previous ``timings(recent=True)``): ``.verdict()`` says whether the pool is env-bound or policy-bound."""
        if not self._stats:
            raise RuntimeError("this RolloutPool measures nothing: make it with stats=True")
        if not recent:
            return self._run_times
        times, self._recent_times = self._recent_times, NOTHING
        return times


def with_stats(penv_options: dict[str, Any] | None, stats: bool) -> dict[str, Any]:
    """The workers' ParallelEnv options: ``asynchronous="restart"`` by default, and measuring where asked."""
    return {"asynchronous": "restart", **({"stats": True} if stats else {}), **(penv_options or {})}
