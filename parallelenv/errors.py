"""The exceptions parallelenv raises, all under :class:`ParallelEnvError`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ParallelEnvError(Exception):
    """Base class of every error raised by parallelenv itself."""


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised in another process.

    It is chained as the ``__cause__`` of :class:`EnvError`, so the caller's
    traceback print-out shows where in the env the error happened.
    """

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return "\n\n" + self.traceback_text


class EnvError(ParallelEnvError):
    """An env raised an exception while running one of its methods.

    Attributes:
        env_index: index of the env in the ParallelEnv.
        method: the env method that raised (``"step"``, ``"reset"``, ...).
        exc_type: the qualified name of the original exception type.
        message: the original exception's message.
        remote_traceback: the traceback text, as formatted where the env runs.
        failed_env_ids: every env that raised in the same call (this one first).
        results: what the other envs of the call answered, since they ran
            all the same: for ``step``, ``recv`` and ``reset`` their results
            in the call's ``align`` shape, with ``info["env_id"]`` naming the
            envs (None when no other env answered); for the other calls a
            dict from env index to value.
    """

    def __init__(
        self, env_index: int, method: str, exc_type: str, message: str, remote_traceback: str
    ) -> None:
        super().__init__(f"env {env_index} raised {exc_type} in {method}(): {message}")
        self.env_index = env_index
        self.method = method
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.failed_env_ids = [env_index]
        self.results: Any = None


class WorkerDiedError(ParallelEnvError):
    """A worker hosting envs died, or stopped answering and was killed.

    The ParallelEnv can still be closed; every other call raises this error
    again, since the envs it hosted are gone.

    Attributes:
        env_indices: the envs the worker hosted.
        reason: what was seen (exit code, signal, lost node, ...).
    """

    def __init__(self, env_indices: Sequence[int], reason: str) -> None:
        self.env_indices = [int(i) for i in env_indices]
        self.reason = reason
        super().__init__(f"the worker hosting envs {_ranges(self.env_indices)} died: {reason}")


class WorkerTimeoutError(WorkerDiedError):
    """A worker did not answer a call within ``call_timeout`` seconds and was killed."""


class ClosedError(ParallelEnvError):
    """A method was called on a ParallelEnv after ``close()``."""


class AlreadyPendingError(ParallelEnvError):
    """``send``/``step``/``reset`` named envs whose previous call is not received yet."""


class NoPendingCallError(ParallelEnvError):
    """``recv`` was called with no call pending."""


def _ranges(indices: Sequence[int]) -> str:
    """Render [0, 1, 2, 5] as '[0-2, 5]' so a message about 1000 envs stays short."""
    if not indices:
        return "[]"
    parts = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return "[" + ", ".join(parts) + "]"
