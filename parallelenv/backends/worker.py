"""The loop of a worker process hosting a group of envs.

The parent starts the process with the group's pickled env factories; the
worker builds its envs, reports their spaces, attaches to the shared buffers
and then answers one call at a time until it is told to close or its pipe
closes (the parent is gone). This module is preloaded by the forkserver, so
a new worker starts with numpy and gymnasium already imported.
"""

from __future__ import annotations

import pickle
import signal
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
from gymnasium import spaces

from parallelenv.backends.env_host import EnvGroup, make_envs
from parallelenv.backends.shm import SharedBuffers
from parallelenv.calls import Failure


@dataclass(frozen=True)
class Ready:
    spaces: list[tuple[spaces.Space, spaces.Space]]  # per env of the group


@dataclass(frozen=True)
class Attach:
    segment_name: str
    observation_space: spaces.Space
    action_space: spaces.Space
    num_envs: int


@dataclass(frozen=True)
class Close:
    pass


CLOSE = Close()


def worker_main(conn: Connection, payloads: list[bytes], first_id: int, restart: bool, no_warning: bool) -> None:
    """Entry point of a worker process."""
    # Ctrl-C reaches the whole process group; the parent decides, and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if no_warning:
        warnings.simplefilter("ignore")
    group = _start(conn, payloads, first_id, restart)
    if group is None:
        return
    shared = None
    try:
        attach = conn.recv()
        if isinstance(attach, Close):
            return
        shared = SharedBuffers.attach(attach.segment_name, attach.observation_space, attach.action_space, attach.num_envs)
        group.attach(shared.buffers)
        conn.send(Ready([]))
        _serve(conn, group)
    except (EOFError, OSError):
        pass  # the parent is gone: nobody is left to answer
    finally:
        group.close()
        del group
        if shared is not None:
            shared.release()


def _start(conn: Connection, payloads: list[bytes], first_id: int, restart: bool) -> EnvGroup | None:
    """Build the envs and report their spaces, or report why not."""
    sources = []
    for offset, payload in enumerate(payloads):
        try:
            sources.append(cloudpickle.loads(payload))
        except Exception as exc:
            conn.send(Failure.from_exception(None, first_id + offset, "unpickle", exc))
            return None
    envs = make_envs(sources, first_id)
    if isinstance(envs, Failure):
        conn.send(envs)
        return None
    group = EnvGroup(envs, first_id, restart)
    try:
        conn.send(Ready(group.spaces()))
    except Exception as exc:  # unpicklable spaces
        group.close()
        conn.send(Failure.from_exception(None, first_id, "make", exc))
        return None
    return group


def _serve(conn: Connection, group: EnvGroup) -> None:
    recv, send, run = conn.recv, conn.send, group.run
    while True:
        call = recv()
        if isinstance(call, Close):
            return
        reply = run(call)
        try:
            send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            send(_unpicklable_reply(call, exc))


def _unpicklable_reply(call: Any, exc: Exception) -> Failure:
    failure = Failure.from_exception(call, call.env_ids[0], type(call).__name__.lower(), exc)
    message = f"its result cannot be sent back from the worker process: {failure.message}"
    return Failure(failure.call_type, failure.env_ids, failure.env_index, failure.method, failure.exc_type, message, failure.traceback)
