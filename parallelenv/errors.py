"""The exceptions parallelenv raises, all under :class:`ParallelEnvError`.

Where Gymnasium's vector envs raise an error of their own for the same
misuse, ours is also an instance of Gymnasium's (``ClosedError`` is a
``gymnasium.error.ClosedEnvironmentError``), and an :class:`EnvError` for a
built-in exception is also an instance of that exception's type, as
Gymnasium re-raises an env's exception as its own type: ``except`` clauses
written for Gymnasium's vector envs catch ours.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError


class PicklesWhole:
    """For exception classes: pickles with all the fields of the instance (set in ``__init__`` and after).

    So that an error raised inside a Ray actor, a pool worker or a framework's
    runner reaches the caller whole. Every error of parallelenv has it.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from args and the instance dict, not by calling __init__ again: a subclass's
        # __init__ takes its fields (WorkerDiedError's env_indices and reason), not the message
        # that Exception's own pickling would pass it.
        assert isinstance(self, BaseException)
        cause = self.__cause__ if isinstance(self.__cause__, RemoteTraceback) else None
        return _rebuilt, (type(self), self.args, self.__dict__, cause)


class ParallelEnvError(PicklesWhole, Exception):
    """Base class of every error raised by parallelenv itself; each pickles with all its fields."""


class SharedEnvError(ParallelEnvError, ValueError):
    """One env instance was given as two entries of ``envs`` (also under other wrappers).

    A check of parallelenv's own, made where the caller gave the envs: no env
    raised it. It is a ``ValueError``, as SB3's ``DummyVecEnv`` refuses the same.
    """


class ParallelEnvWarning(UserWarning):
    """Base class of every warning parallelenv gives itself (not those raised inside envs)."""


class AllEnvsFinishedWarning(ParallelEnvWarning):
    """A step under ``asynchronous=None`` found every env finished: it returns None results only.

    Given once each time the envs are stepped past the end of their episodes:
    a ``reset()`` that starts them again arms it again. Silence it with
    ``warnings.filterwarnings("ignore", category=parallelenv.AllEnvsFinishedWarning)``
    where stepping past the end is meant.
    """


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

    When the env raised one of the built-in types of :data:`BUILT_IN_KINDS`
    (``ValueError``, ``KeyError``, ...), the error is an instance of a
    subclass that is also of that type (:class:`EnvValueError`, ...), so that
    ``except ValueError`` written around a Gymnasium or SB3 vector env, which
    re-raise the env's own exception, still catches it.

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

    Example:
        >>> from parallelenv.errors import EnvError
        >>> error = EnvError.of(3, "step", "ValueError", "bad action", "Traceback ...")
        >>> isinstance(error, ValueError), type(error).__name__
        (True, 'EnvValueError')
    """

    @staticmethod
    def of(env_index: int, method: str, exc_type: str, message: str, remote_traceback: str) -> EnvError:
        """The EnvError for an env that raised ``exc_type``: of its subclass that is also that type, if any."""
        kind = BUILT_IN_KINDS.get(exc_type, EnvError)
        return kind(env_index, method, exc_type, message, remote_traceback)

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

    def __str__(self) -> str:
        return Exception.__str__(self)  # not KeyError's, which would quote the message


class EnvValueError(EnvError, ValueError):
    """An env raised ValueError."""


class EnvTypeError(EnvError, TypeError):
    """An env raised TypeError."""


class EnvKeyError(EnvError, KeyError):
    """An env raised KeyError."""


class EnvIndexError(EnvError, IndexError):
    """An env raised IndexError."""


class EnvRuntimeError(EnvError, RuntimeError):
    """An env raised RuntimeError."""


class EnvAssertionError(EnvError, AssertionError):
    """An env raised AssertionError."""


class EnvNotImplementedError(EnvError, NotImplementedError):
    """An env raised NotImplementedError."""


class EnvZeroDivisionError(EnvError, ZeroDivisionError):
    """An env raised ZeroDivisionError."""


#: The EnvError subclass for each built-in exception an env raised, by ``exc_type``.
BUILT_IN_KINDS: dict[str, type[EnvError]] = {
    "ValueError": EnvValueError,
    "TypeError": EnvTypeError,
    "KeyError": EnvKeyError,
    "IndexError": EnvIndexError,
    "RuntimeError": EnvRuntimeError,
    "AssertionError": EnvAssertionError,
    "NotImplementedError": EnvNotImplementedError,
    "ZeroDivisionError": EnvZeroDivisionError,
    # Where one process builds one env twice, a worker's refusal reaches the caller as an env's.
    "parallelenv.errors.SharedEnvError": EnvValueError,
}


class WorkerDiedError(ParallelEnvError):
    """A worker hosting envs died, or stopped answering and was killed.

    The ParallelEnv can still be closed; every other call raises this error
    again, since the envs it hosted are gone.

    Attributes:
        env_indices: the envs the worker hosted.
        reason: what was seen (exit code, signal, lost node, ...).
    """

    #: For backends: the replies read in the same wait before the death was
    #: seen, the dead worker's own among them. They answer their calls all the
    #: same, and the call tracker takes them before it handles the death, so
    #: that an env answered in time is not also resumed as if it had not been.
    replies_before_death: Sequence[Any] = ()

    def __init__(self, env_indices: Sequence[int], reason: str) -> None:
        self.env_indices = [int(i) for i in env_indices]
        self.reason = reason
        super().__init__(f"the worker hosting envs {_ranges(self.env_indices)} died: {reason}")


class WorkerTimeoutError(WorkerDiedError):
    """A worker did not answer a call within ``call_timeout`` seconds and was killed."""


class WorkerStartError(WorkerDiedError):
    """Workers (Ray actors) did not start: the cluster can never hold what they ask, or they
    waited for busy resources past ``start_timeout``.

    A ``WorkerDiedError``, so that handlers written for a worker's death catch it; nothing
    started, so nothing died.

    Attributes:
        env_indices: the envs of the workers that did not start.
        reason: what they asked and what the cluster has.
        asked: what they ask in all, by Ray resource (``{"CPU": 8.0, "GPU": 2.0}``).
        cluster: the cluster's resources, by name, of those asked.
        free: what of them was free when the error was raised.

    Example:
        >>> from parallelenv.errors import WorkerStartError
        >>> str(WorkerStartError([0, 1, 2, 3], "they ask 8 CPUs; the cluster has 2"))
        'the workers hosting envs [0-3] did not start: they ask 8 CPUs; the cluster has 2'
    """

    def __init__(self, env_indices: Sequence[int], reason: str, asked: dict[str, float] | None = None,
                 cluster: dict[str, float] | None = None, free: dict[str, float] | None = None) -> None:
        self.env_indices = [int(i) for i in env_indices]
        self.reason = reason
        self.asked = dict(asked or {})
        self.cluster = dict(cluster or {})
        self.free = dict(free or {})
        ParallelEnvError.__init__(self, f"the workers hosting envs {_ranges(self.env_indices)} did not start: {reason}")


class ClosedError(ParallelEnvError, ClosedEnvironmentError):
    """A method was called on a ParallelEnv (``what``; or a RolloutPool) after ``close()``.

    Also Gymnasium's ``ClosedEnvironmentError``. Nothing opens a closed one
    again, so the message says how to go on: make a new one, and let a
    ``with`` block close it when the work is done.
    """

    def __init__(self, message: str, what: str = "ParallelEnv") -> None:
        super().__init__(message)
        self.what = what

    def __str__(self) -> str:
        name = "penv" if self.what == "ParallelEnv" else "pool"
        return (f"{super().__str__()}. A closed {self.what} cannot be used again: make a new one. "
                f"`with {self.what}(...) as {name}:` closes it for you when the block ends, so use it inside the block")


class AlreadyPendingError(ParallelEnvError, AlreadyPendingCallError):
    """``send``/``step``/``reset`` named envs whose previous call is not received yet.

    Also Gymnasium's ``AlreadyPendingCallError``; ``name`` is the pending call, as there.
    """

    def __init__(self, message: str, name: str = "step") -> None:
        super().__init__(message, name)


class NoPendingCallError(ParallelEnvError, NoAsyncCallError):
    """``recv`` was called with no call pending; also Gymnasium's ``NoAsyncCallError`` (``name``: the call awaited)."""

    def __init__(self, message: str, name: str = "step") -> None:
        super().__init__(message, name)


def _rebuilt(kind: type[BaseException], args: tuple[Any, ...], state: dict[str, Any],
             cause: BaseException | None) -> BaseException:
    error = kind.__new__(kind, *args)
    error.args = args
    error.__dict__.update(state)
    error.__cause__ = cause
    return error


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


# Every module of the package lives under this folder, named as its code objects name their files.
_PACKAGE = os.path.dirname(__file__) + os.sep


def warn_at_user_call(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` at the first frame outside parallelenv.

    A fixed ``stacklevel`` cannot do it: the same warning is reached through
    ``step`` or ``send``, the Gymnasium or SB3 view, or VecWorker, each at
    its own depth. The warning then names the user's line, and the default
    filter shows it once per line of the user's code, as warnings are meant to.
    """
    frame = sys._getframe(1)
    level = 2  # warn's stacklevel of our caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
