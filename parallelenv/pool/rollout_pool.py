"""RolloutPool: many VecWorkers, each in a process or a Ray actor with its own envs and policy copy.

The caller's side holds one table: per worker, the requests sent and not
yet answered, oldest first (each worker answers in order), and the batches
that arrived and no call has handed out yet. Everything else follows from
three events: a reply, a death, and a call that wants more.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from parallelenv.backends.env_sources import env_list, pickle_sources
from parallelenv.backends.partition import Groups
from parallelenv.backends.progress import StartProgress
from parallelenv.errors import ClosedError
from parallelenv.healing import DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW_S, WORKER_DIED, WORKER_HUNG, Healing
from parallelenv.pool.checks import check_arguments, check_count, make_fleet
from parallelenv.pool.errors import PoolWorkerError
from parallelenv.pool.messages import (
    Applied,
    Chunk,
    Collect,
    CollectEpisodes,
    Died,
    Failed,
    Request,
    Saved,
    Sent,
    SetWeights,
    Start,
    Started,
    UpdateEnvs,
    WorkerReply,
    WorkerSpec,
)
from parallelenv.pool.replacing import ReplacesWorkers
from parallelenv.pool.samples import Collected, LostWork, Samples
from parallelenv.pool.saving import SavesPool
from parallelenv.pool.timings import TimesPool, with_stats
from parallelenv.pool.weights import check_update, pickle_policy, state_arrays
from parallelenv.rollout.trajectories import Transitions
from parallelenv.serialised import close_at_exit
from parallelenv.state.capture import trusted_classes

POLL_S = 0.5  # how often a wait looks at the clock (call_timeout, start_timeout)


@dataclass
class _Slot:
    """One worker's place in the pool: whoever fills it now, and what it was asked."""

    index: int
    env_ids: tuple[int, ...]
    handle: Any
    sent: deque[Sent] = field(default_factory=deque)
    version: int = 0  # the policy version it last said it acts with
    restarts: int = 0
    started: bool = False
    env_updates: list[UpdateEnvs] = field(default_factory=list)  # replayed, in order, by a replacement
    delivered: bool = False  # a batch of it arrived
    resume_from: bytes | None = None  # snapshots=True: the collection after its last batch
    unsaved: str = "no batch collected yet"  # why resume_from is None


class RolloutPool(SavesPool, ReplacesWorkers, TimesPool):
    """Workers that each run a :class:`~parallelenv.rollout.VecWorker`, with garage's sampler calls.

    Args:
        envs: the envs of every worker: gym.Envs or (better) zero-argument factories,
            split into ``num_workers`` contiguous groups of near-equal size.
        policy: observations -> actions, e.g. a ``torch.nn.Module``; each worker gets a pickled copy.
        num_workers: how many workers.
        backend: ``"processes"`` (this machine) or ``"ray"`` (actors spread over the cluster's nodes).
        para_mode: the ParallelEnv backend inside each worker (``"dummy"``: one after another).
        mode: ``"sync"``: every worker collects its share and a call waits for all of them, exactly
            as the same VecWorkers run one by one; ``"first"``: workers collect chunks of
            ``chunk_steps`` steps, and a call returns once it has its steps, from whichever workers
            delivered them (a chunk still under way is handed out by the next call); ``"async"``:
            as ``"first"``, and workers go on collecting up to ``prefetch`` chunks ahead, with the
            weights they have, while the caller trains.
        chunk_steps: steps of every env of a worker per chunk (``"first"`` and ``"async"``).
        prefetch: chunks each worker has under way in ``"async"`` mode.
        seed: worker ``w``'s env ``i`` is seeded from ``(seed, w, i)``, as ``VecWorker(worker_number=w)``
            does; a replacement worker's from ``(seed, w, i, its restart count)``.
        max_episode_length, output: as for VecWorker.
        penv_options: keyword arguments of each worker's ParallelEnv (default ``asynchronous="restart"``).
        max_restarts, restart_window: the budget of replacements of dead workers (see ``failures``).
        call_timeout: seconds a worker may take on one request before it counts as hung, is killed and
            replaced (None: no limit; deaths are seen at once either way).
        start_timeout: seconds for the workers to build their envs.
        start_method: for ``"processes"``: ``"forkserver"`` (default), ``"spawn"`` or ``"fork"``.
        actor_options: for ``"ray"``: ``.options()`` of every actor (default ``num_cpus=1``, spread).
        snapshots: each batch comes with its worker's collection after it, and a worker lost is
            replaced by one that goes on from there: no episode in flight is cut, nothing is lost
            (for envs whose state can be taken, see ``parallelenv.check_state``).
        stats: the workers' ParallelEnvs measure, and :meth:`timings` sums their collections' policy,
            envs and transport time, and says which bounds them.
    """

    def __init__(
        self,
        envs: Sequence[Any],
        policy: Callable[[Any], Any],
        *,
        num_workers: int = 2,
        backend: str = "processes",
        para_mode: str = "dummy",
        mode: str = "sync",
        chunk_steps: int = 16,
        prefetch: int = 2,
        seed: int | None = None,
        max_episode_length: int | None = None,
        output: str = "numpy",
        penv_options: dict[str, Any] | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window: float = DEFAULT_RESTART_WINDOW_S,
        call_timeout: float | None = None,
        start_timeout: float = 120.0,
        start_method: str | None = None,
        actor_options: dict[str, Any] | None = None,
        snapshots: bool = False,
        stats: bool = False,
    ) -> None:
        self._closed = True  # until the workers exist, close() has nothing to do
        sources = env_list(envs)
        check_arguments(len(sources), policy, num_workers, {
            "backend": backend, "mode": mode, "output": output, "para_mode": para_mode, "seed": seed,
            "chunk_steps": chunk_steps, "prefetch": prefetch, "start_timeout": start_timeout,
            "call_timeout": call_timeout, "max_episode_length": max_episode_length,
        })
        self.num_workers, self.num_envs, self.mode = num_workers, len(sources), mode
        self.backend, self.seed = backend, seed
        self.chunk_steps, self.prefetch, self.call_timeout = int(chunk_steps), int(prefetch), call_timeout
        self._start_timeout = float(start_timeout)
        self._healing = Healing("restart", "raise", max_restarts, restart_window)
        self._snapshots, self._stats = bool(snapshots), bool(stats)
        groups = Groups(self.num_envs, num_workers).members
        self._workers_text = f"workers 0-{num_workers - 1}" if num_workers > 1 else "worker 0"
        payloads = pickle_sources(sources)
        self._template = policy
        self._policy_payload = pickle_policy(policy, self._workers_text)
        self._policy_version = self.version = 0
        self._weights: tuple[SetWeights, Any] | None = None  # the last update after the policy's, for replacements
        self._ready: list[tuple[int, Collected]] = []  # (call, batch) arrived and not yet handed out
        self._lost: list[LostWork] = []
        self._calls = 0
        self._fleet = make_fleet(backend, start_method, actor_options)
        self._spec = WorkerSpec(
            worker=0, env_ids=(), env_payloads=(), policy_payload=b"", policy_version=0, para_mode=para_mode,
            penv_options=with_stats(penv_options, stats),
            worker_options={"max_episode_length": max_episode_length, "output": output}, seed=seed,
            snapshots=trusted_classes() if snapshots else None,
            shared_weights=self._fleet.share_weights(state_arrays(policy)),
        )
        self._payloads = [tuple(payloads[i] for i in ids) for ids in groups]
        self._slots: list[_Slot] = []
        self._closed = False
        close_at_exit(self)
        try:
            for index, ids in enumerate(groups):
                self._slots.append(_Slot(index, tuple(ids), None))
                self._start(self._slots[-1])
            progress = StartProgress(len(self._slots), f"pool workers ({self._fleet.name})")
            while (started := sum(slot.started for slot in self._slots)) < len(self._slots):
                progress.show(started)
                self._pump_once()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ garage's sampler

    def obtain_samples(self, itr: int, num_samples: int, agent_update: Any = None,
                       env_update: Any = None) -> Samples:
        """At least ``num_samples`` transitions (env-steps), after applying the updates.

        Args:
            itr: the training iteration (garage's argument; not used).
            num_samples: env-steps wanted. In ``"sync"`` mode every worker steps each of
                its envs ``ceil(num_samples / num_envs)`` times; otherwise chunks arrive
                until there are enough.
            agent_update: None, or what :meth:`update_agent` takes.
            env_update: None, or what :meth:`update_env` takes.
        """
        check_count("num_samples", num_samples)
        self._update(agent_update, env_update)
        if self.mode == "sync":
            call = self._ask_every_worker(Collect(math.ceil(num_samples / self.num_envs)))
            return self._samples(self._take(call))
        target = self.prefetch if self.mode == "async" else 1
        while sum(part.env_steps for _, part in self._ready if isinstance(part.data, Transitions)) < num_samples:
            self._keep_busy(target)
            self._pump_once()
        if self.mode == "async":
            self._keep_busy(target)
        return self._samples(self._take(None))

    def obtain_exact_episodes(self, n_eps_per_worker: int, agent_update: Any = None,
                              env_update: Any = None) -> Samples:
        """Exactly ``n_eps_per_worker`` whole episodes from every worker, each from fresh episodes,
        by worker (the first to complete in each)."""
        check_count("n_eps_per_worker", n_eps_per_worker)
        self._update(agent_update, env_update)
        return self._samples(self._take(self._ask_every_worker(CollectEpisodes(n_eps_per_worker))))

    def update_agent(self, agent_update: Any, wait: bool = False) -> int:
        """Send new weights (or a new policy) to every worker, once; returns the new policy version.

        Args:
            agent_update: a state dict (a policy with ``load_state_dict``), parameters (a policy
                with ``set_param_values``), or a new policy (a callable). Checked against the
                pool's policy before anything is sent.
            wait: return only when every worker has loaded it.
        """
        self._check_open()
        update = check_update(self._template, agent_update, self._workers_text)
        self.version += 1
        if update.kind == "policy":
            self._template, self._policy_payload, self._policy_version = agent_update, update.value, self.version
        request, payload = self._fleet.publish(self.version, update)
        self._weights = None if update.kind == "policy" else (request, payload)
        for slot in self._slots:
            self._send(slot, request, payload)
        if wait:
            version = self.version
            self._pump(lambda: all(slot.version >= version for slot in self._slots))
        return self.version

    def update_env(self, env_update: Any) -> None:
        """Update envs, as ``VecWorker.update_env`` does: one ``{env index in the worker: update}``
        mapping for every worker, or a list of one mapping (or None) per worker."""
        self._check_open()
        updates = [env_update] * self.num_workers if isinstance(env_update, Mapping) else env_update
        if not isinstance(updates, Sequence) or len(updates) != self.num_workers:
            raise ValueError(f"env_update must be a mapping or a list of {self.num_workers} (one per worker)")
        for slot, update in zip(self._slots, updates, strict=True):
            if update is not None:
                slot.env_updates.append(UpdateEnvs(update))
                self._send(slot, slot.env_updates[-1])

    @property
    def failures(self) -> list[Any]:
        """Every worker death survived (:class:`~parallelenv.healing.SurvivedFailure`), oldest first."""
        return self._healing.failures

    def pids(self) -> list[int]:
        """The process of each worker (for Ray: of each actor, on its node)."""
        return [slot.handle.pid for slot in self._slots if getattr(slot.handle, "pid", None) is not None]

    def nodes(self) -> list[str]:
        """The Ray node of each worker ("" for processes)."""
        return [getattr(slot.handle, "node", "") for slot in self._slots]

    # ------------------------------------------------------------------ life

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """End every worker (their envs closed first); safe to call again."""
        if self._closed:
            return
        self._closed = True
        self._fleet.close()
        self._ready.clear()

    def _close_at_exit(self) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    # ------------------------------------------------------------------ requests and replies

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this RolloutPool is closed", what="RolloutPool")

    def _update(self, agent_update: Any, env_update: Any) -> None:
        self._check_open()
        if agent_update is not None:
            self.update_agent(agent_update)
        if env_update is not None:
            self.update_env(env_update)

    def _start(self, slot: _Slot) -> None:
        spec = replace(self._spec, worker=slot.index, env_ids=slot.env_ids, env_payloads=self._payloads[slot.index],
                       policy_payload=self._policy_payload, policy_version=self._policy_version,
                       seed=self._seeds(slot))
        slot.handle, slot.started, slot.version = self._fleet.start(spec), False, self._policy_version
        self._send(slot, Start())
        self._resume_replacement(slot)
        if self._weights is not None:  # a replacement loads the weights sent since the policy
            self._send(slot, *self._weights)
        for update in slot.env_updates:  # and has the envs its predecessor had
            self._send(slot, update)

    def _seeds(self, slot: _Slot) -> Any:
        # With snapshots, a worker lost before its first batch is replaced by its twin: nothing was handed out.
        if slot.restarts == 0 or self.seed is None or (self._snapshots and not slot.delivered):
            return self.seed
        return [int(np.random.SeedSequence(self.seed, spawn_key=(slot.index, i, slot.restarts))
                    .generate_state(1, np.uint64)[0]) for i in range(len(slot.env_ids))]

    def _send(self, slot: _Slot, request: Request, payload: Any = None, call: int = -1) -> None:
        self._fleet.send(slot.handle, request, payload)
        slot.sent.append(Sent(request, self.version, call=call))

    def _ask_every_worker(self, request: Request) -> int:
        self._calls += 1
        for slot in self._slots:
            self._send(slot, request, call=self._calls)
        call = self._calls
        self._pump(lambda: sum(1 for c, _ in self._ready if c == call) == self.num_workers)
        return call

    def _keep_busy(self, target: int) -> None:
        for slot in self._slots:
            while sum(isinstance(s.request, Collect) for s in slot.sent) < target:
                self._send(slot, Collect(self.chunk_steps))

    def _take(self, call: int | None) -> list[Collected]:
        """The arrived batches of ``call`` (None: every arrived batch of transitions), by arrival."""
        def wanted(c: int, part: Collected) -> bool:
            return c == call if call is not None else isinstance(part.data, Transitions)

        parts = [part for c, part in self._ready if wanted(c, part)]
        self._ready = [(c, part) for c, part in self._ready if not wanted(c, part)]
        return sorted(parts, key=lambda part: part.worker) if call is not None else parts

    def _samples(self, parts: list[Collected]) -> Samples:
        lost, self._lost = self._lost, []
        return Samples(tuple(parts), tuple(lost))

    def _pump(self, done: Callable[[], bool]) -> None:
        while not done():
            self._pump_once()

    def _pump_once(self) -> None:
        by_handle = {id(slot.handle): slot for slot in self._slots}
        starting = any(not slot.started for slot in self._slots)
        timeout = POLL_S if starting or self.call_timeout is not None else None
        for handle, reply in self._fleet.wait([slot.handle for slot in self._slots], timeout):
            slot = by_handle.get(id(handle))
            if slot is not None and slot.handle is handle:  # not a worker replaced in this same wait
                self._on_reply(slot, reply)
        now = time.monotonic()
        for slot in self._slots:  # a replacement Ray cannot place (no resources left) must not wait forever
            if not slot.started and slot.sent and now - slot.sent[0].when > self._start_timeout:
                why = self._fleet.not_started(self._start_timeout)  # before the close: it may read the cluster
                self.close()
                raise PoolWorkerError(slot.index, slot.env_ids, "building its envs and policy", "TimeoutError", why)
        if self.call_timeout is not None:
            for slot in self._slots:
                if slot.sent and slot.started and now - slot.sent[0].when > self.call_timeout:
                    self._replace(slot, f"it did not answer within call_timeout={self.call_timeout:g} s",
                                  WORKER_HUNG)

    def _on_reply(self, slot: _Slot, reply: WorkerReply) -> None:
        if isinstance(reply, Died):
            self._replace(slot, reply.reason, WORKER_DIED)
            return
        sent = slot.sent.popleft()
        if slot.sent:
            slot.sent[0].when = time.monotonic()  # its clock starts when the worker can begin it
        if isinstance(reply, Failed):
            self.close()
            raise PoolWorkerError(slot.index, slot.env_ids, reply.what, reply.exc_type, reply.message,
                                  reply.traceback)
        if isinstance(reply, Started):
            slot.started = True
            slot.handle.pid, slot.handle.node = reply.pid, reply.node
        elif isinstance(reply, Applied):
            slot.version = reply.version
        elif isinstance(reply, Chunk):
            slot.version = reply.policy_version
            self._keep_snapshot(slot, reply)
            self._count_times(reply.timings)
            self._ready.append((sent.call, Collected(slot.index, reply.policy_version, slot.env_ids, reply.data)))
        elif isinstance(reply, Saved):
            self._ready.append((sent.call, Collected(slot.index, slot.version, slot.env_ids, reply.data)))
