"""The ``subproc`` backend: worker processes, each hosting a contiguous group of envs.

Why this shape: one pipe round trip costs more than a cheap env's step, so a
worker steps several envs per message and every call costs one short message
per worker, not per env. Observations, rewards and flags go through shared
memory (see :mod:`parallelenv.backends.subproc.shm`); the pipe carries only the call
and the envs' non-empty infos. The parent blocks in one ``poll`` on the pipes
and the processes' sentinels, so it takes no core from the envs and learns
at once when a worker dies; for a step of every env whose caller waits for
all of it (:attr:`Step.awaited <parallelenv.calls.Step.awaited>`, as
``step()`` says), it announces the step to every worker at once and sleeps
instead on a :class:`~parallelenv.backends.subproc.countdown.Countdown` that
only the last worker to answer wakes (see :mod:`~parallelenv.backends.subproc.counted`).
"""

from __future__ import annotations

import dataclasses
import math
import select
import time
from collections.abc import Sequence
from multiprocessing import resource_tracker

from parallelenv.backends.base import BackendConfig, available_cpus
from parallelenv.backends.buffers import spare_obs_slots
from parallelenv.backends.env_sources import EnvSource, env_list, pickle_sources
from parallelenv.backends.partition import Groups
from parallelenv.backends.spaces import common_spaces
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.countdown import Countdown
from parallelenv.backends.subproc.counted import CountedSteps, worker_bits
from parallelenv.backends.subproc.shm import SharedBuffers
from parallelenv.backends.subproc.spawning import start_context
from parallelenv.backends.subproc.worker import LINGER_S, Attach
from parallelenv.backends.subproc.workers import Worker, await_report, exit_reason, start_worker
from parallelenv.calls import Call, Reply, Step
from parallelenv.errors import WorkerDiedError
from parallelenv.infos import columns as info_columns

CLOSE_GRACE_S = 5.0
_exit_reason = exit_reason  # the pool's processes word an exit as the backends do


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
        self._workers: list[Worker] = []
        self._shared: SharedBuffers | None = None
        self._closed = False
        # Deaths seen while sending, or beside another in one collect, reported by the next collect.
        self._unreported: list[Worker] = []
        ctx = start_context(start_method)
        self._countdown = Countdown(ctx, num_workers)
        # Counted steps pay where every worker has a core to compute on: there a
        # wake-up of the parent lands on a core an env is using. With more workers
        # than cores, a message per worker costs the parent more than the stragglers'
        # overlap gains where one futex call announces the step to all (64 workers of
        # a sleeping env: ~1,400 us a step read from the pipes); without futexes, reading
        # each reply as it comes overlapped with the stragglers (jitter16 lockstep ran
        # ~4% slower counted). With one worker its reply is the only wake-up anyway.
        has_cores = num_workers <= available_cpus()
        self._counts_steps = num_workers > 1 and (has_cores or self._countdown.broadcasts)
        self._on_pipes = 0  # calls sent on the pipes and not yet answered, all workers together
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
        self._by_fd: dict[int, tuple[Worker, bool]] = {}
        self._counted = CountedSteps(self, self._workers, self._countdown)
        for worker in self._workers:
            self._watch_worker(worker)
        self.all_ids = tuple(range(self.num_envs))
        # Actions that travel in the messages make each step's message its own.
        self._announces_steps = not self.buffers.private_actions
        self._group_steps: list[tuple[Worker, Call]] = [(w, Step(w.group_ids)) for w in self._workers]

    def _watch_worker(self, worker: Worker) -> None:
        if worker.death is not None:
            return
        for fd, is_sentinel in ((worker.conn.fileno(), False), (worker.process.sentinel, True)):
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = (worker, is_sentinel)
        self._counted.watch(worker)

    def expect_on_pipe(self, worker: Worker, env_ids: tuple[int, ...]) -> None:
        """A reply about ``env_ids`` comes on ``worker``'s pipe before those of the calls sent it since."""
        worker.sent.appendleft(env_ids)
        self._on_pipes += 1

    def _start_worker(self, index: int, env_ids: list[int]) -> Worker:
        ctx, payloads, config, linger_s, _ = self._restart_with
        return start_worker(ctx, index, env_ids, payloads, config, linger_s, self._countdown.for_worker(index))

    def _handshake(self, timeout: float | None, keep_segment_name: bool) -> None:
        """Learn the spaces from the workers, then give them the shared buffers.

        Where the segment still has a name (not on Linux, see
        :mod:`~parallelenv.backends.subproc.shm`), it is removed once every
        worker has attached, unless dead workers are to be replaced: a new
        worker attaches by that name.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        per_env = [pair for w in self._workers for pair in await_report(w, deadline, "build its envs").spaces]
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
            await_report(worker, deadline, "attach to shared memory")
        if not keep_segment_name:
            self._shared.unlink()

    def dispatch(self, call: Call) -> None:
        # Only a step its caller awaits whole may be counted: its quiet answers
        # reach the parent all at once, when the last worker wakes it. One
        # taken as it comes (send(), then a recv of some) would hand over
        # nothing until its last env answered; one not counted only costs the
        # parent more wake-ups. The countdown is the backend's, one step at a time.
        counted = (self._counts_steps and type(call) is Step and call.awaited and call.env_ids == self.all_ids
                   and not self._on_pipes and not self._counted.in_flight)
        if counted and not self._telling_columns and self._announces_steps:
            self._dispatch_counted_step()
            return
        routed = self._route(call)
        for worker, _ in routed:
            if worker.death is not None:
                raise worker.death
        self._counted.settle_slots()
        # Every message is made before any is sent: one that cannot be pickled
        # raises here, and no worker has started a call the others never get.
        obs_slot = self.buffers.obs_slot
        messages = [wire.encode_call(worker_call, worker.group_ids, counted, self.buffers, worker.obs_slot)
                    for worker, worker_call in routed]
        if self._telling_columns:
            messages = [self._with_info_columns(worker, message) for (worker, _), message in zip(routed, messages,
                                                                                                strict=True)]
        if counted:
            self._counted.begin()  # its quiet answers reach collect through the countdown only
        on_words = self._counted.sending_on_pipes([worker for worker, _ in routed], counted)
        for (worker, worker_call), message in zip(routed, messages, strict=True):
            if not counted:
                worker.sent.append(worker_call.env_ids)
                self._on_pipes += 1
            worker.obs_slot = obs_slot
            try:
                worker.conn.send_bytes(message)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self.not_sent(worker)
        if on_words:
            self._countdown.ring(worker_bits(on_words, len(on_words) == len(self._workers)))

    def not_sent(self, worker: Worker) -> None:
        """A worker whose pipe broke while a call was sent: the other workers still get their share,
        the call is under way, and the next collect reports this one's death."""
        if worker.death is None:
            self.lose(worker)
            self._unreported.append(worker)

    def _dispatch_counted_step(self) -> None:
        """What :meth:`dispatch` does for a counted step of every env: announced to every worker at once
        (see :mod:`~parallelenv.backends.subproc.counted`), the parent's share of a training loop's step."""
        self._counted.dispatch(self.buffers.obs_slot)

    def _with_info_columns(self, worker: Worker, message: bytes) -> bytes:
        """``message``, behind the layout of the info columns if the worker has not been told it yet."""
        if worker.knows_info_columns:
            return message
        worker.knows_info_columns = True
        self._telling_columns = any(not w.knows_info_columns for w in self._workers)
        return wire.INFO_COLUMNS.encode(self.buffers.info_columns.columns, message)

    def _learn_info_columns(self, reply: Reply) -> None:
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

    def _is_step_of_all(self, call: Call) -> bool:
        return type(call) is Step and call.env_ids == self.all_ids

    def _route(self, call: Call) -> list[tuple[Worker, Call]]:
        if self._is_step_of_all(call):
            return self._group_steps
        return [(self._workers[group], group_call) for group, group_call in self._groups.split(call)]

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        """As :meth:`Backend.collect`; ``wanted`` plays no part: a step is counted or not from its dispatch on."""
        if self._unreported:
            raise self._unreported.pop(0).death  # type: ignore[misc]  # set when it was recorded
        replies: list[Reply] = []
        dead: list[Worker] = []
        counted = self._counted
        if counted.in_flight:
            # The answers of a counted step that came through the countdown alone; those
            # with something to say follow on the pipes, read below with everything else.
            complete = counted.wait(timeout, dead)
            if not complete:
                timeout = 0.0  # time is up: hand over what has arrived, so only envs still silent count as hung
            replies = counted.answers(complete)
        if self._on_pipes:
            for fd, _ in self._poll.poll(_milliseconds(timeout)):
                worker, is_sentinel = self._by_fd[fd]
                if worker.death is not None:
                    continue  # its pipe and sentinel may both be in this poll's events
                if not is_sentinel:
                    try:
                        reply = wire.decode_reply(worker.conn.recv_bytes(), worker.sent[0], self.buffers)
                    except (EOFError, OSError):
                        pass
                    else:
                        worker.sent.popleft()
                        self._on_pipes -= 1
                        if not self._columns_learned and reply.values and reply.call_type is Step:
                            self._learn_info_columns(reply)
                        replies.append(reply)
                        continue
                self.lose(worker)
                dead.append(worker)
        if dead:
            # What was read before is the caller's all the same, the dead worker's own reply too.
            self._unreported.extend(dead[1:])
            death = dead[0].death
            assert death is not None  # set by lose
            death.replies_before_death = replies
            raise death
        return replies

    def lose(self, worker: Worker, reason: str | None = None) -> WorkerDiedError:
        """Record a worker's death and stop watching its pipe and sentinel."""
        if worker.death is None:
            for fd in (worker.conn.fileno(), worker.process.sentinel):
                self._poll.unregister(fd)
            self._counted.lost(worker)
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
        self._counted.settle_slots()
        rebuilt: list[int] = []
        for group in self._groups.hosting(env_ids):
            old = self._workers[group]
            if old.death is None:
                continue
            self._unreported = [w for w in self._unreported if w is not old]
            self._on_pipes -= len(old.sent)
            self._counted.num_dead -= 1
            old.process.join(timeout=1.0)
            old.release()
            new = self._start_worker(group, old.env_ids)
            self._workers[group] = new
            try:
                spaces = await_report(new, deadline, "build its envs").spaces
                if any(pair != (self.single_observation_space, self.single_action_space) for pair in spaces):
                    raise new.died(f"its rebuilt envs have other spaces than the first ones: {spaces}")
                new.conn.send_bytes(self._attach)
                await_report(new, deadline, "attach to shared memory")
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
            self.lose(worker, "it did not answer within call_timeout and was killed")
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
        self._countdown.ring()
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5.0)
            worker.release()
        self._countdown.close()
        if hasattr(self, "_counted"):
            self._counted.close()
        if self._shared is not None:
            self.buffers = None  # type: ignore[assignment]  # the arrays die with the segment
            self._shared.release()


def _milliseconds(timeout: float | None) -> int | None:
    """A ``poll`` timeout: None waits forever; never rounded down to a busy loop."""
    return None if timeout is None else math.ceil(timeout * 1000)
