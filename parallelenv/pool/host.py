"""What runs inside one worker of a pool, a process or a Ray actor alike: a VecWorker answering requests.

It imports nothing of Ray or of processes: :mod:`parallelenv.pool.processes`
runs it behind a pipe, :mod:`parallelenv.pool.actors` as a Ray actor.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
from functools import singledispatchmethod
from typing import Any

import cloudpickle

from parallelenv.arrays import tree_map
from parallelenv.pool.messages import (
    Applied,
    Chunk,
    Close,
    Collect,
    CollectEpisodes,
    Failed,
    ResumeCollection,
    SaveCollection,
    Saved,
    SetWeights,
    Start,
    Started,
    UpdateEnvs,
    WorkerReply,
    WorkerSpec,
    describe,
)
from parallelenv.pool.weights import SharedWeights, Update, load
from parallelenv.rollout.trajectories import EpisodeBatch


class WorkerHost:
    """One worker: its envs in a ParallelEnv, a VecWorker over them, and its copy of the policy."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.version = spec.policy_version
        self._vec: Any = None
        self._begun = False  # the VecWorker's envs were reset with their seeds
        self._shared: SharedWeights | None = None

    def handle(self, request: Any, payload: Any = None) -> WorkerReply:
        """Serve one request; an exception comes back as a :class:`Failed`, never raised.

        ``payload`` is the request's bulky part where it travels beside the
        request (a Ray object-store reference, resolved by Ray before the call).
        """
        try:
            return self._serve(request, payload)
        except Exception as exc:
            kind = type(exc)
            return Failed(describe(request), f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins."),
                          str(exc), "".join(traceback.format_exception(exc)))

    @singledispatchmethod
    def _serve(self, request: Any, payload: Any) -> WorkerReply:
        raise TypeError(f"a pool worker cannot serve a {type(request).__name__}")

    @_serve.register
    def _start(self, request: Start, payload: Any) -> WorkerReply:
        from parallelenv.parallel_env import ParallelEnv
        from parallelenv.rollout import VecWorker

        spec = self.spec
        sources = [cloudpickle.loads(p) for p in spec.env_payloads]
        policy = cloudpickle.loads(spec.policy_payload)
        penv = ParallelEnv(sources, para_mode=spec.para_mode, **spec.penv_options)
        try:
            self._vec = VecWorker(penv, policy, seed=spec.seed, worker_number=spec.worker, **spec.worker_options)
        except BaseException:
            penv.close()
            raise
        if spec.shared_weights is not None:
            self._shared = SharedWeights.attach(spec.shared_weights)
        # The envs, the policy and the imports live as long as the worker: keep the collector
        # from re-scanning them during collection, as the subprocess backend's workers do.
        gc.freeze()
        return Started(os.getpid(), _ray_node())

    @_serve.register
    def _set_weights(self, request: SetWeights, payload: Any) -> WorkerReply:
        value = request.inline if payload is None else payload
        if value is not None:
            kind = "policy" if request.new_policy else "state" if isinstance(value, dict) else "params"
            load(self._vec, Update(kind, value))
            self.version = request.version
        elif self._shared is not None and self._shared.version > self.version:
            # The block holds the latest version, maybe newer than this request's: the
            # requests of the versions in between then load nothing more.
            version, arrays = self._shared.read()
            load(self._vec, Update("state", arrays))
            self.version = version
        return Applied(self.version)

    @_serve.register
    def _update_envs(self, request: UpdateEnvs, payload: Any) -> WorkerReply:
        self._vec.update_env(request.updates)
        return Applied(self.version)

    @_serve.register
    def _collect(self, request: Collect, payload: Any) -> WorkerReply:
        self._begun = True
        return Chunk(self.version, self._vec.collect(request.num_steps), self._snapshot(), self._timings())

    @_serve.register
    def _collect_episodes(self, request: CollectEpisodes, payload: Any) -> WorkerReply:
        vec = self._vec
        if self._begun:
            vec.start_episode()
        else:  # the first start gives the envs their seeds, as VecWorker.rollout does
            vec.worker_init()
            self._begun = True
        vec.collect_episode()  # episodes completed before this request are not its own
        episodes: list[Any] = []
        count = 0
        while count < request.num_episodes:
            if vec.step_episode():
                batch = vec.collect_episode()
                episodes.append(batch)
                count += len(batch)
        return Chunk(self.version, _first_episodes(episodes, request.num_episodes), self._snapshot(), self._timings())

    def _timings(self) -> Any:
        """With the pool's stats on, the VecWorker's collection times since its last batch; else None."""
        return self._vec.timings(recent=True) if self.spec.penv_options.get("stats") else None

    def _snapshot(self) -> bytes | str | None:
        """With the pool's snapshots on, the collection as it stands now, for a replacement; else None."""
        if self.spec.snapshots is None:
            return None
        from parallelenv.errors import EnvError
        from parallelenv.state.capture import StateError, trust

        for env_class in self.spec.snapshots:
            trust(env_class)
        try:
            return cloudpickle.dumps(self._vec.saved())
        except (StateError, EnvError) as refused:  # an env's state, taken where it runs, raises as its error
            return str(refused)

    @_serve.register
    def _save(self, request: SaveCollection, payload: Any) -> WorkerReply:
        from parallelenv.state.capture import trust

        for env_class in request.trusted:
            trust(env_class)
        return Saved(cloudpickle.dumps(self._vec.saved()))

    @_serve.register
    def _resume(self, request: ResumeCollection, payload: Any) -> WorkerReply:
        from parallelenv.rollout import VecWorker

        spec = self.spec
        sources = [cloudpickle.loads(p) for p in spec.env_payloads]
        resumed = VecWorker.resumed(cloudpickle.loads(request.saved), self._vec.policy, sources, spec.para_mode,
                                    **spec.penv_options)
        self._vec.shutdown()
        self._vec, self._begun = resumed, True
        return Applied(self.version)

    @_serve.register
    def _close(self, request: Close, payload: Any) -> WorkerReply:
        self.close()
        return Applied(self.version)

    def close(self) -> None:
        if self._vec is not None:
            self._vec.shutdown()
            self._vec = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None


def _first_episodes(batches: list[Any], count: int) -> EpisodeBatch:
    """The first ``count`` episodes of ``batches``, in the order they completed."""
    batch = EpisodeBatch.concatenate(batches)
    if len(batch) == count:
        return batch
    rows = int(batch.starts[count])
    return EpisodeBatch(
        env_ids=batch.env_ids[:count],
        lengths=batch.lengths[:count],
        returns=batch.returns[:count],
        observations=tree_map(lambda x: x[:rows], batch.observations),
        actions=tree_map(lambda x: x[:rows], batch.actions),
        rewards=batch.rewards[:rows],
        terminations=batch.terminations[:rows],
        truncations=batch.truncations[:rows],
        infos=batch.infos[:rows],
        last_observations=tree_map(lambda x: x[:count], batch.last_observations),
    )


def _ray_node() -> str:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return ray.get_runtime_context().get_node_id()
