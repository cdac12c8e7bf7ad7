"""Snapshot steps' states kept in shared memory: the parent reads none of them unless a worker dies.

Lossless healing (:mod:`parallelenv.state.journal`) takes every env's state
every so many steps, and reads one only to put a rebuilt env back. Sent back
on the pipes, the states cost the parent, on every snapshot step, a wake-up
per worker, a read and an unpickle of each, and took the step off the
one-wake-up path of counted steps (:mod:`~parallelenv.backends.subproc.counted`).
So a subproc backend keeps them in a segment of their own, which outlives a
dead worker: two slots an env, a worker writing one while the other holds
that env's last snapshot. The journal is given :class:`SlotState`
references, read when a state is wanted: a replay, or any pickle of one
(``__reduce__`` puts the state itself in its place).

- The segment is made once the first snapshot step's states have come on the
  pipes, with :data:`ROOM` times the largest of them to each slot (at least
  :data:`MIN_SLOT_BYTES`). A state too large for its slot comes on the pipe,
  and the next snapshot step has a segment with room for it.
- An env whose state cannot be taken writes why to its slot instead, once;
  while the reason stays the same, its later refusals say only "again", and
  the parent keeps the reason. So a snapshot step of envs that refuse is
  announced and answered as quietly as any other.
- A worker learns the segment from a snapshot step on its pipe
  (``wire.SNAPSHOT_STEP``), which names it where the worker has not been
  told, with the env classes whose pickle is trusted (``Step.snapshot``).
- Once every worker knows both, a snapshot step of every env is announced as
  any counted step is, with one more word moved: a worker that finds the
  segment's ``announced`` word moved takes its envs' states before the step.
- Before a snapshot step is sent the parent writes, for each env, the slot
  to write (``targets``): the one not holding its last snapshot. That slot
  becomes the env's when its answer comes; a worker that dies while writing
  leaves the last snapshot whole.
"""

from __future__ import annotations

import math
import struct
import weakref
from typing import Any

from parallelenv.backends.subproc.shm import close_segment, open_segment, segment_for
from parallelenv.calls import Reply, Step
from parallelenv.state.capture import ALE, MUJOCO, PICKLE, PROTOCOL, TENSOR, EnvState

__all__ = ["SlotState", "StateSlots", "WorkerSlots"]

MIN_SLOT_BYTES = 16 * 1024
ROOM = 4  # a slot's size over the largest state seen: an env's state may grow (a longer episode's history)
_WAYS = (PROTOCOL, MUJOCO, ALE, PICKLE, TENSOR)
# A slot's way where it holds a refusal: its reason, or none where it is the reason the env's last refusal gave
# (an env that cannot be snapshotted says why once, not on every snapshot step).
_REFUSED, _REFUSED_AGAIN = len(_WAYS), len(_WAYS) + 1
_REASON_GIVEN_BEFORE = "its state could not be taken, for the reason given on an earlier snapshot step"
_HEAD = struct.Struct("<IBH")  # the record's bytes, the way's index, the class name's length
_WAY_AT = 4  # the way's byte in the head
_TARGETS_AT = 8  # after the announced word; then each env's target byte, then the slots


class _Area:
    """The segment's views: the ``announced`` word, each env's target slot, the slots themselves."""

    def __init__(self, segment: Any, num_envs: int, slot_bytes: int, owner: bool) -> None:
        self.segment, self.num_envs, self.slot_bytes = segment, num_envs, slot_bytes
        buf = segment.buf
        # Memoryviews, not arrays: a snapshot step reads and writes a few items of each, which NumPy
        # does at several times the cost.
        self.announced = buf[:8].cast("q")
        self.targets = buf[_TARGETS_AT:_TARGETS_AT + num_envs]
        self._view: memoryview | None = buf
        # The parent's: the slot of each env's last snapshot (one the first snapshot step does not write).
        self.current = bytearray(b"\x01") * num_envs if owner else bytearray()
        # The segment goes with the last reference to it: a state kept from it outlives its replacement by
        # larger slots.
        self._finalizer = weakref.finalize(self, _release, segment, owner, (self.announced, self.targets))

    @staticmethod
    def _slots_at(num_envs: int) -> int:
        return _TARGETS_AT + math.ceil(num_envs / 8) * 8

    @staticmethod
    def size(num_envs: int, slot_bytes: int) -> int:
        return _Area._slots_at(num_envs) + 2 * num_envs * slot_bytes

    def _at(self, env_id: int, slot: int) -> int:
        return self._slots_at(self.num_envs) + (2 * env_id + slot) * self.slot_bytes

    def write(self, env_id: int, state: EnvState | str, again: bool = False) -> bool:
        """Put ``state`` (a refusal's reason where a str; ``again``: the env's last refusal's) in the slot
        the parent named for ``env_id``; False where it does not fit."""
        if isinstance(state, EnvState):
            way, name, data = _WAYS.index(state.way), state.env_class.encode(), state.data
        else:
            way, name, data = (_REFUSED_AGAIN, b"", b"") if again else (_REFUSED, b"", state.encode())
        size = _HEAD.size + len(name) + len(data)
        if size > self.slot_bytes or self._view is None:
            return False
        at = self._at(env_id, self.targets[env_id])
        view = self._view
        _HEAD.pack_into(view, at, size, way, len(name))
        view[at + _HEAD.size:at + _HEAD.size + len(name)] = name
        view[at + _HEAD.size + len(name):at + size] = data
        return True

    def way_at(self, env_id: int, slot: int) -> int:
        return self.slots_view()[self._at(env_id, slot) + _WAY_AT]

    def reason(self, env_id: int, slot: int) -> str:
        at = self._at(env_id, slot)
        size = _HEAD.unpack_from(self.slots_view(), at)[0]
        return bytes(self.slots_view()[at + _HEAD.size:at + size]).decode()

    def slots_view(self) -> memoryview:
        if self._view is None:
            raise ValueError("this state was kept by a ParallelEnv that is closed: take it while it runs")
        return self._view

    def read(self, env_id: int, slot: int) -> EnvState:
        view, at = self.slots_view(), self._at(env_id, slot)
        size, way, name_size = _HEAD.unpack_from(view, at)
        data = bytes(view[at + _HEAD.size:at + size])
        return EnvState(_WAYS[way], data[:name_size].decode(), data[name_size:])

    def close(self) -> None:
        self._view = None
        self._finalizer()


def _release(segment: Any, owner: bool, views: tuple[memoryview, ...]) -> None:
    for view in views:  # before the segment, which cannot close while they are over it
        view.release()
    close_segment(segment)
    if owner:
        segment.unlink()


class SlotState:
    """An env's snapshot in its slot; pickled, it is the :class:`~parallelenv.state.capture.EnvState` itself."""

    __slots__ = ("_area", "_env_id", "_slot")

    def __init__(self, area: _Area, env_id: int, slot: int) -> None:
        self._area, self._env_id, self._slot = area, env_id, slot

    def read(self) -> EnvState:
        return self._area.read(self._env_id, self._slot)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        state = self.read()
        return EnvState, (state.way, state.env_class, state.data)

    def __repr__(self) -> str:
        return f"SlotState(env {self._env_id}, slot {self._slot})"


class StateSlots:
    """The parent's end: which worker knows what, the slots each snapshot step writes, its replies' states."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self._area: _Area | None = None
        # Every segment made, the larger slots' predecessors too while a state kept from them lives: each
        # goes at close(), not when the last such state is collected.
        self._made: weakref.WeakSet[_Area] = weakref.WeakSet()
        self._pending: dict[int, int] = {}  # env id -> the slot its snapshot step under way writes
        self._reasons: dict[int, str] = {}  # the reason each env's last refusal gave in a slot
        self.expecting = False  # a snapshot step was sent: its replies may bring states to size the slots by
        self._needed = 0  # the largest state that came on a pipe since the slots were made

    def told(self, trusted: frozenset[str]) -> tuple[Any, frozenset[str]] | None:
        """What a worker that knows the slots and ``trusted`` was told (compare ``Worker.told_slots``)."""
        return None if self._area is None else (self._area, trusted)

    def all_told(self, workers: list[Any], trusted: frozenset[str]) -> bool:
        """Whether every one of ``workers`` knows the slots and ``trusted`` (a snapshot step may be announced)."""
        told = self.told(trusted)
        return told is not None and all(worker.told_slots == told for worker in workers)

    def tell(self, worker: Any, trusted: frozenset[str]) -> bytes:
        """What a snapshot step on ``worker``'s pipe says of the slots: nothing where it knows them
        (``worker.told_slots``, which says what it knows after this step)."""
        told, worker.told_slots = worker.told_slots, self.told(trusted)
        area = self._area
        if area is None or (told is not None and told[0] is area):
            return b""
        return f"{area.segment.name}\n{area.num_envs}\n{area.slot_bytes}".encode()

    def aim(self, env_ids: tuple[int, ...], announce: bool = False) -> None:
        """A snapshot step of ``env_ids`` is about to be sent (``announce``: through the counted step's
        wake-up, not on the pipes): name the slot each env writes."""
        self.expecting = True
        area = self._area
        if area is None:
            return
        current, targets, pending = area.current, area.targets, self._pending
        for env_id in env_ids:
            pending[env_id] = targets[env_id] = 1 - current[env_id]
        if announce:
            area.announced[0] += 1

    def fill(self, replies: list[Reply]) -> list[Reply]:
        """``replies`` with each aimed env's state: its slot's, or the one its reply brought on the pipe."""
        pending, area = self._pending, self._area
        filled = []
        for reply in replies:
            if reply.call_type is not Step:  # a call its worker could not read: no state was taken
                self.lost(list(reply.env_ids))
            else:
                kept = {}
                states = reply.states or {}
                for env_id in reply.env_ids:
                    slot = pending.pop(env_id, None)
                    if slot is not None and env_id not in states:
                        assert area is not None
                        way = area.way_at(env_id, slot)
                        if way == _REFUSED:
                            kept[env_id] = self._reasons[env_id] = area.reason(env_id, slot)
                        elif way == _REFUSED_AGAIN:
                            kept[env_id] = self._reasons.get(env_id, _REASON_GIVEN_BEFORE)
                        else:  # the env's snapshot from now on; a refusal leaves the last one's slot alone
                            kept[env_id] = SlotState(area, env_id, slot)
                            area.current[env_id] = slot
                if states:
                    self._needed = max(self._needed, *(s.nbytes + len(s.env_class) + _HEAD.size
                                                       for s in states.values() if isinstance(s, EnvState)), 0)
                if kept:
                    reply = reply.with_states({**states, **kept})
            filled.append(reply)
        self.expecting = bool(pending)
        # Made at the first snapshot step's replies, a step that only brought refusals too: a refusal is
        # written to the slots, and the steps that follow are announced.
        if area is None or self._needed > area.slot_bytes:
            self._make(self._needed)
        return filled

    def lost(self, env_ids: list[int]) -> None:
        for env_id in env_ids:
            self._pending.pop(env_id, None)

    def _make(self, needed: int) -> None:
        slot_bytes = max(MIN_SLOT_BYTES, math.ceil(ROOM * needed / 4096) * 4096)
        segment = segment_for(_Area.size(self.num_envs, slot_bytes), self.num_envs)
        self._area, self._needed = _Area(segment, self.num_envs, slot_bytes, owner=True), 0
        self._made.add(self._area)
        # Answers still to come were aimed at the old slots: they bring no state, and the journal keeps
        # the snapshots it has of those envs.
        self._pending.clear()

    def close(self) -> None:
        for area in list(self._made):
            area.close()
        self._area = None


class WorkerSlots:
    """A worker's end: the segment it was told of, and whether the step it runs writes its states there."""

    def __init__(self) -> None:
        self._area: _Area | None = None
        self._path = ""
        self._seen = 0
        self.trusted: frozenset[str] = frozenset()
        self.aimed = False  # the step being run writes its states to the slots
        self._refused: dict[int, str] = {}  # the reason each env's last refusal written to the slots gave

    def learn(self, announcement: bytes, trusted: frozenset[str]) -> None:
        """A snapshot step came on the pipe: its slots (where it names them) and trusted classes."""
        if announcement:
            path, num_envs, slot_bytes = announcement.decode().split("\n")
            if path != self._path:
                if self._area is not None:
                    self._area.close()
                # Answers aimed at the old slots bring the parent nothing (StateSlots._make): each reason again.
                self._refused.clear()
                self._area = _Area(open_segment(path), int(num_envs), int(slot_bytes), owner=False)
                self._path = path
                self._seen = self._area.announced[0]
        self.trusted = trusted
        self.aimed = self._area is not None

    def announced(self, step: Step) -> Step:
        """``step`` (of the whole group, announced), taking its envs' states first where the parent said so."""
        area = self._area
        if area is None or area.announced[0] == self._seen:
            return step
        self._seen = area.announced[0]
        self.aimed = True
        return Step(step.env_ids, snapshot=self.trusted)

    def keep(self, reply: Reply) -> Reply:
        """``reply`` without the states written to their slots (what does not fit stays in it)."""
        if not self.aimed:
            return reply
        self.aimed = False
        if reply.states is None:
            return reply
        area, refused = self._area, self._refused
        assert area is not None
        left = {}
        for env_id, state in reply.states.items():
            if isinstance(state, EnvState):
                written = area.write(env_id, state)
            else:  # why it could not be taken: said once, and then as "again" while the reason stays
                written = area.write(env_id, state, again=refused.get(env_id) == state)
                if written:
                    refused[env_id] = state
            if not written:
                left[env_id] = state
        return reply.with_states(left or None)

    def close(self) -> None:
        if self._area is not None:
            self._area.close()
            self._area = None


