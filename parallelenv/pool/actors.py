"""Pool workers as Ray actors, spread over the nodes of the cluster, each a
:class:`~parallelenv.pool.host.WorkerHost`.

Weights go into the object store once per update; every actor gets the
same reference as a top-level argument, which Ray resolves to the value
(zero-copy for NumPy arrays on the actor's node, one transfer per node
otherwise). An actor runs its calls one at a time, in the order they were
made, so a weight update queued behind a collection is applied after it,
between two steps. Actors are never restarted by Ray: the pool replaces a
dead one itself, with fresh seeds and the current weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from parallelenv.backends.ray import cluster as ray_cluster
from parallelenv.backends.ray.resources import Ask, check, places_itself, say_waiting, standing
from parallelenv.pool.host import WorkerHost
from parallelenv.pool.messages import Close, Died, Failed, SetWeights, WorkerReply, WorkerSpec
from parallelenv.pool.weights import Update

CLOSE_GRACE_S = 10.0
DEFAULT_ACTOR_OPTIONS = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}  # SPREAD: over the cluster's nodes
_host_class: dict[str, Any] = {}


@dataclass(eq=False)  # workers are told apart by identity
class ActorWorker:
    handle: Any
    refs: list[Any] = field(default_factory=list)  # calls made and not yet read, oldest first
    node: str = ""
    pid: int | None = None
    env_ids: tuple[int, ...] = ()


class _ActorHost:
    """The actor: a WorkerHost held, not subclassed, as Ray rewrites the classes it makes remote (its
    rewrite cannot pickle a ``singledispatchmethod``)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self._host = WorkerHost(spec)

    def handle(self, request: Any, payload: Any = None) -> WorkerReply:
        return self._host.handle(request, payload)


class ActorFleet:
    """Starts, calls and watches the pool's Ray actors."""

    name = "ray"

    def __init__(self, actor_options: dict[str, Any] | None = None) -> None:
        self._ray = ray_cluster.acquire(self)
        if "class" not in _host_class:  # each ray.remote exports a new class
            _host_class["class"] = self._ray.remote(max_restarts=0)(_ActorHost)
        self._options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
        self._workers: list[ActorWorker] = []
        self._said_waiting = False

    def share_weights(self, arrays: dict[str, Any] | None) -> Any:
        return None  # the object store shares them

    def start(self, spec: WorkerSpec) -> ActorWorker:
        self._check(spec)
        worker = ActorWorker(_host_class["class"].options(**self._options).remote(spec), env_ids=spec.env_ids)
        self._workers.append(worker)
        return worker

    def _check(self, spec: WorkerSpec) -> None:
        """Refuse at once a worker the cluster can never hold beside the pool's others; say once
        when one must wait for resources that other work holds."""
        if places_itself(self._options):
            return
        env_ids = [i for worker in self._workers for i in worker.env_ids] + list(spec.env_ids)
        check(self._ray, Ask.of(self._options, len(self._workers) + 1), env_ids, None)  # raises if never
        # The pool's own actors placed so far hold theirs already: this one needs only its own share free.
        waiting = check(self._ray, Ask.of(self._options, 1), spec.env_ids, None, limit="up to the pool's start_timeout")
        if waiting is not None and not self._said_waiting:
            say_waiting(waiting)
            self._said_waiting = True

    def not_started(self, timeout: float) -> str:
        """Why a worker that has not started within ``timeout`` seconds may still wait: what it asks of the
        cluster beside what the cluster has free."""
        return (f"it did not start within start_timeout={timeout:g} s. {standing(self._ray, Ask.of(self._options, 1))}: "
                "other actors or tasks hold what it waits for, or its envs and policy take longer than that to "
                "build (raise start_timeout)")

    def publish(self, version: int, update: Update) -> tuple[SetWeights, Any]:
        """Once per update: one ``ray.put``, whose reference every actor's request carries."""
        return SetWeights(version, new_policy=update.kind == "policy"), self._ray.put(update.value)

    def send(self, worker: ActorWorker, request: Any, payload: Any = None) -> None:
        worker.refs.append(worker.handle.handle.remote(request, payload))

    def wait(self, workers: list[ActorWorker], timeout: float | None) -> list[tuple[ActorWorker, WorkerReply]]:
        """The replies (or deaths) of ``workers`` that are in, waiting up to ``timeout`` for a first one."""
        refs = [ref for worker in workers for ref in worker.refs]
        if not refs:
            return []
        ray = self._ray
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        events: list[tuple[ActorWorker, WorkerReply]] = []
        for worker in workers:
            # A worker answers in order: read its replies from the oldest up to the first not in.
            while worker.refs and worker.refs[0] in done:
                reply = self._get(worker, worker.refs.pop(0))
                events.append((worker, reply))
                if isinstance(reply, Died):
                    worker.refs.clear()
                    break
        return events

    def _get(self, worker: ActorWorker, ref: Any) -> WorkerReply:
        ray = self._ray
        try:
            return ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as error:
            return Died(self._death(worker, error))
        except ray.exceptions.RayTaskError as error:  # the host's own method raised, not a served request
            return Failed("serving a request", type(error).__name__, str(error), "")

    def _death(self, worker: ActorWorker, error: Exception) -> str:
        alive = {node["NodeID"] for node in self._ray.nodes() if node.get("Alive")}
        if worker.node and worker.node not in alive:
            return f"its Ray node {worker.node} was lost"
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"its Ray actor died: {detail}"

    def kill(self, worker: ActorWorker) -> None:
        with contextlib.suppress(Exception):  # gone with its node
            self._ray.kill(worker.handle, no_restart=True)
        worker.refs.clear()
        if worker in self._workers:
            self._workers.remove(worker)

    def close(self) -> None:
        """A graceful close first, so that each actor closes its envs and their processes, then a kill."""
        workers, self._workers = self._workers, []
        if not ray_cluster.connected():  # Ray shut down first: its actors went with it
            ray_cluster.release(self)
            return
        closing = [worker.handle.handle.remote(Close()) for worker in workers]
        if closing:
            self._ray.wait(closing, num_returns=len(closing), timeout=CLOSE_GRACE_S)
        for worker in workers:
            self.kill(worker)
        ray_cluster.release(self)
