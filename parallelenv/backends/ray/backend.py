"""The ``ray`` and ``ray-subproc`` backends: groups of envs in Ray actors.

Each actor runs a :class:`~parallelenv.backends.ray.actor_host.GroupHost`:
``ray`` gives every env its own actor (for envs that need their own GPU,
licence or memory), ``ray-subproc`` gives each actor a group of envs that it
runs in its own worker processes (one Ray round trip per group, not per env).
A call is one actor method call per actor; its reply brings the result rows,
which this backend writes into the caller's buffers.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from parallelenv.backends.base import BackendConfig
from parallelenv.backends.buffers import Buffers
from parallelenv.backends.env_sources import EnvSource, env_list, pickle_sources
from parallelenv.backends.partition import Groups
from parallelenv.backends.ray import cluster as ray_cluster
from parallelenv.backends.ray.actor_host import GroupHost, Lost, Rows
from parallelenv.backends.ray.resources import Ask, check, not_started, places_itself, wait_started
from parallelenv.backends.spaces import SpaceMismatch, common_spaces
from parallelenv.backends.subproc.sendable import encode_user_data
from parallelenv.batching import put, take, zeros
from parallelenv.calls import Call, Failure, Reply, Step, method_name
from parallelenv.errors import WorkerDiedError

CLOSE_GRACE_S = 10.0
# A start waits this long with no actor starting before it gives up: an actor builds its envs in seconds,
# and a longer wait is one for resources that other work holds (see resources.py).
START_TIMEOUT_S = 60.0
LOSS_GRACE_S = 2.0  # how long a lost actor's error waits for other actors lost with it
_actor_class: dict[str, Any] = {}


@dataclass
class _Actor:
    handle: Any
    env_ids: list[int]
    node: str = ""
    death: WorkerDiedError | None = None
    started: bool = False  # its start() returned: it answers calls


@dataclass(frozen=True)
class _Pending:
    """A call handed to an actor and not yet answered."""

    actor: _Actor
    call: Call


def _host_class(ray: Any) -> Any:
    """``ray.remote(GroupHost)``, made once per process: each call exports a new class."""
    if "class" not in _actor_class:
        _actor_class["class"] = ray.remote(GroupHost)
    return _actor_class["class"]


class RayBackend:
    """Envs in ``len(groups)`` Ray actors, each hosting a local backend of kind ``local_mode``."""

    def __init__(
        self,
        sources: Sequence[EnvSource],
        config: BackendConfig,
        local_mode: str,
        num_actors: int | None = None,
        num_workers_per_actor: int | None = None,
        start_timeout: float | None = START_TIMEOUT_S,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        sources = env_list(sources)
        payloads = pickle_sources(sources)
        self.num_envs = len(sources)
        self._ray = ray_cluster.acquire(self)
        self._actors: list[_Actor] = []
        self._pending: dict[Any, _Pending] = {}
        self._closed = False
        self._restarts = config.policy.restarts_finished_envs
        try:
            cpus = config.num_cpus if config.num_cpus is not None else self._ray.cluster_resources().get("CPU", 1)
            if num_actors is None:
                num_actors = min(self._cpu_nodes(), self.num_envs)
            if not isinstance(num_actors, int) or not 1 <= num_actors <= self.num_envs:
                raise ValueError(f"num_actors={num_actors!r}; use an int from 1 to the number of envs ({self.num_envs})")
            local_options = {}
            if local_mode == "subproc":
                workers = num_workers_per_actor or max(1, math.floor(cpus / num_actors))
                local_options = {"num_workers": workers}
            options = {
                "num_cpus": cpus / num_actors,
                "num_gpus": config.num_gpus / num_actors,
                "scheduling_strategy": "SPREAD",  # over the cluster's nodes
                **(actor_options or {}),
            }
            self._groups = Groups(self.num_envs, num_actors)
            self._options = options
            waiting = self._check(num_actors, range(self.num_envs), start_timeout)
            host = _host_class(self._ray).options(**options)
            # What a restart needs to start an actor as the first one was started.
            self._new_actor = lambda ids: _Actor(
                host.remote([payloads[i] for i in ids], ids[0], config, local_mode, local_options), ids
            )
            self._start_timeout = start_timeout
            for ids in self._groups.members:
                self._actors.append(self._new_actor(ids))
            self._start(start_timeout, waiting)
        except BaseException:
            self.close()
            raise

    def _cpu_nodes(self) -> int:
        nodes = self._ray.nodes()
        return max(1, sum(1 for node in nodes if node.get("Alive") and node.get("Resources", {}).get("CPU")))

    def _check(self, actors: int, env_ids: Sequence[int], timeout: float | None) -> str | None:
        """Refuse at once what the cluster can never hold; what a start must wait for, if anything."""
        if places_itself(self._options):
            return None
        return check(self._ray, Ask.of(self._options, actors), list(env_ids), timeout)

    def _start(self, timeout: float | None, waiting: str | None) -> None:
        per_env = self._started(self._actors, timeout, waiting)
        self.single_observation_space, self.single_action_space = common_spaces(per_env)
        self.buffers = Buffers.allocate(
            self.single_observation_space, self.single_action_space, self.num_envs, zeros, self._restarts
        )

    def _started(self, actors: list[_Actor], timeout: float | None, waiting: str | None) -> list[tuple[Any, Any]]:
        """Wait for ``actors`` to build their envs; each env's spaces, in env order."""
        ray = self._ray
        starts = {actor.handle.start.remote(): actor for actor in actors}
        ask = Ask.of(self._options, len(actors))
        not_ready = wait_started(ray, list(starts), timeout, waiting, ask.per_actor)
        for ref, actor in starts.items():
            actor.started = ref not in not_ready
        if not_ready:
            stuck = [i for ref in not_ready for i in starts[ref].env_ids]
            raise not_started(ray, ask, stuck, len(starts) - len(not_ready), timeout)
        per_env = []
        for ref, actor in starts.items():  # in env order: a mismatch names the env that differs
            started = self._get(ref, actor)
            if isinstance(started, Failure):
                started.raise_error()
            if isinstance(started, SpaceMismatch):
                raise started
            *pair, actor.node = started
            per_env += [tuple(pair)] * len(actor.env_ids)
        return per_env

    def _get(self, ref: Any, actor: _Actor) -> Any:
        try:
            return self._ray.get(ref)
        except self._actor_errors() as lost:
            raise self._lost(actor, lost) from None

    def _actor_errors(self) -> tuple[type[Exception], ...]:
        exceptions = self._ray.exceptions
        return exceptions.RayActorError, exceptions.ActorUnavailableError

    def _lost(self, actor: _Actor, error: Exception) -> WorkerDiedError:
        """The error for a dead actor, and for every other actor whose call fails with it.

        A lost node takes all its actors at once; their calls fail within
        moments of each other, so the error waits a little for them and names
        all their envs, not just the first actor's.
        """
        dead = [actor]
        others = [ref for ref, other in self._pending.items() if other.actor is not actor]
        if others:
            ready, _ = self._ray.wait(others, num_returns=len(others), timeout=LOSS_GRACE_S)
            for ref in ready:
                try:
                    self._ray.get(ref)
                except self._actor_errors():
                    if self._pending[ref].actor not in dead:
                        dead.append(self._pending[ref].actor)
        alive = {node["NodeID"] for node in self._ray.nodes() if node.get("Alive")}
        lost_nodes = sorted({a.node for a in dead if a.node and a.node not in alive})
        if lost_nodes:
            reason = f"Ray node {', '.join(lost_nodes)} was lost"
        else:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            reason = f"its Ray actor died: {detail}"
        death = WorkerDiedError(sorted(i for a in dead for i in a.env_ids), reason)
        for a in dead:
            a.death = death
        return death

    def env_nodes(self) -> list[str]:
        """The Ray node id each env runs on."""
        return [actor.node for actor in self._actors for _ in actor.env_ids]

    def dispatch(self, call: Call) -> None:
        messages = []
        # Every message is made before any is sent (see SubprocBackend.dispatch).
        for group, actor_call in self._groups.split(call):
            actor = self._actors[group]
            if actor.death is not None:
                raise actor.death
            actions = take(self.buffers.actions, np.array(actor_call.env_ids)) if type(call) is Step else None
            messages.append((actor, actor_call, encode_user_data((actor_call, actions), call)))
        for actor, actor_call, message in messages:
            self._pending[actor.handle.run_encoded.remote(message)] = _Pending(actor, actor_call)

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        if not self._pending:
            return []
        ray = self._ray
        refs = list(self._pending)
        # Each ray.wait is a round trip to the core worker: one for all replies
        # when the caller needs all of them (see Backend.collect on ``wanted``),
        # else the first and whatever else is in.
        want_all = wanted is None or wanted >= sum(len(p.call.env_ids) for p in self._pending.values())
        ready, _ = ray.wait(refs, num_returns=len(refs) if want_all else 1, timeout=timeout)
        if not ready:
            return []
        if len(ready) < len(refs) and not want_all:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        try:
            results: list[Any] | None = ray.get(ready)  # one round trip for all of them
        except Exception:
            results = None  # a dead actor or a failed task: each is read on its own
        replies: list[Reply] = []
        death: WorkerDiedError | None = None
        for position, ref in enumerate(ready):
            pending = self._pending[ref]
            try:
                result = self._result(ref) if results is None else results[position]
            except WorkerDiedError as died:
                death = death or died
                continue
            finally:
                del self._pending[ref]
            if isinstance(result, Reply):  # the actor's method itself raised
                replies.append(result)
                continue
            reply, rows = pickle.loads(result)
            if isinstance(reply, Lost):
                # A worker process under the actor died, and with it the actor's
                # own backend: the actor counts as dead, all its envs with it.
                pending.actor.death = WorkerDiedError(pending.actor.env_ids, reply.reason)
                death = death or WorkerDiedError(reply.env_ids, reply.reason)
                continue
            if rows is not None:
                self._store(np.array(reply.env_ids), rows)
            replies.append(reply)
        if death is not None:
            death.replies_before_death = replies  # the living actors' answers are the caller's all the same
            raise death
        return replies

    def _result(self, ref: Any) -> Any:
        """One actor's answer; a Reply with every env failing when its task raised, not its env."""
        pending = self._pending[ref]
        try:
            return self._get(ref, pending.actor)
        except self._ray.exceptions.RayTaskError as error:
            cause = error.as_instanceof_cause() if hasattr(error, "as_instanceof_cause") else error
            # Raised in the actor: its frames are not here, so the failure carries their text only.
            failures = tuple(
                replace(Failure.from_exception(i, method_name(pending.call), cause), exception=None)
                for i in pending.call.env_ids
            )
            return Reply(type(pending.call), pending.call.env_ids, {}, failures)

    def _store(self, ids: np.ndarray, rows: Rows) -> None:
        buffers = self.buffers
        put(buffers.obs, ids, rows.obs)
        if rows.reward is not None:
            buffers.reward[ids] = rows.reward
            buffers.terminated[ids] = rows.terminated
            buffers.truncated[ids] = rows.truncated
            if buffers.ended is not None:
                if rows.ended is None:  # no episode ended
                    buffers.ended[ids] = False
                else:
                    buffers.ended[ids] = rows.ended
                    buffers.ended_obs[ids[rows.ended]] = rows.ended_obs

    def calls_under_way(self) -> list[tuple[Any, tuple[int, ...]]]:
        """Each call under way: its Ray object ref and the env ids of the actor running it (for tests)."""
        return [(ref, tuple(pending.actor.env_ids)) for ref, pending in self._pending.items()]

    def env_pids(self) -> list[int]:
        """Per env, its process: its actor (``ray``) or a worker process under the actor (``ray-subproc``).

        Raises the :class:`WorkerDiedError` of a dead actor: its processes are gone.
        """
        for actor in self._actors:
            if actor.death is not None:
                raise actor.death
        refs = [actor.handle.env_pids.remote() for actor in self._actors]
        return [pid for pids in self._ray.get(refs, timeout=30) for pid in pids]

    def pids(self) -> list[int]:
        """The process of every live actor, each followed by the worker processes under it."""
        refs = [actor.handle.pids.remote() for actor in self._actors if actor.death is None]
        return [pid for pids in self._ray.get(refs, timeout=30) for pid in pids]

    def restart(self, env_ids: Sequence[int]) -> list[int]:
        """A new actor in place of each dead one hosting ``env_ids``; Ray places it on a live node."""
        dead = [group for group in self._groups.hosting(env_ids) if self._actors[group].death is not None]
        if not dead:
            return []
        waiting = self._check(len(dead), [i for group in dead for i in self._actors[group].env_ids],
                              self._start_timeout)
        replaced = []
        for group in dead:
            old = self._actors[group]
            self._pending = {ref: p for ref, p in self._pending.items() if p.actor is not old}
            try:
                self._ray.kill(old.handle, no_restart=True)
            except Exception:  # gone with its node
                pass
            new = self._actors[group] = self._new_actor(old.env_ids)
            replaced.append(new)
        try:
            per_env = self._started(replaced, self._start_timeout, waiting)
        except BaseException as exc:
            for actor in replaced:
                actor.death = actor.death or WorkerDiedError(actor.env_ids, f"its replacement failed to start: {exc}")
            raise
        if any(pair != (self.single_observation_space, self.single_action_space) for pair in per_env):
            for actor in replaced:
                actor.death = WorkerDiedError(actor.env_ids, "its replacement's envs have other spaces")
            raise replaced[0].death  # type: ignore[misc]
        return [i for actor in replaced for i in actor.env_ids]

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        lost: list[int] = []
        for group in self._groups.hosting(env_ids):
            actor = self._actors[group]
            self._ray.kill(actor.handle, no_restart=True)
            actor.death = WorkerDiedError(actor.env_ids, "it did not answer within call_timeout and was killed")
            lost.extend(actor.env_ids)
        return lost

    def workers(self) -> list[tuple[tuple[int, ...], int | None]]:
        # An actor's process may be on another node: asking it would cost a round trip, so no pid.
        return [(tuple(actor.env_ids), None) for actor in self._actors]

    def interrupt(self) -> None:
        """From another thread, while a call waits on the actors: kill them, and nothing else (the
        waiting thread sees their deaths and does the bookkeeping; see Backend.interrupt)."""
        for actor in list(self._actors):
            self._ray.kill(actor.handle, no_restart=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not ray_cluster.connected():  # Ray shut down first: its actors went with it
            ray_cluster.release(self)
            return
        ray = self._ray
        # Started ones only: a call to one still waiting for resources would queue behind its
        # start, and the close would wait out its grace for nothing.
        live = [actor for actor in self._actors if actor.death is None and actor.started]
        # A graceful close first, so that actors stop their own worker processes.
        closing = [actor.handle.close.remote() for actor in live]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_GRACE_S)
        for actor in self._actors:
            try:
                ray.kill(actor.handle, no_restart=True)
            except Exception:  # already gone with its node
                pass
        self._pending.clear()
        ray_cluster.release(self)
