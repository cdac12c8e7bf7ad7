"""A pool's collections saved and resumed: each worker's envs' states and its agent's bookkeeping.

:class:`SavesPool` is the part of :class:`~parallelenv.RolloutPool` that
asks each worker for its VecWorker's collection in progress
(:meth:`~parallelenv.rollout.VecWorker.saved`) and writes them, with the
envs' factories, to one file; ``RolloutPool.load`` starts a pool of as many
workers and has each go on from its saved collection. The agent is the
caller's: its weights are not in the file.
"""

from __future__ import annotations

import os
from typing import Any

import cloudpickle

from parallelenv.pool.messages import ResumeCollection, SaveCollection
from parallelenv.state.capture import trusted_classes
from parallelenv.state.front import SAVE_FORMAT, read_saved, write_at_once

POOL_FORMAT = "rollout_pool_format"


class SavesPool:
    """RolloutPool's ``save`` and ``load`` (see the module's docstring); it uses RolloutPool's own calls."""

    num_envs: int
    num_workers: int
    _payloads: list[tuple[bytes, ...]]
    _slots: list[Any]
    _calls: int

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every worker's collection in progress to ``path`` at once; :meth:`load` resumes them.

        Each worker saves once it has served what it was sent before: under ``mode="async"`` the batches
        it collected ahead are still handed out by this pool's next calls, and the file holds the envs
        as they stand after them.
        """
        self._check_open()  # type: ignore[attr-defined]
        call = self._ask_every_worker(SaveCollection(trusted_classes()))  # type: ignore[attr-defined]
        parts = self._take(call)  # type: ignore[attr-defined]
        write_at_once(path, {POOL_FORMAT: SAVE_FORMAT, "num_envs": self.num_envs, "num_workers": self.num_workers,
                             "workers": [part.data for part in parts], "envs": self._payloads})

    @classmethod
    def load(cls, path: str | os.PathLike[str], policy: Any, envs: Any = None, **options: Any) -> Any:
        """A pool of the saved number of workers, built with ``options`` as RolloutPool takes them, from
        ``envs`` (default: the saved factories), each worker going on from its saved collection with the
        agent ``policy``."""
        saved = read_saved(path, POOL_FORMAT, "RolloutPool.save()")
        if envs is None:
            envs = [cloudpickle.loads(payload) for group in saved["envs"] for payload in group]
        if options.setdefault("num_workers", saved["num_workers"]) != saved["num_workers"]:
            raise ValueError(f"the file holds {saved['num_workers']} workers' collections, and num_workers="
                             f"{options['num_workers']}")
        pool = cls(envs, policy, **options)  # type: ignore[call-arg]
        try:
            if pool.num_envs != saved["num_envs"]:
                raise ValueError(f"the file holds {saved['num_envs']} envs, and envs= has {pool.num_envs}")
            pool._calls += 1
            for slot, collection in zip(pool._slots, saved["workers"], strict=True):
                pool._send(slot, ResumeCollection(collection), call=pool._calls)
            pool._pump(lambda: not any(slot.sent for slot in pool._slots))
        except BaseException:
            pool.close()
            raise
        return pool
