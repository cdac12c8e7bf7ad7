"""What ``penv.stats()`` returns: per env, per worker and for the caller, over the run or a recent window.

Stragglers are named by one rule: an env whose median step time is more
than :data:`STRAGGLER_FACTOR` times the median of the other envs' medians,
and at least :data:`STRAGGLER_MARGIN_S` above it (envs of a few
microseconds a step differ by more than twice without slowing anything).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from parallelenv.timing.caller_clock import CallerReading
from parallelenv.timing.host_clock import HostReading

STRAGGLER_FACTOR = 2.0
STRAGGLER_MARGIN_S = 1e-4
WHOLE = "whole window"


@dataclass(frozen=True)
class EnvTimes:
    """One env's times where it runs, in seconds: ``step`` and ``reset`` are dicts of count, mean, p50,
    p99 and max. ``history``: ``"whole window"``, or since when its host has run (a restarted or
    recycled worker's envs start a history of their own; ``restarts`` counts them over the run)."""

    env_id: int
    step: dict[str, float]
    reset: dict[str, float]
    restarts: int
    host: str
    history: str


@dataclass(frozen=True)
class WorkerTimes:
    """One env host (a worker process, or the caller for in-caller backends) over the window."""

    host: str
    env_ids: tuple[int, ...]
    busy_s: float  # running calls (its envs' steps and resets, and the rest of its calls)
    alive_s: float

    @property
    def busy(self) -> float:
        """The share of the window it was busy (the rest, it waited for calls)."""
        return self.busy_s / self.alive_s if self.alive_s > 0 else 0.0


@dataclass(frozen=True)
class CallerTimes:
    """The caller's time in ``step``/``send``/``recv`` over the window, in seconds (totals; see
    :mod:`parallelenv.timing.caller_clock` for the parts)."""

    batch_steps: int
    wall_s: float
    own_s: float
    send_s: float
    wait_s: float
    merge_s: float

    @classmethod
    def of(cls, reading: CallerReading) -> CallerTimes:
        return cls(reading.batches, reading.wall, reading.wall - reading.tracked, reading.send, reading.wait,
                   reading.tracked - reading.send - reading.wait)

    def per_batch_step(self) -> dict[str, float]:
        """Each part's mean per batch step, in seconds (wall, own, send, wait, merge)."""
        n = max(self.batch_steps, 1)
        return {"wall": self.wall_s / n, "own": self.own_s / n, "send": self.send_s / n, "wait": self.wait_s / n,
                "merge": self.merge_s / n}

    @property
    def share(self) -> float:
        """The caller's own share of its wall time: all but the wait for the envs."""
        return (self.wall_s - self.wait_s) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class Stats:
    """Where the time went over ``seconds``: the whole run (since the start or ``reset_stats()``), or
    the window since the previous ``stats(recent=True)``."""

    window: str  # "run", "recent" (or "live": the live line's)
    seconds: float
    envs: tuple[EnvTimes, ...]
    workers: tuple[WorkerTimes, ...]
    caller: CallerTimes
    stragglers: tuple[int, ...]

    @property
    def env_steps(self) -> int:
        return sum(int(env.step["count"]) for env in self.envs)

    @property
    def rate(self) -> float:
        """Env-steps per second over the window (as the envs counted them)."""
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        """Flat names and numbers, to log in one line (``writer.add_scalars``, ``wandb.log``)."""
        flat: dict[str, float] = {"seconds": self.seconds, "env_steps": self.env_steps, "env_steps_per_s": self.rate,
                                  "stragglers": len(self.stragglers), "caller/batch_steps": self.caller.batch_steps,
                                  "caller/share": self.caller.share}
        flat.update({f"caller/{part}_ms": seconds * 1e3 for part, seconds in self.caller.per_batch_step().items()})
        for env in self.envs:
            for what in ("step", "reset"):
                for key, value in getattr(env, what).items():
                    flat[f"env/{env.env_id}/{what}_{key}" + ("" if key == "count" else "_ms")] = \
                        value if key == "count" else value * 1e3
            flat[f"env/{env.env_id}/restarts"] = env.restarts
        for number, worker in enumerate(self.workers):
            flat[f"worker/{number}/busy"] = worker.busy
        return flat

    def line(self) -> str:
        """One line: rate, the caller's share and step time, the slowest env, the stragglers."""
        parts = self.caller.per_batch_step()
        timed = [env for env in self.envs if env.step["count"]]
        slowest = max(timed, key=lambda env: env.step["p50"], default=None)
        text = (f"{self.rate:,.0f} env-steps/s | caller {parts['wall'] * 1e3:.2f} ms/batch step, "
                f"{self.caller.share:.0%} its own | wait {parts['wait'] * 1e3:.2f} ms")
        if slowest is not None:
            text += f" | slowest env {slowest.env_id}: p50 {slowest.step['p50'] * 1e3:.2f} ms"
        return text + (f" | stragglers {list(self.stragglers)}" if self.stragglers else " | no straggler")

    def __str__(self) -> str:
        rows = [f"{self.window} ({self.seconds:.1f} s): {self.line()}",
                f"{'env':>5} {'steps':>8} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'resets':>7} "
                f"{'restarts':>8}  host"]
        for env in self.envs:
            step = env.step
            rows.append(f"{env.env_id:>5} {int(step['count']):>8} {step['mean'] * 1e3:>9.3f} {step['p50'] * 1e3:>9.3f} "
                        f"{step['p99'] * 1e3:>9.3f} {step['max'] * 1e3:>9.3f} {int(env.reset['count']):>7} "
                        f"{env.restarts:>8}  {env.host}{'' if env.history == WHOLE else ', ' + env.history}"
                        f"{'  <- straggler' if env.env_id in self.stragglers else ''}")
        parts = ", ".join(f"{part} {seconds * 1e3:.3f}" for part, seconds in self.caller.per_batch_step().items())
        rows.append(f"caller, ms per batch step ({self.caller.batch_steps} batch steps): {parts}")
        rows.extend(f"worker {worker.host}: envs {list(worker.env_ids)}, busy {worker.busy:.0%}" for worker in self.workers)
        return "\n".join(rows)


def stragglers(envs: tuple[EnvTimes, ...]) -> tuple[int, ...]:
    """The envs the module's rule names."""
    medians = {env.env_id: env.step["p50"] for env in envs if env.step["count"]}
    named = []
    for env_id, median in medians.items():
        others = [m for other, m in medians.items() if other != env_id]
        if others:
            typical = statistics.median(others)
            if median > STRAGGLER_FACTOR * typical and median - typical >= STRAGGLER_MARGIN_S:
                named.append(env_id)
    return tuple(named)


def build_stats(window: str, seconds: float, readings: list[HostReading | None], marks: list[HostReading | None],
                caller: CallerReading, restarts: list[int], window_began: float) -> Stats:
    """The Stats of a window: host ``readings`` now and at its start (``marks``, None: before any), by env."""
    envs, hosts = [], {}
    empty = {"count": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    for env_id, (now, then) in enumerate(zip(readings, marks, strict=True)):
        if now is None:  # a host that keeps no clock (the tensor backend's envs are rows of one batch)
            envs.append(EnvTimes(env_id, empty, empty, restarts[env_id], "", WHOLE))
            continue
        same_host = then is not None and then.host_started == now.host_started
        earlier = then if same_host else None
        history = WHOLE if same_host or now.host_started <= window_began else \
            f"since its host started {now.alive_s:.1f} s ago"
        envs.append(EnvTimes(env_id, now.step.since(earlier and earlier.step).summary(),
                             now.reset.since(earlier and earlier.reset).summary(), restarts[env_id], now.host, history))
        busy, alive = (now.busy_s - then.busy_s, now.alive_s - then.alive_s) if same_host else (now.busy_s, now.alive_s)
        key = (now.host, now.host_started)
        ids = hosts[key][1] if key in hosts else ()
        hosts[key] = (WorkerTimes(now.host, (), busy, min(alive, seconds) if not same_host else alive), (*ids, env_id))
    workers = tuple(WorkerTimes(worker.host, ids, worker.busy_s, worker.alive_s) for worker, ids in hosts.values())
    env_times = tuple(envs)
    return Stats(window, seconds, env_times, workers, CallerTimes.of(caller), stragglers(env_times))
