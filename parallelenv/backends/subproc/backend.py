"""The ``subproc`` backend: worker processes, each hosting a contiguous group of envs.

Why this shape: one pipe round trip costs more than a cheap env's step, so a
worker steps several envs per message and every call costs one short message
per worker, not per env. Observations, rewards and flags go through shared
memory (see :mod:`parallelenv.backends.subproc.shm`); the pipe carries only the call
and the envs' non-empty infos. The parent blocks in one ``poll`` on the pipes
and the processes' sentinels, so it takes no core from the envs and learns
at once when a worker dies; for a step of every env whose caller waits for
all of it (:attr:`Step.awaited <parallelenv.calls.Step.awaited>`, as
``step()`` says), it sleeps instead on a
:class:`~parallelenv.backends.subproc.countdown.Countdown` that only the last worker
to answer wakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import select
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any

from parallelenv.backends.base import BackendConfig, available_cpus
from parallelenv.backends.buffers import spare_obs_slots
from parallelenv.backends.env_sources import EnvSource, env_list, pickle_sources
from parallelenv.backends.partition import Groups
from parallelenv.backends.spaces import common_spaces
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.countdown import Countdown
from parallelenv.backends.subproc.shm import SharedBuffers
from parallelenv.backends.subproc.spawning import main_module_not_rerun, single_threaded_numerics, start_context
from parallelenv.backends.subproc.worker import LINGER_S, Attach, Ready, worker_main
from parallelenv.calls import Call, Done, Failure, Reply, Step
from parallelenv.errors import WorkerDiedError
from parallelenv.infos import columns as info_columns

CLOSE_GRACE_S = 5.0


@dataclass
class _Worker:
    process: Any
    conn: Connection
    env_ids: list[int]
    # The env ids of each call sent and not yet answered, oldest first: a
    # worker answers in order, so the head is what the next reply is about.
    sent: deque[tuple[int, ...]] = field(default_factory=deque)
    death: WorkerDiedError | None = None
    obs_slot: int = 0  # the buffers' obs slot the worker writes into (see Buffers.use_obs_slot)
    knows_info_columns: bool = True  # else its next call tells it their layout

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
                reason = _exit_reason(self.process.exitcode)
            self.death = WorkerDiedError(self.env_ids, reason)
        return self.death


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "its pipe closed while the process still runs"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class SubprocBackend:
    """Envs in ``num_workers`` processes (default: one per CPU, at most one per env).

    Options (keyword arguments of ParallelEnv):
        num_workers: how many worker processes.
        start_method: ``"forkserver"`` (default on Linux), ``"spawn"`` or ``"fork"``.
        start_timeout: seconds to wait for the workers to build their envs.
    """

    def __init__(
        self,
        sources: Sequence[EnvSource],
        config: BackendConfig,
        num_workers: int | None = None,
        start_method: str | None = None,
        start_timeout: float | None = 120.0,
    ) -> None:
        sources = env_list(sources)
        num_envs = len(sources)
        if num_workers is None:
            num_workers = min(max(1, int(config.num_cpus or available_cpus())), num_envs)
        if not isinstance(num_workers, int) or not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers={num_workers!r}; use an int from 1 to the number of envs ({num_envs})")
        payloads = pickle_sources(sources)
        self.num_envs = num_envs
        self._workers: list[_Worker] = []
        self._shared: SharedBuffers | None = None
        self._closed = False
        # Deaths seen while sending, or beside another in one collect, reported by the next collect.
        self._unreported: list[_Worker] = []
        ctx = start_context(start_method)
        self._countdown = Countdown(ctx, num_workers)
        # Counted steps pay where every worker has a core to compute on: there a
        # wake-up of the parent lands on a core an env is using. With more workers
        # than cores the envs mostly wait (sleep, I/O), and reading each reply as
        # it comes overlaps with the stragglers: jitter16 lockstep ran ~4% slower counted.
        # With one worker its reply is the only wake-up anyway.
        has_cores = num_workers <= available_cpus()
        # A worker that dies in a counted step leaves the countdown short of its
        # answer: where workers are restarted, steps are read from the pipes.
        self._counts_steps = num_workers > 1 and has_cores and not config.restarts_workers
        self._counting = False  # a counted step is in flight and its countdown not yet complete
        self._columns_learned = False
        self._telling_columns = False  # some worker has yet to be told the info columns' layout
        # Workers attach to the shared memory and so register it with a
        # resource tracker: it must be ours, running before they start, or
        # each forked worker starts its own, which unlinks our segment when
        # the worker exits.
        resource_tracker.ensure_running()
        self._groups = Groups(num_envs, num_workers)
        # What a restart needs to start a worker as the first one was started.
        self._restart_with = (ctx, payloads, config, LINGER_S if has_cores else 0.0, start_timeout)
        try:
            for index, env_ids in enumerate(self._groups.members):
                self._workers.append(self._start_worker(index, env_ids))
            self._handshake(start_timeout, keep_segment_name=config.restarts_workers)
            self._watch()
        except BaseException:
            self.close()
            raise

    def _watch(self) -> None:
        """Set up the structures of the hot path once: a poll set and the whole-group split."""
        # One poll object for the backend's life: `connection.wait` would build
        # and fill a selector on every call.
        self._poll = select.poll()
        self._by_fd: dict[int, tuple[_Worker, bool]] = {}
        # What a counted step sleeps on: the countdown's wake-up, or a worker dying.
        self._countdown_poll = select.poll()
        self._countdown_poll.register(self._countdown.fileno(), select.POLLIN)
        for worker in self._workers:
            self._watch_worker(worker)
        self._all_ids = tuple(range(self.num_envs))
        # Actions that travel in the messages make each step's message its own.
        self._framed_counted_steps = None if self.buffers.private_actions else wire.framed_counted_group_steps()
        self._group_steps: list[tuple[_Worker, Call]] = [(w, Step(w.group_ids)) for w in self._workers]

    def _watch_worker(self, worker: _Worker) -> None:
        if worker.death is not None:
            return
        for fd, is_sentinel in ((worker.conn.fileno(), False), (worker.process.sentinel, True)):
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = (worker, is_sentinel)
        self._countdown_poll.register(worker.process.sentinel, select.POLLIN)

    def _start_worker(self, index: int, env_ids: list[int]) -> _Worker:
        ctx, payloads, config, linger_s, _ = self._restart_with
        countdown = self._countdown.for_worker(index)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        group_payloads = [payloads[i] for i in env_ids]
        process = ctx.Process(
            target=worker_main,
            args=(
                child_conn, group_payloads, env_ids[0], config.policy.restarts_finished_envs, config.no_warning,
                linger_s, countdown,
            ),
            name=f"parallelenv-worker-{env_ids[0]}-{env_ids[-1]}",
            daemon=True,
        )
        with main_module_not_rerun(), single_threaded_numerics():
            process.start()
        child_conn.close()
        return _Worker(process, parent_conn, env_ids)

    def _handshake(self, timeout: float | None, keep_segment_name: bool) -> None:
        """Learn the spaces from the workers, then give them the shared buffers.

        Where the segment still has a name (not on Linux, see
        :mod:`~parallelenv.backends.subproc.shm`), it is removed once every
        worker has attached, unless dead workers are to be replaced: a new
        worker attaches by that name.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        per_env = [pair for w in self._workers for pair in self._await(w, deadline, "build its envs").spaces]
        obs_space, action_space = common_spaces(per_env)
        self.single_observation_space, self.single_action_space = obs_space, action_space
        config = self._restart_with[2]
        restarts = config.policy.restarts_finished_envs
        # Healing resets rebuilt envs' rows in whatever slot their new worker starts in: it copies results out.
        copies_results = config.copy is not False and not (config.restarts_workers or config.rebuilds_envs)
        spare = spare_obs_slots(obs_space, self.num_envs, copies_results)
        self._shared = SharedBuffers.create(obs_space, action_space, self.num_envs, restarts, spare)
        self.buffers = self._shared.buffers
        self._attaching = Attach(self._shared.name, obs_space, action_space, self.num_envs, restarts, spare)
        self._attach = wire.ATTACH.encode(self._attaching)
        for worker in self._workers:
            worker.conn.send_bytes(self._attach)
        for worker in self._workers:
            self._await(worker, deadline, "attach to shared memory")
        if not keep_segment_name:
            self._shared.unlink()

    def _await(self, worker: _Worker, deadline: float | None, doing: str) -> Ready:
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

    def dispatch(self, call: Call) -> None:
        # Only a step its caller awaits whole may be counted: its quiet answers
        # reach the parent all at once, when the last worker wakes it. One
        # taken as it comes (send(), then a recv of some) would hand over
        # nothing until its last env answered; one not counted only costs the
        # parent more wake-ups. The countdown is the backend's, one step at a time.
        counted = (self._counts_steps and type(call) is Step and call.awaited and call.env_ids == self._all_ids
                   and not any(w.sent for w in self._workers))
        if counted and not self._telling_columns and self._framed_counted_steps is not None:
            self._dispatch_counted_step()
            return
        routed = self._route(call)
        for worker, _ in routed:
            if worker.death is not None:
                raise worker.death
        # Every message is made before any is sent: one that cannot be pickled
        # raises here, and no worker has started a call the others never get.
        obs_slot = self.buffers.obs_slot
        messages = [wire.encode_call(worker_call, worker.group_ids, counted, self.buffers, worker.obs_slot)
                    for worker, worker_call in routed]
        if self._telling_columns:
            messages = [self._with_info_columns(worker, message) for (worker, _), message in zip(routed, messages,
                                                                                                strict=True)]
        if counted:
            self._countdown.arm()
            self._counting = True  # until collect has every answer: quiet ones reach it through the countdown only
        for (worker, worker_call), message in zip(routed, messages, strict=True):
            worker.sent.append(worker_call.env_ids)
            worker.obs_slot = obs_slot
            try:
                worker.conn.send_bytes(message)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._not_sent(worker)

    def _not_sent(self, worker: _Worker) -> None:
        """A worker whose pipe broke while a call was sent: the other workers still get their share,
        the call is under way, and the next collect reports this one's death."""
        if worker.death is None:
            self._lost(worker)
            self._unreported.append(worker)

    def _dispatch_counted_step(self) -> None:
        """What :meth:`dispatch` does for a counted step of every env, with the message framed once.

        Every worker gets the same few bytes, the obs slot the only thing in
        them that changes: written straight to each pipe, framed as
        ``Connection.recv_bytes`` reads them, the parent's share of a
        training loop's step is a write per worker.
        """
        workers = self._workers
        for worker in workers:
            if worker.death is not None:
                raise worker.death
        obs_slot = self.buffers.obs_slot
        framed = self._framed_counted_steps[obs_slot]  # type: ignore[index]  # checked by dispatch
        self._countdown.arm()
        self._counting = True
        for worker in workers:
            worker.sent.append(worker.group_ids)
            worker.obs_slot = obs_slot
            try:
                if os.write(worker.fd, framed) != len(framed):  # a few bytes: a short write means a broken pipe
                    raise BrokenPipeError(f"a short write to worker {worker.pid}'s pipe")
            except OSError:
                self._not_sent(worker)

    def _with_info_columns(self, worker: _Worker, message: bytes) -> bytes:
        """``message``, behind the layout of the info columns if the worker has not been told it yet."""
        if worker.knows_info_columns:
            return message
        worker.knows_info_columns = True
        self._telling_columns = any(not w.knows_info_columns for w in self._workers)
        return wire.INFO_COLUMNS.encode(self.buffers.info_columns.columns, message)

    def _learn_info_columns(self, reply: Done) -> None:
        """Give the numeric keys of the first step reply with infos columns (see info_columns.learn)."""
        self._columns_learned = True
        columns = info_columns.learn(reply.values.values())
        if not columns:
            return
        self.buffers.info_columns.lay_out(columns)
        self._attaching = dataclasses.replace(self._attaching, info_columns=columns)
        self._attach = wire.ATTACH.encode(self._attaching)  # what a worker started from now on is told
        for worker in self._workers:
            worker.knows_info_columns = False
        self._telling_columns = True

    @property
    def answers_whole_steps(self) -> bool:
        """Whether an awaited step of every env comes back as one reply when no env has anything to
        say: counted (see dispatch), or one worker's."""
        return self._counts_steps or len(self._workers) == 1

    def _is_step_of_all(self, call: Call) -> bool:
        return type(call) is Step and call.env_ids == self._all_ids

    def _route(self, call: Call) -> list[tuple[_Worker, Call]]:
        if self._is_step_of_all(call):
            return self._group_steps
        return [(self._workers[group], group_call) for group, group_call in self._groups.split(call)]

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        """As :meth:`Backend.collect`; ``wanted`` plays no part: a step is counted or not from its dispatch on."""
        if self._unreported:
            raise self._unreported.pop(0).death  # type: ignore[misc]  # set when it was recorded
        replies: list[Reply] = []
        dead: list[_Worker] = []
        if self._counting:
            # The answers of a counted step that came through the countdown alone; those
            # with something to say follow on the pipes, read below with everything else.
            if self._await_countdown(timeout, dead):
                self._counting = False
            else:
                timeout = 0.0  # time is up: hand over what has arrived, so only envs still silent count as hung
            replies = self._quiet_answers()
        if any(worker.sent for worker in self._workers):
            for fd, _ in self._poll.poll(_milliseconds(timeout)):
                worker, is_sentinel = self._by_fd[fd]
                if worker.death is not None:
                    continue  # its pipe and sentinel may both be in this poll's events
                if not is_sentinel:
                    try:
                        reply = wire.decode_reply(worker.conn.recv_bytes(), worker.sent.popleft(), self.buffers)
                    except (EOFError, OSError):
                        pass
                    else:
                        if not self._columns_learned and reply.values and reply.call_type is Step:
                            self._learn_info_columns(reply)
                        replies.append(reply)
                        continue
                self._lost(worker)
                dead.append(worker)
        if dead:
            # What was read before is the caller's all the same, the dead worker's own reply too.
            self._unreported.extend(dead[1:])
            death = dead[0].death
            assert death is not None  # set by _lost
            death.replies_before_death = replies
            raise death
        return replies

    def _await_countdown(self, timeout: float | None, dead: list[_Worker]) -> bool:
        """Sleep until the last worker of a counted step wakes us (True), ``timeout`` passes, or
        workers die (False; they join ``dead``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = self._countdown_poll.poll(_milliseconds(remaining))
            if not events:
                return False
            for fd, _ in events:
                if fd != self._countdown.fileno():
                    worker = self._by_fd[fd][0]
                    self._lost(worker)
                    dead.append(worker)
            if dead:
                return False
            if self._countdown.complete():
                return True

    def _quiet_answers(self) -> list[Reply]:
        """The counted step's answers that came through the countdown alone: no env had an info."""
        if self._countdown.all_quiet():
            # Every worker's part of a step of every env: one answer for the whole
            # step, which the tracker takes in one go, as a whole step's reply.
            for worker in self._workers:
                worker.sent.popleft()
            return [Done(Step, self._all_ids, {})]
        answers: list[Reply] = []
        for index, worker in enumerate(self._workers):
            if worker.sent and self._countdown.answered_quietly(index):
                answers.append(Done(Step, worker.sent.popleft(), {}))
        return answers

    def _lost(self, worker: _Worker, reason: str | None = None) -> WorkerDiedError:
        """Record a worker's death and stop watching its pipe and sentinel."""
        if worker.death is None:
            for fd in (worker.conn.fileno(), worker.process.sentinel):
                self._poll.unregister(fd)
            self._countdown_poll.unregister(worker.process.sentinel)
        return worker.died(reason)

    def env_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers for _ in worker.env_ids]

    def pids(self) -> list[int]:
        return [worker.pid for worker in self._workers if worker.death is None]

    @property
    def countdown(self) -> Countdown:
        """What counted steps sleep on (see :mod:`~parallelenv.backends.subproc.countdown`); read-only, for tests."""
        return self._countdown

    def restart(self, env_ids: Sequence[int]) -> list[int]:
        """Start a new worker in place of each dead one hosting ``env_ids``, attached to the same buffers."""
        ctx, _, config, _, start_timeout = self._restart_with
        deadline = None if start_timeout is None else time.monotonic() + start_timeout
        rebuilt: list[int] = []
        for group in self._groups.hosting(env_ids):
            old = self._workers[group]
            if old.death is None:
                continue
            self._unreported = [w for w in self._unreported if w is not old]
            old.process.join(timeout=1.0)
            old.release()
            new = self._start_worker(group, old.env_ids)
            self._workers[group] = new
            try:
                spaces = self._await(new, deadline, "build its envs").spaces
                if any(pair != (self.single_observation_space, self.single_action_space) for pair in spaces):
                    raise new.died(f"its rebuilt envs have other spaces than the first ones: {spaces}")
                new.conn.send_bytes(self._attach)
                self._await(new, deadline, "attach to shared memory")
            except BaseException:
                new.process.kill()
                new.process.join(timeout=5.0)
                new.death = new.death or WorkerDiedError(new.env_ids, "its replacement failed to start")
                raise
            finally:
                self._watch_worker(new)
            rebuilt.extend(new.env_ids)
        self._group_steps = [(w, Step(w.group_ids)) for w in self._workers]
        return rebuilt

    def kill(self, env_ids: Sequence[int]) -> list[int]:
        lost: list[int] = []
        for group in self._groups.hosting(env_ids):
            worker = self._workers[group]
            worker.process.kill()
            self._lost(worker, "it did not answer within call_timeout and was killed")
            lost.extend(worker.env_ids)
        return lost

    def workers(self) -> list[tuple[tuple[int, ...], int | None]]:
        return [(worker.group_ids, worker.pid) for worker in self._workers]

    def interrupt(self) -> None:
        """From another thread, while a call waits on the workers: kill them, and nothing else (the
        waiting thread sees their deaths and does the bookkeeping; see Backend.interrupt)."""
        for worker in list(self._workers):
            if worker.death is None:
                worker.process.kill()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            if worker.death is None:
                try:
                    worker.conn.send_bytes(wire.CLOSING)
                except (OSError, EOFError):
                    pass
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5.0)
            worker.release()
        self._countdown.close()
        if self._shared is not None:
            self.buffers = None  # type: ignore[assignment]  # the arrays die with the segment
            self._shared.release()


def _milliseconds(timeout: float | None) -> int | None:
    """A ``poll`` timeout: None waits forever; never rounded down to a busy loop."""
    return None if timeout is None else math.ceil(timeout * 1000)
