"""What a group of Ray actors asks of the cluster, compared with what it has before they are created.

Ray queues an actor that no node can hold, or that waits for resources
other work holds, without a word: its start just waits. So the Ray backends
and the pool compare first. An ask the cluster's nodes can never hold is
refused at once, naming both sides; one that must wait for busy resources
says so once, with how long it waits at most. While actors start, a slow
start prints how many have started.

The comparison reads the nodes alive now: a cluster that adds nodes on
demand (an autoscaler) is judged by the nodes it has.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parallelenv.backends.progress import StartProgress
from parallelenv.errors import WorkerStartError

# Ray keeps resources to 1e-4; a share computed as 2/3 must not count as more than it is.
SLACK = 1e-6
# Ray places an actor that names no CPUs on a node with one free (it then holds none while it runs).
DEFAULT_ACTOR_CPUS = 1.0
RESOURCE_OPTIONS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
WAIT_POLL_S = 1.0  # how often a start looks at the clock and the count of started actors
# A start that was short of resources says so if it still waits after this (or half its start_timeout):
# the actors of a ParallelEnv closed just before free theirs a moment after the close returns.
SAID_WAITING_AFTER_S = 5.0

_log = logging.getLogger("parallelenv.ray")


@dataclass(frozen=True)
class Ask:
    """``actors`` actors, each asking ``per_actor`` (Ray resource name -> amount)."""

    per_actor: dict[str, float]
    actors: int

    @classmethod
    def of(cls, options: dict[str, Any], actors: int) -> Ask:
        """The ask of ``actors`` actors made with ``.options(**options)``."""
        per_actor = {"CPU": DEFAULT_ACTOR_CPUS}
        for option, name in RESOURCE_OPTIONS.items():
            if options.get(option) is not None:
                per_actor[name] = float(options[option])
        per_actor.update({name: float(amount) for name, amount in (options.get("resources") or {}).items()})
        return cls({name: amount for name, amount in per_actor.items() if amount > 0}, actors)

    def total(self) -> dict[str, float]:
        return {name: amount * self.actors for name, amount in self.per_actor.items()}

    def room_on(self, node: dict[str, float]) -> int:
        """How many of these actors a node with ``node`` resources holds."""
        room = [math.floor((node.get(name, 0.0) + SLACK) / amount) for name, amount in self.per_actor.items()]
        return min(room, default=self.actors)

    def describe(self) -> str:
        each = _amounts(self.per_actor)
        if self.actors == 1:
            return f"1 Ray actor asks {each}"
        return f"{self.actors} Ray actors ask {_amounts(self.total())} in all ({each} each)"


def places_itself(options: dict[str, Any]) -> bool:
    """Whether the actors go into a placement group (or onto a named node): the group's bundles, not
    the cluster's free resources, say whether they fit, so the comparison is not ours to make."""
    return not isinstance(options.get("scheduling_strategy", "DEFAULT"), str)


def check(ray: Any, ask: Ask, env_ids: Sequence[int], timeout: float | None, limit: str | None = None) -> str | None:
    """Raise :class:`WorkerStartError` if the cluster can never hold ``ask``; else what it waits for
    (None when the cluster has it free now), for ``timeout`` seconds at most (or as ``limit`` says)."""
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    asked, known, free_now = _standing(ray, ask)
    room = sum(ask.room_on(node) for node in nodes)
    if room < ask.actors:
        missing = [name for name in ask.per_actor if not known[name]]
        if missing:
            has = f"no {', '.join(repr(name) for name in missing)} resource on any node"
        elif room == 0:
            has = f"no node with that much (the largest has {_amounts(_largest(nodes, ask))})"
        else:
            has = f"room for {room} of them on its nodes"
        reason = (f"{ask.describe()}, and the Ray cluster has {has}: {_amounts(known)} in all, "
                  f"{_amounts(free_now)} free. It can never start them: ask for less (num_cpus, num_gpus, "
                  "actor_options) or add nodes")
        raise WorkerStartError(env_ids, reason, asked, known, free_now)
    short = {name: amount for name, amount in asked.items() if amount > free_now[name] + SLACK}
    if not short:
        return None
    if limit is None:
        limit = "with no limit (start_timeout=None)" if timeout is None else f"up to {timeout:g} s (start_timeout)"
    return (f"{ask.describe()}; the Ray cluster has {_amounts(known)}, of which {_amounts(free_now)} free "
            f"now: waiting {limit} for other actors or tasks to free {_amounts(short)}")


def wait_started(ray: Any, refs: Sequence[Any], timeout: float | None, waiting: str | None,
                 each: dict[str, float]) -> list[Any]:
    """Wait until every start in ``refs`` is in, or until none has come in for ``timeout`` seconds;
    returns the refs still not in.

    ``waiting`` (from :func:`check`) is said once if, after a moment, the cluster still has less
    free than one actor asks (``each``); a slow start prints how many actors have started.
    """
    pending = list(refs)
    begun = last_start = time.monotonic()
    said_waiting = waiting is None
    grace = SAID_WAITING_AFTER_S if timeout is None else min(SAID_WAITING_AFTER_S, timeout / 2)
    progress = StartProgress(len(refs), "Ray actors")
    while pending:
        now = time.monotonic()
        if timeout is not None and now - last_start >= timeout:
            break
        poll = WAIT_POLL_S if timeout is None else min(WAIT_POLL_S, timeout - (now - last_start))
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=poll)
        now = time.monotonic()
        if ready:
            last_start = now
        if not pending:
            break
        if not said_waiting and now - begun >= grace and _short(ray.available_resources(), each):
            say_waiting(waiting)
            said_waiting = True
        progress.show(len(refs) - len(pending))
    return pending


def say_waiting(waiting: str | None) -> None:
    """Log what a start waits for, where a script that configured no logging still shows it (stderr)."""
    _log.warning("parallelenv: %s", waiting)


def not_started(ray: Any, ask: Ask, env_ids: Sequence[int], started: int, timeout: float | None) -> WorkerStartError:
    """The error for a start that waited ``timeout`` seconds with ``started`` of the actors up."""
    asked, known, free_now = _standing(ray, ask)
    held = " (the actors that started hold theirs)" if started else ""
    within = "the time they were given" if timeout is None else f"the last {timeout:g} s (start_timeout)"
    reason = (f"{started} of {ask.actors} Ray actors started, and none in {within}. "
              f"{ask.describe()}; the Ray cluster has {_amounts(known)}, {_amounts(free_now)} free now{held}. "
              "Other actors or tasks hold what they wait for, or their envs take longer than that to build "
              "(raise start_timeout)")
    return WorkerStartError(env_ids, reason, asked, known, free_now)


def standing(ray: Any, ask: Ask) -> str:
    """What ``ask`` asks beside what the cluster has in all and free now, in words."""
    _, known, free_now = _standing(ray, ask)
    return f"{ask.describe()}; the Ray cluster has {_amounts(known)}, {_amounts(free_now)} free now"


def _standing(ray: Any, ask: Ask) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """``ask``'s total, and the cluster's total and free amounts of what it asks."""
    cluster, free = ray.cluster_resources(), ray.available_resources()
    asked = ask.total()
    return asked, {name: cluster.get(name, 0.0) for name in asked}, {name: free.get(name, 0.0) for name in asked}


def _short(free: dict[str, float], each: dict[str, float]) -> bool:
    return any(amount > free.get(name, 0.0) + SLACK for name, amount in each.items())


def _largest(nodes: list[dict[str, float]], ask: Ask) -> dict[str, float]:
    return {name: max((node.get(name, 0.0) for node in nodes), default=0.0) for name in ask.per_actor}


def _amounts(resources: dict[str, float]) -> str:
    """``{"CPU": 8, "GPU": 0.5}`` as ``8 CPUs, 0.5 GPU``; memory in GiB."""
    parts = []
    for name, amount in resources.items():
        if name == "memory":
            parts.append(f"{amount / 2**30:.3g} GiB of memory")
        elif name in ("CPU", "GPU"):
            parts.append(f"{amount:.4g} {name}{'' if amount == 1 or 0 < amount < 1 else 's'}")
        else:
            parts.append(f"{amount:.4g} of {name!r}")
    return ", ".join(parts) if parts else "nothing"
