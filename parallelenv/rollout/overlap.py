"""Overlapped collection: one half of the envs steps while the agent acts for the other.

Sample Factory's double-buffered sampling over the ParallelEnv's ``send`` and
``recv``, as :class:`~parallelenv.rollout.VecWorker` runs it with
``overlap=True``. A mixin of VecWorker, whose ``collect`` calls
``_collect_overlapped``; the state it reads and writes (the current obs,
the step count, the halves), the agent's actions (``_act``) and the
settling of each step (``_settler``, :mod:`parallelenv.rollout.settling`) are VecWorker's.

The halves are the even and the odd env ids: a worker process or Ray actor
hosts a run of consecutive ids and steps them one after another, so a
half's step takes about half a whole step's time only if the half holds
about half of every worker's envs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from parallelenv.arrays import Tree, concatenate, is_tensor, take_rows, tree_map
from parallelenv.errors import EnvError, NoPendingCallError, ParallelEnvError
from parallelenv.infos import env_info, joined_rows, vector_info
from parallelenv.infos.keys import ENV_ID, ENV_ID_MASK
from parallelenv.rollout.trajectories import StepFields, Transitions

if TYPE_CHECKING:
    from parallelenv.parallel_env import ParallelEnv
    from parallelenv.rollout.settling import Settled, Settler


@dataclass
class _Half:
    """One half of the envs in overlapped collection."""

    ids: np.ndarray  # its env ids, every other one (int64)
    obs: Tree  # its obs for its next step, in the order of ids
    sent: tuple[Tree, Tree] | None = None  # the obs and actions of its step in flight


class CollectsOverlapped:
    """VecWorker's ``collect`` with ``overlap=True``; it also uses VecWorker's ``_act`` and ``_settler``."""

    penv: ParallelEnv
    _obs: Tree
    _env_is_torch: bool
    _halves: tuple[np.ndarray, np.ndarray]
    _step_count: int
    _settler: Settler

    def _collect_overlapped(self, num_steps: int, step_numbers: Iterable[int]) -> Transitions:
        """collect, one half of the envs stepping while the agent acts for the other.

        Half 0 is sent for step t+1 before half 1's step t is received, so
        the agent always has a half to act for while the other is away. A
        half settles (episode ends, resets) before its next step is sent, as
        in a plain step; under ``ends_all`` that needs the other half's
        results too, so both settle together and only half 1's agent call
        overlaps a step.
        """
        if self._env_is_torch:
            raise ValueError("overlap=True steps NumPy envs: this ParallelEnv returns tensors, whose steps "
                             "are already asynchronous on their device; use overlap=False")
        halves = [_Half(ids, take_rows(self._obs, ids)) for ids in self._halves]
        # The halves' rows, even ids then odd ones, back in env order.
        in_env_order = np.argsort(np.concatenate(self._halves), kind="stable")
        # What settles at once: each half on its own, or both when one env's end ends all
        # (the ParallelEnv's asynchronous=None rule, penv.policy).
        groups = [halves] if self.penv.policy.ends_all else [[half] for half in halves]
        arrived = _Arrivals()  # results received before their half was waited for
        steps: list[list[StepFields]] = [[] for _ in groups]  # per group; their columns put in env order at the end
        returns: list[float] = []
        lengths: list[int] = []
        try:
            self._send_half(halves[0])
            for t in step_numbers:
                self._send_half(halves[1])  # its actions computed while half 0 steps
                episodes_ended: list[tuple[int, float, int]] = []  # (env id, return, length)
                for g, group in enumerate(groups):
                    settled = self._settle_halves(group, arrived)
                    if g == 0 and t + 1 < num_steps:
                        self._send_half(halves[0])  # its actions computed while half 1 steps
                    steps[g].append(settled.step)
                    ended_ids = np.concatenate([half.ids for half in group])[settled.ended]
                    episodes_ended += zip(ended_ids.tolist(), settled.returns, settled.lengths, strict=True)
                # In env order, as plain collection lists them: the halves interleave.
                for _, episode_return, length in sorted(episodes_ended):
                    returns.append(episode_return)
                    lengths.append(length)
                self._step_count += 1
        except Exception:
            self._receive_the_rest()
            raise
        finally:
            self._obs = take_rows(concatenate([half.obs for half in halves]), in_env_order)
        batch = Transitions.from_steps(steps[0], returns, lengths)
        parts = [batch] if len(steps) == 1 else [batch, Transitions.from_steps(steps[1], [], [])]
        joined = {f.name: tree_map(lambda *leaves: _env_columns(leaves, in_env_order),
                                   *(getattr(part, f.name) for part in parts))
                  for f in fields(StepFields)}
        return replace(batch, **joined)

    def _send_half(self, half: _Half) -> None:
        action, env_action = self._act(half.obs, half.ids)
        self.penv.send(env_action, id=half.ids)
        half.sent = (half.obs, action)

    def _settle_halves(self, halves: Sequence[_Half], arrived: _Arrivals) -> Settled:
        """Receive the step in flight of ``halves`` and settle it as one, their envs in the halves' order."""
        rows = np.concatenate([half.ids for half in halves])
        sent = [half.sent for half in halves]
        assert all(part is not None for part in sent), "a half is settled only after it was sent"
        if len(sent) == 1:
            obs, action = sent[0]
        else:
            obs, action = (concatenate(parts) for parts in zip(*sent, strict=True))
        settled = self._settler.settle(rows, obs, action, self._received(rows, arrived))
        start = 0
        for half in halves:
            stop = start + len(half.ids)
            half.obs, half.sent = tree_map(lambda x, a=start, b=stop: x[a:b], settled.obs), None
            start = stop
        return settled

    def _received(self, wanted: np.ndarray, arrived: _Arrivals) -> tuple[Any, ...]:
        """The step results of the envs ``wanted``, in that order, batched as ``step`` batches them.

        ``recv`` hands over whatever has answered. Mostly that is the half
        waited for, in env order (the order it was sent in), and it is used
        as it comes; what holds envs of the other half, or part of the half,
        waits in ``arrived`` until the half is whole.
        """
        missing = arrived.missing(wanted)
        while missing:
            results = self.penv.recv(wait_num=missing)  # own arrays: only the tensor backend lends its buffers
            env_ids = results[4].pop(ENV_ID)
            del results[4][ENV_ID_MASK]
            if missing == len(wanted) and np.array_equal(env_ids, wanted):
                return results
            arrived.add(env_ids, results)
            missing = arrived.missing(wanted)
        return arrived.take(wanted)

    def _receive_the_rest(self) -> None:
        """Receive what is still in flight after an error, so that the ParallelEnv is left with no
        call pending, as a failed ``step`` leaves it."""
        while True:
            try:
                self.penv.recv()
            except NoPendingCallError:
                return
            except EnvError:
                continue  # another env of the step raised too; the first error is the one raised
            except ParallelEnvError:
                return  # a lost worker or a closed ParallelEnv: nothing is left to receive


class _Arrivals:
    """Step results received before their half was waited for, kept as ``recv`` returned them.

    A half is taken out of them as whole rows, one copy per array, however
    many returns it came in: across 32 workers the halves' answers mix in
    most steps, and taking each env's row and info apart would cost every
    step a pass per env.
    """

    def __init__(self) -> None:
        self._batches: dict[int, list[Any]] = {}  # number -> [results, how many of its envs are not taken]
        self._where: dict[int, tuple[int, int]] = {}  # env id -> (batch number, row)
        self._added = 0

    def missing(self, wanted: np.ndarray) -> int:
        where = self._where
        return sum(i not in where for i in wanted.tolist())

    def add(self, env_ids: np.ndarray, results: tuple[Any, ...]) -> None:
        number, self._added = self._added, self._added + 1
        ids = env_ids.tolist()
        self._batches[number] = [results, len(ids)]
        for row, i in enumerate(ids):
            self._where[i] = (number, row)

    def take(self, wanted: np.ndarray) -> tuple[Any, ...]:
        """The results of ``wanted`` (all arrived), in that order; they are no longer kept."""
        rows_of: dict[int, tuple[list[int], list[int]]] = {}  # batch number -> (its rows, their positions)
        for position, i in enumerate(wanted.tolist()):
            number, row = self._where.pop(i)
            rows, positions = rows_of.setdefault(number, ([], []))
            rows.append(row)
            positions.append(position)
        parts = [(self._batches[number][0], np.array(rows), np.array(positions))
                 for number, (rows, positions) in rows_of.items()]
        for number, (rows, _) in rows_of.items():
            self._batches[number][1] -= len(rows)
            if not self._batches[number][1]:
                del self._batches[number]
        order = np.argsort(np.concatenate([positions for _, _, positions in parts]), kind="stable")
        obs, reward, terminated, truncated = (
            take_rows(concatenate([take_rows(results[k], rows) for results, rows, _ in parts]), order)
            for k in range(4))
        n = len(wanted)
        info = joined_rows([(results[4], rows, positions) for results, rows, positions in parts], n)
        if info is None:  # a key of other dtypes in two returns: each env's info, merged again
            own: list[dict[str, Any]] = [{}] * n
            for results, rows, positions in parts:
                for row, position in zip(rows.tolist(), positions.tolist(), strict=True):
                    own[position] = env_info(results[4], row)
            # In the half's order, as a step merges them: a key's array is made for its first value.
            info = vector_info(enumerate(own), n)
        return obs, reward, terminated, truncated, info


def _env_columns(leaves: Sequence[Any], in_env_order: np.ndarray) -> Any:
    """Time-major leaves of the halves' envs, joined along the env axis and put in env order."""
    if is_tensor(leaves[0]):
        torch = sys.modules["torch"]
        joined = torch.cat(leaves, dim=1) if len(leaves) > 1 else leaves[0]
        return joined[:, torch.as_tensor(in_env_order, device=joined.device)]
    joined = np.concatenate(leaves, axis=1) if len(leaves) > 1 else leaves[0]
    return joined[:, in_env_order]
