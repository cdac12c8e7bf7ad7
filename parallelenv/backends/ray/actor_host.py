"""A group of envs behind a local backend, answering calls in global env ids.

This is what a Ray actor runs: for ``para_mode="ray"`` a dummy backend over
one env, for ``"ray-subproc"`` a subproc backend over a group of envs in the
actor's own worker processes. The host numbers its envs from 0, translates
calls and replies at its boundary, and returns a call's result rows with its
reply, since an actor on another machine cannot write into the caller's
buffers. It imports nothing of Ray: the Ray backend wraps it.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from parallelenv.backends.base import Backend, BackendConfig
from parallelenv.backends.dummy import DummyBackend
from parallelenv.backends.spaces import SpaceMismatch
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.backend import SubprocBackend
from parallelenv.batching import Batched, put, take
from parallelenv.calls import NO_RESULT_CALLS, Call, Failure, Replay, Reply, Step, shifted
from parallelenv.errors import EnvError, WorkerDiedError

LOCAL_BACKENDS: dict[str, type] = {"dummy": DummyBackend, "subproc": SubprocBackend}


@dataclass(frozen=True)
class Lost:
    """Some of the group's envs died with their worker process inside the host."""

    env_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Rows:
    """A step's or reset's results for the envs of the reply, in its order (parts of no fixed shape included)."""

    obs: Batched
    reward: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    # Under "restart" (see Buffers.ended): which envs' episodes ended, and their last obs, in that
    # mask's order; None when none did.
    ended: np.ndarray | None = None
    ended_obs: np.ndarray | None = None


class GroupHost:
    """Envs ``first_id`` onwards, run by a local backend of kind ``local_mode``."""

    def __init__(self, payloads: list[bytes], first_id: int, config: BackendConfig, local_mode: str,
                 local_options: dict[str, Any]) -> None:
        self._payloads = payloads
        self._first_id = first_id
        # Failures are survived by the caller's backend, which replaces a whole
        # actor and sends the sources of envs to rebuild: the local backend
        # here only runs the calls, as without healing. Its results are copied into the replies.
        self._config = dataclasses.replace(config, restarts_workers=False, rebuilds_envs=False, copy=False)
        self._local_mode = local_mode
        self._local_options = local_options
        self._backend: Backend | None = None

    def start(self) -> Failure | SpaceMismatch | tuple[Any, Any, str]:
        """Build the envs; their spaces and this host's Ray node, or what went wrong: the Failure of the
        first env that failed, or the envs whose spaces differ."""
        try:
            sources = [cloudpickle.loads(payload) for payload in self._payloads]
            options = dict(self._local_options)
            if "num_workers" in options:
                options["num_workers"] = min(options["num_workers"], len(sources))
            self._backend = LOCAL_BACKENDS[self._local_mode](sources, self._config, **options)
        except SpaceMismatch as mismatch:
            return mismatch.shifted(self._first_id)
        except EnvError as error:
            return Failure(error.env_index + self._first_id, error.method, error.exc_type, error.message,
                           error.remote_traceback)
        except Exception as exc:  # unpicklable payload, mismatched spaces, bad options
            return Failure.from_exception(self._first_id, "make", exc)
        return self._backend.single_observation_space, self._backend.single_action_space, self.node()

    def node(self) -> str:
        """The id of the Ray node this host runs on."""
        import ray  # only ever called inside a Ray actor

        return ray.get_runtime_context().get_node_id()

    def pids(self) -> list[int]:
        """This process and the worker processes under it."""
        workers = self._backend.pids() if self._backend is not None else []
        return [os.getpid(), *workers]

    def env_pids(self) -> list[int]:
        """Per env of this host, the process that runs it: this one, or a worker process under it."""
        assert self._backend is not None, "start() first"
        return self._backend.env_pids()

    def run_encoded(self, message: bytes) -> bytes:
        """:meth:`run` over pickles: Ray passes bytes through far cheaper than it pickles objects itself."""
        call, actions = pickle.loads(message)
        return wire.encode(self.run(call, actions))

    def run(self, call: Call, actions: Batched | None) -> tuple[Reply | Lost, Rows | None]:
        """Run ``call`` (global ids) to completion; the reply and, for step and reset, the result rows."""
        assert self._backend is not None, "start() first"
        backend = self._backend
        local = shifted(call, -self._first_id)
        if type(local) is Step and not local.awaited:  # this host waits for all of it (_collect_all)
            local = dataclasses.replace(local, awaited=True)
        rows = np.array(local.env_ids)
        if actions is not None:
            put(backend.buffers.actions, rows, actions)
        try:
            backend.dispatch(local)
            replies = _collect_all(backend, len(rows))
        except WorkerDiedError as died:
            return Lost(tuple(i + self._first_id for i in died.env_indices), died.reason), None
        reply = _merged(local, replies)
        result = None
        if reply.call_type not in NO_RESULT_CALLS:
            result = _rows(backend, rows, with_step=reply.call_type in (Step, Replay))
        columns = backend.buffers.info_columns
        if type(local) in (Step, Replay) and columns is not None and columns.columns:
            # The local workers' numeric infos, in their columns here: they travel as one vector info
            # over the call's envs, beside the per-env infos of the reply (see results.merge_batched).
            reply = dataclasses.replace(reply, info=columns.vector(rows) or None, info_kinds=columns.kinds)
        return shifted(reply, self._first_id), result

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def _collect_all(backend: Backend, num_envs: int) -> list[Reply]:
    """Every reply to the call just dispatched (the caller's InFlight kills this actor if it hangs)."""
    replies: list[Reply] = []
    answered = 0
    while answered < num_envs:
        for reply in backend.collect(None):
            replies.append(reply)
            answered += len(reply.env_ids)
    return replies


def _merged(call: Call, replies: list[Reply]) -> Reply:
    """One reply for the whole call out of the local backend's per-worker replies.

    Every worker's reply counts, failures included: each names envs that
    the caller waits on.
    """
    if len(replies) == 1:
        return replies[0]
    values: dict[int, Any] = {}
    for reply in replies:
        values.update(reply.values)
    failures = tuple(failure for reply in replies for failure in reply.failures)
    snapshot = type(call) is Step and call.snapshot is not None
    states = {i: s for reply in replies for i, s in (reply.states or {}).items()} if snapshot else None
    return Reply(replies[0].call_type, call.env_ids, values, failures, states=states)


def _rows(backend: Backend, rows: np.ndarray, with_step: bool) -> Rows:
    buffers = backend.buffers
    if not with_step:
        return Rows(take(buffers.obs, rows))
    ended = ended_obs = None
    if buffers.ended is not None and np.count_nonzero(buffers.ended[rows]):
        ended = buffers.ended[rows]
        ended_obs = buffers.ended_obs[rows[ended]]
    return Rows(take(buffers.obs, rows), buffers.reward[rows], buffers.terminated[rows], buffers.truncated[rows],
                ended, ended_obs)
