"""The parent's handle on a worker process: starting it, its first reports, and its death.

A worker starts with its group's pickled env factories and its end of the
countdown (see :mod:`~parallelenv.backends.subproc.worker`); until it has
attached to the shared buffers it reports with plain pickles, which the
parent awaits here with the start timeout, beside the process's sentinel.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from parallelenv.backends.base import BackendConfig
from parallelenv.backends.subproc.countdown import WorkerCountdown
from parallelenv.backends.subproc.spawning import main_module_not_rerun, single_threaded_numerics
from parallelenv.backends.subproc.worker import Ready, worker_main
from parallelenv.calls import Failure
from parallelenv.errors import WorkerDiedError


@dataclass
class Worker:
    process: Any
    conn: Connection
    env_ids: list[int]
    index: int  # its group's, and its place in the countdown
    death: WorkerDiedError | None = None
    obs_slot: int = 0  # the buffers' obs slot the worker writes into (see Buffers.use_obs_slot)
    knows_info_columns: bool = True  # else its next call tells it their layout
    told_slots: Any = None  # what it knows of the state slots (see StateSlots.tell)

    def __post_init__(self) -> None:
        self.group_ids = tuple(self.env_ids)
        self.fd = self.conn.fileno()
        self.pid = self.process.pid  # kept: the process object is closed with the backend

    def release(self) -> None:
        """Close the pipe and the process object (its sentinel): the process has ended."""
        self.conn.close()
        with contextlib.suppress(ValueError):  # still running: it is only killed, not yet reaped
            self.process.close()

    def died(self, reason: str | None = None) -> WorkerDiedError:
        if self.death is None:
            if reason is None:
                self.process.join(timeout=1.0)
                reason = exit_reason(self.process.exitcode)
            self.death = WorkerDiedError(self.env_ids, reason)
        return self.death


def exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "its pipe closed while the process still runs"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def start_worker(ctx: Any, index: int, env_ids: list[int], payloads: list[bytes], config: BackendConfig,
                 linger_s: float, countdown: WorkerCountdown) -> Worker:
    """Start the worker of group ``index`` hosting ``env_ids``, built from their ``payloads``."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    group_payloads = [payloads[i] for i in env_ids]
    process = ctx.Process(
        target=worker_main,
        args=(
            child_conn, group_payloads, env_ids[0], config.policy.restarts_finished_envs, config.no_warning,
            linger_s, countdown, config.times_envs,
        ),
        name=f"parallelenv-worker-{env_ids[0]}-{env_ids[-1]}",
        daemon=True,
    )
    with main_module_not_rerun(), single_threaded_numerics():
        process.start()
    child_conn.close()
    return Worker(process, parent_conn, env_ids, index)


def await_report(worker: Worker, deadline: float | None, doing: str) -> Ready:
    """The worker's next report (its spaces, or that it attached), by ``deadline``; its failure raised."""
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready = wait([worker.conn, worker.process.sentinel], remaining)
    if not ready:
        raise worker.died(f"it did not {doing} within the start timeout")
    try:
        message = pickle.loads(worker.conn.recv_bytes())
    except (EOFError, OSError):
        raise worker.died() from None
    if isinstance(message, Failure):
        message.raise_error()
    return message
