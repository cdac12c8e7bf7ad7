"""The loop of a worker process hosting a group of envs.

The parent starts the process with the group's pickled env factories; the
worker builds its envs, reports their spaces, attaches to the shared buffers
and then answers one call at a time until it is told to close or its pipe
closes (the parent is gone). The forkserver imports this module before it
forks any worker (see :mod:`~.forkserver_preload`), so a new worker starts
with numpy and gymnasium already imported.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
from gymnasium import spaces

from parallelenv.backends.env_group import EnvGroup
from parallelenv.backends.env_sources import make_envs
from parallelenv.backends.subproc import wire
from parallelenv.backends.subproc.countdown import WorkerCountdown
from parallelenv.backends.subproc.lifeline import tie_to_parent
from parallelenv.backends.subproc.shm import SharedBuffers
from parallelenv.calls import Failure, Reply


@dataclass(frozen=True)
class Ready:
    spaces: list[tuple[spaces.Space, spaces.Space]]  # per env of the group


@dataclass(frozen=True)
class Attach:
    segment_name: str
    observation_space: spaces.Space
    action_space: spaces.Space
    num_envs: int
    restarts: bool  # the buffers hold the rows of ended episodes (see Buffers.allocate)
    spare_obs_slots: int  # see Buffers.use_obs_slot
    info_columns: tuple = ()  # the layout of the info columns, once the parent has learned it


def worker_main(
    conn: Connection,
    payloads: list[bytes],
    first_id: int,
    restart: bool,
    no_warning: bool,
    linger_s: float,
    countdown: WorkerCountdown,
    timed: bool = False,
) -> None:
    """Entry point of a worker process; ``linger_s`` and ``countdown`` as in :func:`_serve`; ``timed``: keep
    the envs' times (``ParallelEnv(stats=True)``)."""
    # Ctrl-C reaches the whole process group; the parent decides, and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tie_to_parent(conn)
    _schedule_as_batch_job()
    if no_warning:
        warnings.simplefilter("ignore")
    group = _start(conn, payloads, first_id, restart, timed)
    if group is None:
        return
    shared = None
    try:
        attach = wire.decode_attach(conn.recv_bytes())
        if attach is None:  # the parent closes before the envs were ever used
            return
        shared = SharedBuffers.attach(
            attach.segment_name, attach.observation_space, attach.action_space, attach.num_envs, attach.restarts,
            attach.spare_obs_slots,
        )
        assert shared.buffers is not None and shared.buffers.info_columns is not None
        shared.buffers.info_columns.lay_out(attach.info_columns)
        group.attach(shared.buffers)
        # The envs and imports live as long as the process: keep the collector from re-scanning them.
        gc.freeze()
        countdown.attach()
        conn.send_bytes(wire.encode(Ready([])))
        _serve(conn, group, linger_s, countdown)
    except (EOFError, OSError):
        pass  # the parent is gone: nobody is left to answer
    finally:
        group.close()
        del group
        if shared is not None:
            shared.release()


def _schedule_as_batch_job() -> None:
    """Let a parent that wakes this worker finish what it is doing before the worker runs.

    Under Linux's default policy a worker woken by the parent's message
    preempts the parent, on its core, in the middle of sending the next
    worker's; SCHED_BATCH has no wake-up preemption and is otherwise the
    default policy (the performance page has the figures).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or a policy this process may not leave
        pass


def _start(conn: Connection, payloads: list[bytes], first_id: int, restart: bool, timed: bool) -> EnvGroup | None:
    """Build the envs and report their spaces, or report why not."""
    sources = []
    for offset, payload in enumerate(payloads):
        try:
            sources.append(cloudpickle.loads(payload))
        except Exception as exc:
            conn.send_bytes(wire.encode(Failure.from_exception(first_id + offset, "unpickle", exc)))
            return None
    envs = make_envs(sources, first_id)
    if isinstance(envs, Failure):
        conn.send_bytes(wire.encode(envs))
        return None
    group = EnvGroup(envs, first_id, restart, timed)
    try:
        conn.send_bytes(wire.encode(Ready(group.spaces())))
    except Exception as exc:  # unpicklable spaces
        group.close()
        conn.send_bytes(wire.encode(Failure.from_exception(first_id, "make", exc)))
        return None
    return group


# How long a worker keeps looking for its next call after answering, before it
# sleeps, when it has a core of its own. On virtual machines a CPU that has
# slept longer than the guest's halt-polling window takes the waker about as
# long to wake as a parent takes to turn a step around, on every step. The look yields the CPU on every turn, so it only uses cycles
# that no other process wants; with more workers than cores those cycles are
# wanted, and workers sleep at once.
LINGER_S = 0.0003


def _serve(conn: Connection, group: EnvGroup, linger_s: float, countdown: WorkerCountdown) -> None:
    """Answer calls in order; a counted step is answered through ``countdown`` (see its module)."""
    recv, send = conn.recv_bytes, conn.send_bytes
    buffers = group.buffers  # its parts of no fixed shape are this process's own: they travel with the messages
    reader = wire.CallReader(group.all_ids, buffers)
    slots, group_step = reader.slots, reader.group_step[0]

    def run(call: Any) -> Reply:
        # A step of the whole group takes its envs' states first where the parent announced a snapshot step,
        # and states go to the slots the parent named (see state_slots).
        return slots.keep(group.run(slots.announced(call) if call is group_step else call))

    incoming = select.poll()
    incoming.register(conn.fileno(), select.POLLIN)
    has_mail = incoming.poll if countdown.broadcasts else None
    countdown.attach()  # done already where the worker started as usual (see worker_main)
    # After a call that is not a counted step, the next one comes on the pipe too, most likely (send() of
    # some envs, resets, attribute calls): the worker then waits on its pipe, as the parent knows, and a step
    # announced to all is written there for it. A futex wake-up of many workers cost a caller busy with its
    # policy several times what writing to their pipes did (the performance page).
    waits_on_pipe = False
    while True:
        if has_mail is not None and not waits_on_pipe:
            if countdown.wait(lambda: bool(has_mail(0)), linger_s):
                # A step of the whole group announced in shared memory: the actions are there already.
                reader.use_obs_slot(countdown.obs_slot)
                _answer_counted(wire.encode_reply(run(group_step), buffers), countdown, send)
                group.take_ahead_if_due()
                continue
        elif linger_s:
            linger(incoming, linger_s)
        data = recv()
        try:
            call, counted = wire.decode_call(data, reader)
        except Exception as exc:  # the caller's data needs what this process cannot import, or is no call
            call, counted, unreadable = None, wire.is_counted(data), wire.unreadable(exc)
        else:
            if call is None:
                return
            unreadable = None
        if counted and waits_on_pipe:
            countdown.came_on_pipe()
            waits_on_pipe = False
        reply = wire.encode_reply(run(call), buffers) if unreadable is None else unreadable
        if counted:
            # Through the countdown, which the parent sleeps on: also the answer to a step whose actions
            # this worker could not read (a user's object whose class it cannot import).
            _answer_counted(reply, countdown, send)
        else:
            send(reply)
            waits_on_pipe = True
        group.take_ahead_if_due()


def _answer_counted(reply: bytes, countdown: WorkerCountdown, send: Callable[[bytes], None]) -> None:
    quiet = wire.is_quiet(reply)
    # Wake the parent before writing: it sleeps on the countdown, not on
    # the pipes, so a reply larger than the pipe's buffer would block here
    # with nobody reading it. Once woken, it reads the pipes of every
    # worker that said it answers there.
    countdown.answer(quiet)
    if not quiet:
        send(reply)


def linger(watched: select.poll, seconds: float) -> None:
    """Look for an event for up to ``seconds``, yielding the CPU between looks."""
    give_up = time.perf_counter() + seconds
    while not watched.poll(0) and time.perf_counter() < give_up:
        os.sched_yield()
