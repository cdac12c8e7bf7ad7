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

from parallelenv.arrays import Tree, concatenate, is_tensor, stack, take_rows, tree_map
from parallelenv.errors import EnvError, NoPendingCallError, ParallelEnvError
from parallelenv.infos import env_info, vector_info
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
        arrived: dict[int, tuple[Any, ...]] = {}  # results received before their half was waited for
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

    def _settle_halves(self, halves: Sequence[_Half], arrived: dict[int, tuple[Any, ...]]) -> Settled:
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

    def _received(self, wanted: np.ndarray, arrived: dict[int, tuple[Any, ...]]) -> tuple[Any, ...]:
        """The step results of the envs ``wanted``, in that order, batched as ``step`` batches them.

        ``recv`` hands over whatever has answered. Mostly that is the half
        waited for, in env order (the order it was sent in), and it is
        used as it comes; envs of the other half, or a half that answers in
        parts, wait in ``arrived`` one env at a time until the half is whole.
        """
        missing = int(sum(i not in arrived for i in wanted.tolist()))
        while missing:
            results = self.penv.recv(wait_num=missing)  # own arrays: only the tensor backend lends its buffers
            env_ids = results[4].pop("env_id")
            del results[4]["_env_id"]
            if missing == len(wanted) and np.array_equal(env_ids, wanted):
                return results
            _keep_each_env(results, env_ids, arrived)
            missing = int(sum(i not in arrived for i in wanted.tolist()))
        obs, reward, terminated, truncated, infos = zip(*(arrived.pop(i) for i in wanted.tolist()), strict=True)
        # Rebuilt from each env's entries, the vector info holds what collect
        # reads (``ended_state``) exactly; a NumPy scalar of another key may
        # come back as a Python number.
        info = vector_info(enumerate(infos), len(wanted))
        return stack(obs), np.array(reward), np.array(terminated), np.array(truncated), info

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


def _keep_each_env(results: tuple[Any, ...], env_ids: np.ndarray, arrived: dict[int, tuple[Any, ...]]) -> None:
    """Each env's row of batched step results, into ``arrived``."""
    obs, reward, terminated, truncated, info = results
    for p, i in enumerate(env_ids.tolist()):
        own_info = env_info(info, p) if info else {}
        arrived[i] = (tree_map(lambda x, p=p: x[p], obs), reward[p], terminated[p], truncated[p], own_info)


def _env_columns(leaves: Sequence[Any], in_env_order: np.ndarray) -> Any:
    """Time-major leaves of the halves' envs, joined along the env axis and put in env order."""
    if is_tensor(leaves[0]):
        torch = sys.modules["torch"]
        joined = torch.cat(leaves, dim=1) if len(leaves) > 1 else leaves[0]
        return joined[:, torch.as_tensor(in_env_order, device=joined.device)]
    joined = np.concatenate(leaves, axis=1) if len(leaves) > 1 else leaves[0]
    return joined[:, in_env_order]
