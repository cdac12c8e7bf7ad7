"""A collection in progress saved and resumed: the ParallelEnv's state and the agent's bookkeeping.

:class:`SavesCollections` is the part of
:class:`~parallelenv.rollout.VecWorker` that writes, between two calls, all
that its next steps depend on but the agent itself: every env's state and
the policy's finished envs (``ParallelEnv.save``), the current observations,
the step count, each env's return and length so far, and the episodes being
recorded. ``VecWorker.load`` builds the ParallelEnv again (on any backend),
gives it the agent the caller passes, and goes on: the steps and episodes
it collects are those the saved worker would have collected.
"""

from __future__ import annotations

import os
from typing import Any

from parallelenv.parallel_env import ParallelEnv
from parallelenv.state.front import SAVE_FORMAT, read_saved, write_at_once

WORKER_FORMAT = "vec_worker_format"


class SavesCollections:
    """VecWorker's ``save`` and ``load`` (see the module's docstring); it reads VecWorker's own fields."""

    penv: ParallelEnv
    _obs: Any
    _record: Any
    _settler: Any

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the collection in progress to ``path`` at once (between two calls: a step of the
        ParallelEnv still under way raises, as ``ParallelEnv.save`` does); :meth:`load` resumes it."""
        write_at_once(path, self.saved())

    def saved(self) -> dict[str, Any]:
        """What :meth:`save` writes, as a picklable dict (a pool worker sends it to its pool)."""
        settings = {name: getattr(self, name) for name in
                    ("max_episode_length", "output", "device", "seed", "worker_number", "overlap")}
        return {
            WORKER_FORMAT: SAVE_FORMAT,
            "penv": self.penv.saved(),
            "settings": settings,
            "progress": {name: getattr(self, name) for name in
                         ("_obs", "_step_count", "_env_is_torch", "_env_device", "_record")},
            "returns": self._settler.returns,
            "lengths": self._settler.lengths,
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str], policy: Any, envs: Any = None, para_mode: str | None = None,
             **options: Any) -> Any:
        """The worker :meth:`save` wrote to ``path``, with the agent ``policy`` (an agent is the caller's:
        its parameters are not in the file), its ParallelEnv built as ``ParallelEnv.load`` builds it from
        ``envs``, ``para_mode`` and ``options``. Its next call goes on where the saved worker stood."""
        return cls.resumed(read_saved(path, WORKER_FORMAT, "VecWorker.save()"), policy, envs, para_mode, **options)

    @classmethod
    def resumed(cls, saved: dict[str, Any], policy: Any, envs: Any = None, para_mode: str | None = None,
                **options: Any) -> Any:
        """:meth:`load` of what :meth:`saved` returned."""
        penv = ParallelEnv.resumed(saved["penv"], envs, para_mode, **options)
        try:
            worker = cls(penv, policy, **saved["settings"])  # type: ignore[call-arg]
        except BaseException:
            penv.close()
            raise
        for name, value in saved["progress"].items():
            setattr(worker, name, value)
        worker._settler.returns[...] = saved["returns"]
        worker._settler.lengths[...] = saved["lengths"]
        return worker
