"""The no-IPC ceiling of a workload: one bare process per core stepping its share of the envs back to back.

No caller hands out actions and no answer travels while the clock runs:
each process is given its columns of the pre-sampled actions, steps its
envs through all of them (restarting an env whose episode ends, as
``asynchronous="restart"`` does), and times its own loop. The ceiling is the
sum of their rates: what the cores do with these envs when nothing is spent
on moving them. A wrapper's rate over it, measured in the same run, is the
share of the machine it leaves to the envs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from benchmarks.machine import usable_cores
from benchmarks.registry import EnvFactory, Runner

_JOIN_S = 10.0
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class CeilingRunner(Runner):
    """``usable_cores()`` bare processes (no more than envs), the envs split between them as evenly as can be."""

    def __init__(self, factories: Sequence[EnvFactory]) -> None:
        # The forkserver, as our subproc backend and SB3 start theirs: a fork of this process would carry
        # its imports and threads, and spawn pays a fresh interpreter per process.
        ctx = multiprocessing.get_context("forkserver")
        self.shares = [share for share in np.array_split(np.arange(len(factories)), usable_cores()) if share.size]
        self.workers = len(self.shares)
        self._conns: list[Connection] = []
        self._processes: list[Any] = []
        self._rate: float | None = None
        try:
            # One BLAS/OpenMP thread each, as parallelenv's workers get: no thread pool beside the envs
            # (the forkserver, started with the first process, reads them once).
            with _variables({name: "1" for name in _THREAD_VARIABLES}):
                for share in self.shares:
                    ours, theirs = ctx.Pipe()
                    process = ctx.Process(target=_serve, args=(theirs, [factories[i] for i in share]),
                                          daemon=True, name="ceiling")
                    process.start()
                    theirs.close()
                    self._conns.append(ours)
                    self._processes.append(process)
        except BaseException:
            self.close()
            raise

    def reset(self, seed: int) -> None:
        # seed + i for env i, as the vector envs of the libraries measured beside it do.
        self._ask([("reset", seed + int(share[0])) for share in self.shares])

    def run(self, actions: np.ndarray) -> int:
        answers = self._ask([("run", np.ascontiguousarray(actions[:, share])) for share in self.shares])
        self._rate = sum(steps / seconds for steps, seconds in answers)
        return sum(steps for steps, _ in answers)

    def own_rate(self) -> float | None:
        return self._rate

    def _ask(self, messages: list[tuple[str, Any]]) -> list[Any]:
        """Send each process its message, then wait for every answer; a process that died raises."""
        for conn, message in zip(self._conns, messages, strict=True):
            conn.send(message)
        answers = []
        for conn in self._conns:
            try:
                answer = conn.recv()
            except (EOFError, ConnectionError):
                raise RuntimeError("a ceiling process died (its traceback is in the log)") from None
            if isinstance(answer, BaseException):
                raise answer
            answers.append(answer)
        return answers

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self._processes:
            process.join(_JOIN_S)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self._conns:
            conn.close()


@contextlib.contextmanager
def _variables(values: dict[str, str]) -> Iterator[None]:
    """Environment variables set for the block where the user has not set them."""
    added = {name: value for name, value in values.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _serve(conn: Connection, factories: list[EnvFactory]) -> None:
    """A bare process: make its envs, then reset them or step them through their actions when told."""
    envs = [factory() for factory in factories]
    try:
        while (message := conn.recv()) is not None:
            command, payload = message
            try:
                if command == "reset":
                    for offset, env in enumerate(envs):
                        env.reset(seed=payload + offset)
                    conn.send(None)
                else:
                    conn.send(_step_through(envs, payload))
            except Exception as exc:  # the caller raises it: a failed env is a failed row, not a hang
                conn.send(exc)
    finally:
        for env in envs:
            env.close()


def _step_through(envs: list[Any], actions: np.ndarray) -> tuple[int, float]:
    """Each row of ``actions`` to every env in turn; (env-steps, seconds) of the whole loop."""
    start = time.perf_counter()
    for row in actions:
        for env, action in zip(envs, row, strict=True):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
    return actions.shape[0] * actions.shape[1], time.perf_counter() - start
