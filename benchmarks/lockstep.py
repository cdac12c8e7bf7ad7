"""The least a lockstep of worker processes costs here: the bound of the many-worker workloads.

A vector env of W workers cannot start a batch step before every worker has
answered the last one. On a machine with fewer cores than workers the
wake-ups of a step come in a burst that the cores take one after another, and
on a virtual machine each costs tens of microseconds of the machine's time
(a bare ``time.sleep`` loop on the 2-core benchmark VM is charged 70-85 us
of CPU per wake-up). This runner measures what that leaves, with nothing of
a library in the way: W bare processes, each stepping its k envs when one
futex broadcast tells it to (the actions in shared memory), then taking a
token from a pipe; the one that takes the last token wakes the caller. No
result travels back. A wrapper's rate over it (``x ceiling`` in the caller's
cost table) is the share of what the machine allows that the wrapper reaches.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import select
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from benchmarks.own import own_module
from benchmarks.registry import EnvFactory, Runner

# This checkout's futex and lifeline, not the measured package's: with --against REV this process
# imports REV's parallelenv, which may have neither (benchmarks/own.py).
futex = own_module("backends.subproc.futex")
tie_to_parent = own_module("backends.subproc.lifeline").tie_to_parent

# The shared words: the batch step's number, what it asks (below), the seed of a reset.
_GENERATION, _COMMAND, _SEED = 0, 1, 2
_STEP, _RESET, _CLOSE = 0, 1, 2
_MORE, _LAST = b"\x01", b"\x00"
_TIMEOUT_S = 60.0  # a batch step of the sleep workloads lasts 20 ms at most: a minute means a hung worker


class LockstepRunner(Runner):
    """``N / envs_per_worker`` bare processes of ``envs_per_worker`` envs (one env each if 0) in lockstep."""

    def __init__(self, factories: Sequence[EnvFactory], envs_per_worker: int = 0) -> None:
        if not futex.AVAILABLE:
            raise RuntimeError("the lockstep bound needs Linux futexes")
        # The forkserver, as the ceiling and our subproc backend start theirs.
        ctx = multiprocessing.get_context("forkserver")
        k = envs_per_worker or 1
        self.shares = [list(range(start, min(start + k, len(factories)))) for start in range(0, len(factories), k)]
        self.workers = len(self.shares)
        probe = factories[0]()
        action = np.asarray(probe.action_space.sample())
        probe.close()
        raw = ctx.RawArray(ctypes.c_byte, len(factories) * action.nbytes)
        self._actions = np.frombuffer(raw, action.dtype).reshape((len(factories), *action.shape))
        self._words = ctx.RawArray(ctypes.c_int32, 4)
        self._address = ctypes.addressof(self._words)
        self._token_reader, self._token_writer = ctx.Pipe(duplex=False)
        self._wake_reader, self._wake_writer = ctx.Pipe(duplex=False)
        self._tokens = _MORE * (self.workers - 1) + _LAST
        self._token_out, self._wake_in = self._token_writer.fileno(), self._wake_reader.fileno()
        self._processes: list[Any] = []
        self._errors: list[Connection] = []
        self._poll = select.epoll()
        self._poll.register(self._wake_in, select.EPOLLIN)
        try:
            for share in self.shares:
                ours, theirs = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_serve, daemon=True, name="lockstep",
                                      args=(theirs, [factories[i] for i in share], share, self._words, raw,
                                            self._actions.dtype, self._actions.shape, self._token_reader,
                                            self._wake_writer))
                process.start()
                theirs.close()
                self._errors.append(ours)
                self._processes.append(process)
                self._poll.register(process.sentinel, select.EPOLLIN)
        except BaseException:
            self.close()
            raise

    def reset(self, seed: int) -> None:
        self._words[_SEED] = seed
        self._announce(_RESET)

    def step(self, actions: np.ndarray) -> None:
        self._actions[...] = actions
        self._announce(_STEP)

    def _announce(self, command: int) -> None:
        """Tell every process ``command`` in one futex call; return once the last one has done it."""
        os.write(self._token_out, self._tokens)
        words = self._words
        words[_COMMAND] = command
        words[_GENERATION] = (words[_GENERATION] + 1) & 0x7FFFFFFF
        futex.wake(self._address)
        events = self._poll.poll(_TIMEOUT_S)
        if not events:
            raise RuntimeError(f"a lockstep process did not answer within {_TIMEOUT_S:.0f} s")
        if any(fd != self._wake_in for fd, _ in events):
            raise self._failure()
        os.read(self._wake_in, 1)

    def _failure(self) -> BaseException:
        for conn in self._errors:
            if conn.poll():
                with contextlib.suppress(EOFError, OSError):
                    return conn.recv()
        return RuntimeError("a lockstep process died (its traceback is in the log)")

    def close(self) -> None:
        if self._processes:
            self._words[_COMMAND] = _CLOSE
            self._words[_GENERATION] = (self._words[_GENERATION] + 1) & 0x7FFFFFFF
            futex.wake(self._address)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in (*self._errors, self._token_reader, self._token_writer, self._wake_reader, self._wake_writer):
            conn.close()
        self._poll.close()


def _serve(errors: Connection, factories: list[EnvFactory], columns: list[int], words: Any, raw: Any,
           dtype: np.dtype, shape: tuple[int, ...], token_reader: Connection, wake_writer: Connection) -> None:
    """A bare process: on each announcement, reset or step its envs (restarting ended episodes), take a token."""
    tie_to_parent(errors)  # it sleeps on a futex, not a pipe: without this a killed caller would leave it behind
    envs = [factory() for factory in factories]
    actions = np.frombuffer(raw, dtype).reshape(shape)
    address = ctypes.addressof(words)
    tokens_in, wake_out = token_reader.fileno(), wake_writer.fileno()
    seen = 0  # the generation before the first announcement, which may come before this process runs
    try:
        while True:
            generation = words[_GENERATION]
            if generation == seen:
                futex.wait(address, seen, futex.EVERY_WORKER, 1.0)
                continue
            seen = generation
            command = words[_COMMAND]
            if command == _CLOSE:
                return
            if command == _RESET:
                for column, env in zip(columns, envs, strict=True):
                    env.reset(seed=words[_SEED] + column)
            else:
                for column, env in zip(columns, envs, strict=True):
                    _, _, terminated, truncated, _ = env.step(actions[column])
                    if terminated or truncated:
                        env.reset()
            if os.read(tokens_in, 1) == _LAST:
                os.write(wake_out, b"w")
    except Exception as exc:  # the caller raises it: a failed env is a failed row, not a hang
        errors.send(exc)
    finally:
        for env in envs:
            env.close()
