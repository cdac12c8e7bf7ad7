"""A collection's time split into the policy, the envs and the transport, and which one bounds it.

:class:`TimesCollections` is the part of :class:`~parallelenv.rollout.VecWorker`
that times its agent's calls and reads its ParallelEnv's caller clock
(``ParallelEnv(stats=True)``; else nothing is measured, and
``timings()`` says so): the envs' share is the caller's wait for them, the
transport's the rest of its ``step``/``send``/``recv`` time (sending,
reading and merging results, and the front's own work). The worker's own
bookkeeping between those calls is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

from parallelenv.timing.caller_clock import CallerReading

SIDES = ("policy", "envs", "transport")


@dataclass(frozen=True)
class CollectionTimes:
    """Seconds spent by a collection (or several workers' together) on each side, and its batch steps."""

    policy_s: float
    envs_s: float
    transport_s: float
    batch_steps: int

    @property
    def total_s(self) -> float:
        return self.policy_s + self.envs_s + self.transport_s

    def share(self, side: str) -> float:
        return getattr(self, f"{side}_s") / self.total_s if self.total_s > 0 else 0.0

    @property
    def bound(self) -> str:
        """``"policy"`` or ``"envs"``: the side that took longer."""
        return "policy" if self.policy_s >= self.envs_s else "envs"

    def speedup_if_faster(self, side: str, factor: float = 2.0) -> float:
        """How much faster the collection would run were ``side`` ``factor`` times as fast."""
        part = getattr(self, f"{side}_s")
        rest = self.total_s - part + part / factor
        return self.total_s / rest if rest > 0 else 1.0

    def verdict(self) -> str:
        """One line: which side bounds the collection, the shares, and what a faster side would give."""
        if self.total_s <= 0:
            return "nothing collected yet"
        bound = self.bound
        other = "envs" if bound == "policy" else "policy"
        shares = ", ".join(f"{side} {self.share(side):.0%}" for side in SIDES)
        return (f"{bound}-bound ({shares}): {bound} 2x faster would collect {self.speedup_if_faster(bound):.2f}x "
                f"faster, {other} 2x faster {self.speedup_if_faster(other):.2f}x")

    def merged(self, other: CollectionTimes) -> CollectionTimes:
        return CollectionTimes(self.policy_s + other.policy_s, self.envs_s + other.envs_s,
                               self.transport_s + other.transport_s, self.batch_steps + other.batch_steps)

    def to_dict(self) -> dict[str, float]:
        flat: dict[str, float] = {f"collection/{side}_share": self.share(side) for side in SIDES}
        flat.update({f"collection/{side}_s": getattr(self, f"{side}_s") for side in SIDES})
        flat["collection/policy_bound"] = float(self.bound == "policy")
        return flat


NOTHING = CollectionTimes(0.0, 0.0, 0.0, 0)


class TimesCollections:
    """VecWorker's ``timings()`` (see the module's docstring); it reads VecWorker's own fields."""

    penv: Any
    _policy_s: float = 0.0
    _timing_marks: dict[str, tuple[float, CallerReading | None]]

    def _timed_policy(self, act: Any, *args: Any) -> Any:
        """``act(*args)``, its time counted as the policy's where the ParallelEnv measures."""
        if getattr(self.penv, "_caller_clock", None) is None:
            return act(*args)
        began = perf_counter()
        try:
            return act(*args)
        finally:
            self._policy_s += perf_counter() - began

    def timings(self, recent: bool = False) -> CollectionTimes:
        """Policy, envs and transport over the worker's life (or since the previous ``timings(recent=True)``)."""
        clock = getattr(self.penv, "_caller_clock", None)
        if clock is None:
            raise RuntimeError("the VecWorker's ParallelEnv measures nothing: make it with stats=True")
        marks = self.__dict__.setdefault("_timing_marks", {})
        policy_then, caller_then = marks.get("recent" if recent else "run", (0.0, None))
        caller = clock.read()
        window = caller.since(caller_then)
        if recent:
            marks["recent"] = (self._policy_s, caller)
        return CollectionTimes(self._policy_s - policy_then, window.wait, window.wall - window.wait, window.batches)
