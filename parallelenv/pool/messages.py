"""What the pool and its workers say to each other: one request, one reply, in order.

A worker answers its requests in the order they were sent, over a pipe or
as Ray actor calls, so the pool learns what a reply is about from the head
of that worker's queue of requests sent (:class:`Sent`). Both transports
carry the same types; only how weights travel differs (see
:mod:`parallelenv.pool.weights`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from parallelenv.rollout.trajectories import EpisodeBatch, Transitions


@dataclass(frozen=True)
class WorkerSpec:
    """All a worker needs to build its envs, its VecWorker and its copy of the policy."""

    worker: int
    env_ids: tuple[int, ...]  # the pool's numbers for this worker's envs
    env_payloads: tuple[bytes, ...]
    policy_payload: bytes
    policy_version: int  # the version of the policy in policy_payload
    para_mode: str
    penv_options: dict[str, Any]
    worker_options: dict[str, Any]  # VecWorker's: max_episode_length, output, device
    seed: Any  # a base seed (VecWorker derives from (seed, worker, env)) or one seed per env
    shared_weights: Any = None  # processes: where to read published weights (weights.SharedWeights.handle)
    snapshots: frozenset[str] | None = None  # RolloutPool(snapshots=True): the env classes whose pickle is trusted


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class Start:
    """Build the envs, the VecWorker and the policy of the worker's spec."""


@dataclass(frozen=True)
class SetWeights:
    """Load weights of ``version`` (in the shared block, or in the message's payload) between two steps."""

    version: int
    inline: Any = None  # the weights themselves where they travel in the message
    new_policy: bool = False  # the payload is a pickled policy that replaces the current one


@dataclass(frozen=True)
class UpdateEnvs:
    """``VecWorker.update_env(updates)``: replace envs or set their attributes, by the worker's env index."""

    updates: Any


@dataclass(frozen=True)
class Collect:
    """``num_steps`` steps of every env of the worker (``VecWorker.collect``)."""

    num_steps: int


@dataclass(frozen=True)
class CollectEpisodes:
    """Exactly ``num_episodes`` whole episodes, the first to complete, from fresh episodes."""

    num_episodes: int


@dataclass(frozen=True)
class Close:
    """Close the envs and end."""


@dataclass(frozen=True)
class SaveCollection:
    """The worker's collection in progress (``VecWorker.saved``); ``trusted``: the env classes whose pickle
    the pool's process has checked (the worker's own process has checked none)."""

    trusted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ResumeCollection:
    """Go on from ``saved``, what a SaveCollection gave: the worker's VecWorker is built again from it."""

    saved: bytes


Request = Start | SetWeights | UpdateEnvs | Collect | CollectEpisodes | Close | SaveCollection | ResumeCollection
# What a replacement serves again in place of the worker it replaces: the work the pool waits for, and a
# save or resume under way (the call waiting on it would otherwise wait forever).
SERVED_AGAIN = (Collect, CollectEpisodes, SaveCollection, ResumeCollection)


# ---------------------------------------------------------------- replies


@dataclass(frozen=True)
class Started:
    pid: int
    node: str  # the Ray node id, "" for a process


@dataclass(frozen=True)
class Applied:
    """The worker now acts with the policy of ``version``."""

    version: int


@dataclass(frozen=True)
class Chunk:
    """What a Collect or CollectEpisodes brought, and the policy version that produced it."""

    policy_version: int
    data: Transitions | EpisodeBatch
    saved: bytes | str | None = None  # snapshots: the collection after it (VecWorker.saved, pickled), or why not
    timings: Any = None  # stats: the VecWorker's CollectionTimes since its last batch


@dataclass(frozen=True)
class Failed:
    """The worker raised while serving a request: the exception as data, as calls.Failure carries an env's."""

    what: str  # the request, in words
    exc_type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Died:
    """Not a reply from the worker: the transport saw it die."""

    reason: str


@dataclass(frozen=True)
class Saved:
    """What a SaveCollection asked for: the VecWorker's saved dict, pickled."""

    data: bytes


WorkerReply = Started | Applied | Chunk | Failed | Died | Saved


@dataclass
class Sent:
    """A request sent to a worker and not yet answered."""

    request: Request
    policy_version: int  # the version the worker will act with when it runs the request
    when: float = field(default_factory=time.monotonic)
    call: int = -1  # which obtain call asked for it (-1: none, e.g. a weight update)


def describe(request: Request) -> str:
    """A request in words, for errors and the failure log."""
    if isinstance(request, Collect):
        return f"collecting {request.num_steps} steps"
    if isinstance(request, CollectEpisodes):
        return f"collecting {request.num_episodes} episodes"
    if isinstance(request, SetWeights):
        return f"loading the weights of version {request.version}"
    if isinstance(request, UpdateEnvs):
        return "updating its envs"
    if isinstance(request, (SaveCollection, ResumeCollection)):
        return "saving its collection" if isinstance(request, SaveCollection) else "resuming a saved collection"
    return "building its envs and policy" if isinstance(request, Start) else "closing"
