"""The error a pool raises for what went wrong inside one of its workers."""

from __future__ import annotations

from collections.abc import Sequence

from parallelenv.errors import ParallelEnvError, RemoteTraceback, _ranges


class PoolWorkerError(ParallelEnvError):
    """A worker of a :class:`~parallelenv.pool.RolloutPool` raised: its envs failed to build, an env
    raised, or its policy could not load an update.

    The pool is closed when it raises this: nothing is left running.

    Attributes:
        worker: the worker's number.
        env_ids: the pool's numbers of its envs.
        what: what it was doing (``"building its envs and policy"``, ``"collecting 8 steps"``, ...).
        exc_type, message: the original exception's type and message.
        remote_traceback: the traceback text, as formatted in the worker (also chained as the cause).
    """

    def __init__(self, worker: int, env_ids: Sequence[int], what: str, exc_type: str, message: str,
                 remote_traceback: str = "") -> None:
        self.worker = worker
        self.env_ids = [int(i) for i in env_ids]
        self.what = what
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(f"worker {worker} (envs {_ranges(self.env_ids)}) raised {exc_type} while {what}: {message}")
        if remote_traceback:
            self.__cause__ = RemoteTraceback(remote_traceback)
