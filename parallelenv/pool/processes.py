"""Pool workers as processes on this machine: each a :class:`~parallelenv.pool.host.WorkerHost` behind a pipe.

They start as the subprocess backend's workers do (forkserver, one BLAS
thread each, the caller's script not re-run: :mod:`parallelenv.backends.subproc.spawning`)
and die with the caller (:mod:`parallelenv.backends.subproc.lifeline`). They are
not daemonic, unlike the subprocess backend's workers, because a pool
worker may run ``para_mode="subproc"`` inside it, and a daemonic process may
not start processes; the lifeline and :meth:`ProcessFleet.close` end them instead.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any

from parallelenv.backends import pickling
from parallelenv.backends.subproc.backend import _exit_reason  # one wording of an exit, the backends'
from parallelenv.backends.subproc.lifeline import tie_to_parent
from parallelenv.backends.subproc.spawning import main_module_not_rerun, single_threaded_numerics, start_context
from parallelenv.pool.host import WorkerHost
from parallelenv.pool.messages import Close, Died, SetWeights, WorkerReply, WorkerSpec
from parallelenv.pool.weights import SharedWeights, Update

CLOSE_GRACE_S = 5.0


@dataclass(eq=False)  # workers are told apart by identity
class ProcessWorker:
    process: Any
    conn: Connection
    died: str | None = None
    pid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pid = self.process.pid


class ProcessFleet:
    """Starts, messages and watches worker processes; state dicts travel through :class:`SharedWeights`."""

    name = "processes"

    def __init__(self, start_method: str | None = None) -> None:
        self._ctx = start_context(start_method)
        self._shared: SharedWeights | None = None
        self._workers: list[ProcessWorker] = []
        # Workers attach to the weights' shared memory, which registers it with a
        # resource tracker: ours, started before them, or each starts its own,
        # which removes the block when that worker exits.
        resource_tracker.ensure_running()

    def share_weights(self, arrays: dict[str, Any] | None) -> Any:
        """Make the shared block for state dicts shaped as ``arrays``; what a spec carries to attach to it."""
        if arrays is None:
            return None
        self._shared = SharedWeights.create(arrays)
        return self._shared.handle

    def start(self, spec: WorkerSpec) -> ProcessWorker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_main, args=(child_conn, pickling.dumps(spec)),
                                    name=f"parallelenv-pool-worker-{spec.worker}", daemon=False)
        with main_module_not_rerun(), single_threaded_numerics():
            process.start()
        child_conn.close()
        self._workers.append(ProcessWorker(process, parent_conn))
        return self._workers[-1]

    def not_started(self, timeout: float) -> str:
        return f"it did not start within start_timeout={timeout:g} s (its envs and policy take longer to build?)"

    def publish(self, version: int, update: Update) -> tuple[SetWeights, Any]:
        """Once per update: the request each worker gets, and its payload (none: it travels in the request)."""
        if update.kind == "state" and self._shared is not None:
            self._shared.write(version, update.value)
            return SetWeights(version), None
        return SetWeights(version, inline=update.value, new_policy=update.kind == "policy"), None

    def send(self, worker: ProcessWorker, request: Any, payload: Any = None) -> None:
        try:
            worker.conn.send_bytes(pickling.dumps(request))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            pass  # it died: its sentinel says so to the next wait

    def wait(self, workers: list[ProcessWorker], timeout: float | None) -> list[tuple[ProcessWorker, WorkerReply]]:
        """The replies (or deaths) of ``workers`` that are in, waiting up to ``timeout`` for a first one."""
        by_handle: dict[Any, ProcessWorker] = {}
        for worker in workers:
            by_handle[worker.conn] = worker
            by_handle[worker.process.sentinel] = worker
        ready = wait(list(by_handle), timeout)
        events: list[tuple[ProcessWorker, WorkerReply]] = []
        for worker in dict.fromkeys(by_handle[handle] for handle in ready):
            events.extend((worker, reply) for reply in self._read(worker))
        return events

    def _read(self, worker: ProcessWorker) -> list[WorkerReply]:
        """Every reply waiting in the pipe; a death last, once the pipe is drained."""
        replies: list[WorkerReply] = []
        try:
            while worker.conn.poll():
                replies.append(pickle.loads(worker.conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        if not worker.process.is_alive():
            worker.process.join(timeout=1.0)
            worker.died = _exit_reason(worker.process.exitcode)
            replies.append(Died(f"its process {worker.pid}: {worker.died}"))
        return replies

    def kill(self, worker: ProcessWorker) -> None:
        with contextlib.suppress(ValueError):  # ValueError: closed already
            worker.process.kill()
            worker.process.join(timeout=CLOSE_GRACE_S)
            worker.process.close()
        worker.conn.close()
        if worker in self._workers:
            self._workers.remove(worker)

    def close(self) -> None:
        """Ask each to close, give them a grace period together, then kill what is left."""
        workers, self._workers = self._workers, []
        for worker in workers:
            self.send(worker, Close())
        deadline = time.monotonic() + CLOSE_GRACE_S
        closing = [worker for worker in workers if worker.died is None]
        while closing and time.monotonic() < deadline:
            # Replies nobody will read are read all the same: a worker blocked writing a
            # batch into a full pipe would never reach the Close behind it.
            for worker in {w for w, _ in self.wait(closing, deadline - time.monotonic())}:
                if worker.died is not None:
                    closing.remove(worker)
        for worker in workers:
            self.kill(worker)
        if self._shared is not None:
            self._shared.close()
            self._shared = None


def _main(conn: Connection, spec_payload: bytes) -> None:
    """A worker process: serve requests until told to close or the caller is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the caller decides
    tie_to_parent(conn)
    host = WorkerHost(pickle.loads(spec_payload))
    try:
        while True:
            request = pickle.loads(conn.recv_bytes())
            conn.send_bytes(pickle.dumps(host.handle(request), protocol=pickle.HIGHEST_PROTOCOL))
            if isinstance(request, Close):
                return
    except (EOFError, OSError):
        pass  # the caller is gone
    finally:
        host.close()
