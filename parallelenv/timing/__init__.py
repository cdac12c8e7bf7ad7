"""Where the time goes: env step and reset times where they run, the caller's parts, stragglers.

``ParallelEnv(stats=True)`` turns measuring on (off by default, and then
nothing is measured); ``penv.stats()`` reads it (:class:`Stats`).
"""

from parallelenv.timing.histogram import Histogram
from parallelenv.timing.stats import CallerTimes, EnvTimes, Stats, WorkerTimes

__all__ = ["CallerTimes", "EnvTimes", "Histogram", "Stats", "WorkerTimes"]
