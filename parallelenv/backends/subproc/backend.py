"""The ``subproc`` backend: worker processes, each hosting a contiguous group of envs.

Why this shape: one pipe round trip costs more than a cheap env's step, so a
worker steps several envs per message and every call costs one short message
per worker, not per env. Observations, rewards and flags go through shared
memory (see :mod:`parallelenv.backends.subproc.shm`); the pipe carries only the call
and the envs' non-empty infos.

Calls travel by one of two transports, each owning its calls under way and
what a lost worker does to them: the pipes (:mod:`~parallelenv.backends.subproc.pipes`),
for every call, and counted steps (:mod:`~parallelenv.backends.subproc.counted`)
for a step of every env whose caller waits for all of it
(:attr:`Step.awaited <parallelenv.calls.Step.awaited>`, as ``step()`` says):
announced to every worker at once, the parent asleep on a
:class:`~parallelenv.backends.subproc.countdown.Countdown` that only the last
worker to answer wakes. This class picks the transport of each call, and
tells both when a worker dies or is replaced; ``counted_steps=False`` sends
everything on the pipes, the way to tell a bug of one transport from the other's.
"""

from __future__ import annotations

import dataclasses
import functools
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
from parallelenv.backends.subproc.pipes import Pipes
from parallelenv.backends.subproc.shm import SharedBuffers
from parallelenv.backends.subproc.spawning import start_context
from parallelenv.backends.subproc.state_slots import StateSlots
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
        counted_steps: False sends every call on the workers' pipes, never as a counted step
            (results are the same; to bisect a suspected bug of the countdown's transport).
    """

    def __init__(
        self,
        sources: Sequence[EnvSource],
        config: BackendConfig,
        num_workers: int | None = None,
        start_method: str | None = None,
        start_timeout: float | None = 120.0,
        counted_steps: bool = True,
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
        # overlap gains where one futex call announces the step to all; without
        # futexes, reading each reply as it comes overlaps with the stragglers
        # (the performance page has the figures). With one worker its reply is
        # the only wake-up anyway.
        has_cores = num_workers <= available_cpus()
        if not isinstance(counted_steps, bool):
            raise TypeError(f"counted_steps={counted_steps!r}; use True or False")
        self._counts_steps = counted_steps and num_workers > 1 and (has_cores or self._countdown.broadcasts)
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
        """Set up the transports and the whole-group split once."""
        self.all_ids = tuple(range(self.num_envs))
        self.pipes = Pipes()
        self.counted = CountedSteps(self._workers, self._countdown, self.all_ids)
        self._state_slots = StateSlots(self.num_envs)  # where snapshot steps leave their states
        for worker in self._workers:
            self.pipes.watch(worker)
            self.counted.watch(worker)
        # Actions that travel in the messages make each step's message its own.
        self._announces_steps = not self.buffers.private_actions
        self._group_steps: list[tuple[Worker, Call]] = [(w, Step(w.group_ids)) for w in self._workers]

    @property
    def shared_memory(self) -> SharedBuffers | None:
        """The segment the buffers live in (None once closed): its backing and name, for tests and debugging."""
        return self._shared

    def worker(self, index: int) -> Worker:
        """The parent's handle on worker ``index`` (its pid, pipe and process), as today: for tests and debugging."""
        return self._workers[index]

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
        copies_results = config.copy is not False
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
        pipes, counted_steps = self.pipes, self.counted
        counted = (self._counts_steps and type(call) is Step and call.awaited and call.env_ids == self.all_ids
                   and not pipes.in_flight and not counted_steps.in_flight)
        # A snapshot step is announced so too once every worker knows the state slots (their states go
        # there), and travels on the pipes until then (see state_slots).
        snapshot = call.snapshot if type(call) is Step else None
        if counted and not self._telling_columns and self._announces_steps and \
                (snapshot is None or self._state_slots.all_told(self._workers, snapshot)):
            if snapshot is not None:
                self._state_slots.aim(call.env_ids, announce=True)
            for worker in counted_steps.dispatch(self.buffers.obs_slot):
                self._not_sent(worker)
            return
        routed = self._route(call)
        for worker, _ in routed:
            if worker.death is not None:
                raise worker.death
        counted_steps.settle_slots()
        # Every message is made before any is sent: one that cannot be pickled
        # raises here, and no worker has started a call the others never get.
        obs_slot = self.buffers.obs_slot
        tell = self._state_slots.tell
        messages = [wire.encode_call(worker_call, worker.group_ids, counted, self.buffers, worker.obs_slot,
                                     None if snapshot is None else functools.partial(tell, worker, snapshot))
                    for worker, worker_call in routed]
        if snapshot is not None:
            self._state_slots.aim(call.env_ids)
        if self._telling_columns:
            messages = [self._with_info_columns(worker, message) for (worker, _), message in zip(routed, messages,
                                                                                                strict=True)]
        if counted:
            counted_steps.begin()  # its quiet answers reach collect through the countdown only
        on_words = counted_steps.sending_on_pipes([worker for worker, _ in routed], counted)
        for (worker, worker_call), message in zip(routed, messages, strict=True):
            worker.obs_slot = obs_slot
            if counted:  # answered through the countdown, or on the pipe where the worker talks
                try:
                    worker.conn.send_bytes(message)
                except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                    self._not_sent(worker)
            elif not pipes.send(worker, worker_call.env_ids, message):
                self._not_sent(worker)
        if on_words:
            self._countdown.ring(worker_bits(on_words, len(on_words) == len(self._workers)))

    def _not_sent(self, worker: Worker) -> None:
        """A worker whose pipe broke while a call was sent: the other workers still get their share,
        the call is under way, and the next collect reports this one's death."""
        if worker.death is None:
            self.lose(worker)
            self._unreported.append(worker)

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

    def _route(self, call: Call) -> list[tuple[Worker, Call]]:
        if type(call) is Step and call.env_ids == self.all_ids and call.snapshot is None and call.live is None:
            return self._group_steps
        return [(self._workers[group], group_call) for group, group_call in self._groups.split(call)]

    def collect(self, timeout: float | None, wanted: int | None = None) -> list[Reply]:
        """As :meth:`Backend.collect`; ``wanted`` plays no part: a step is counted or not from its dispatch on."""
        if self._unreported:
            raise self._unreported.pop(0).death  # type: ignore[misc]  # set when it was recorded
        replies: list[Reply] = []
        dead: list[Worker] = []
        pipes, counted = self.pipes, self.counted
        if counted.in_flight:
            # The answers of a counted step that came through the countdown alone; those
            # with something to say follow on the pipes, read below with everything else.
            complete = counted.wait(timeout, dead)
            for worker in dead:
                self.lose(worker)
            if not complete:
                timeout = 0.0  # time is up: hand over what has arrived, so only envs still silent count as hung
            talking: list[Worker] = []
            replies = counted.answers(complete, talking)
            for worker in talking:
                pipes.expect(worker, worker.group_ids)  # before any call sent to it since
        if pipes.in_flight:
            seen = len(dead)
            read = pipes.collect(timeout, self.buffers, dead)
            for worker in dead[seen:]:
                self.lose(worker)
            if not self._columns_learned:
                for reply in read:
                    if reply.values and reply.call_type is Step:
                        self._learn_info_columns(reply)
                        break
            replies += read
        if self._state_slots.expecting:
            replies = self._state_slots.fill(replies)
        if dead:
            # What was read before is the caller's all the same, the dead worker's own reply too.
            self._unreported.extend(dead[1:])
            death = dead[0].death
            assert death is not None  # set by lose
            death.replies_before_death = replies
            raise death
        return replies

    def lose(self, worker: Worker, reason: str | None = None) -> WorkerDiedError:
        """Record a worker's death; each transport forgets what was under way on it."""
        if worker.death is None:
            self.pipes.lost(worker)
            self.counted.lost(worker)
            self._state_slots.lost(worker.env_ids)
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
        self.counted.settle_slots()
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
                if new.death is None:
                    self.pipes.watch(new)
                    self.counted.replaced(new)
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
        if hasattr(self, "counted"):
            self.counted.close()
            self._state_slots.close()
        if self._shared is not None:
            self.buffers = None  # type: ignore[assignment]  # the arrays die with the segment
            self._shared.release()

