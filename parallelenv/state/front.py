"""The part of :class:`~parallelenv.ParallelEnv` that takes and puts back its envs' state, and saves and loads it whole.

``get_state``/``set_state`` run on the envs where they are, one call per
host, as any env call does (:mod:`parallelenv.env_calls`); ``save`` writes
every env's state with what the front keeps per env (the policy's finished
envs), and the envs' factories where they pickle, so that ``load`` resumes
the run on any backend, in another process or on another machine.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import cloudpickle
import numpy as np

from parallelenv.array_kinds import Selection
from parallelenv.arrays import to_numpy
from parallelenv.backends import pickling
from parallelenv.backends.base import CallsEachBatchOnce
from parallelenv.calls import NO_ARGUMENT, Call, CallMethod
from parallelenv.serialised import one_caller_at_a_time
from parallelenv.state.capture import EnvState, capture_env, restore_env, trusted_classes

SAVE_FORMAT = 1


class EnvStates:
    """Env state as a value on a ParallelEnv (see the module's docstring)."""

    num_envs: int
    para_mode: str
    asynchronous: str | None
    _calls: Any
    _given_envs: Any

    def _selection(self, id: Any) -> Selection:
        raise NotImplementedError

    def _values(self, call: Call, selection: Selection) -> list[Any]:
        raise NotImplementedError

    def _state_call(self, selection: Selection, states: list[EnvState] | None) -> Call:
        ids, n = selection.env_ids, len(selection)
        if isinstance(self._calls.backend, CallsEachBatchOnce):  # one batched env: its rows, in one call
            return CallMethod(ids, "get_state" if states is None else "set_state",
                              (NO_ARGUMENT,) * n if states is None else tuple(states))
        if states is None:
            return CallMethod(ids, capture_env, (trusted_classes(),) * n)
        return CallMethod(ids, restore_env, tuple(states))

    @one_caller_at_a_time
    def get_state(self, id: Any = None) -> list[EnvState]:
        """The state of each env of ``id`` (every env when None), in its order: what the env's next
        steps depend on, as picklable :class:`~parallelenv.state.EnvState` values. An env whose state
        cannot be taken raises an EnvError naming it and what it lacks (see the env state page).

        Example:
            >>> import gymnasium as gym
            >>> from parallelenv import ParallelEnv, check_state
            >>> check_state(lambda: gym.make("CartPole-v1")).exact  # CartPole's pickle, verified: trusted
            True
            >>> with ParallelEnv([lambda: gym.make("CartPole-v1")] * 2) as penv:
            ...     _ = penv.reset(seed=0)
            ...     states = penv.get_state()
            ...     first = penv.step([0, 1])[0]
            ...     penv.set_state(states)
            ...     again = penv.step([0, 1])[0]
            >>> bool((first == again).all())
            True
        """
        selection = self._selection(id)
        return self._values(self._state_call(selection, None), selection)

    @one_caller_at_a_time
    def set_state(self, states: Any, id: Any = None) -> None:
        """Put ``states`` (one per env of ``id``, from :meth:`get_state`) back into those envs: their next
        steps go on from there. An env of another class refuses its state (an EnvError names it)."""
        selection = self._selection(id)
        states = list(states)
        if len(states) != len(selection):
            raise ValueError(f"{len(states)} states for {len(selection)} envs")
        for state in states:
            if not isinstance(state, EnvState):
                raise TypeError(f"a state is an EnvState from get_state(), not {type(state).__name__}")
        self._values(self._state_call(selection, states), selection)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every env's state, the policy's finished envs and the envs' factories (where they
        pickle) to ``path``, at once (a crash midway leaves any older file whole): :meth:`load` resumes.

        Call it between steps: with results waiting for recv, or a rebuilt env's new episode still
        due, it raises (step or recv once more first)."""
        write_at_once(path, self.saved())

    def saved(self) -> dict[str, Any]:
        """What :meth:`save` writes, as a picklable dict (a VecWorker's save holds it with its own)."""
        resumer = self._calls.resumer
        if resumer is not None and resumer.due:
            raise RuntimeError(f"envs {sorted(resumer.due)} were rebuilt and their new episode is due at the next "
                               "step: save() after it")
        states = self.get_state()
        finished = self._calls.finished
        factories = None
        # A list of envs or factories travels; a batched TensorEnv does not: its pickle loses which of its
        # tensors are views of others (and its state is in the file anyway), so load() takes it again.
        if isinstance(self._given_envs, (list, tuple)):
            try:
                factories = pickling.dumps(self._given_envs)
            except Exception:  # noqa: BLE001  (whatever stops a pickle: load() then takes the envs again)
                factories = None
        return {
            "format": SAVE_FORMAT,
            "num_envs": self.num_envs,
            "para_mode": self.para_mode,
            "asynchronous": self.asynchronous,
            "states": states,
            "finished": to_numpy(finished),
            "factories": factories,
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str], envs: Any = None, para_mode: str | None = None,
             **options: Any) -> Any:
        """A ParallelEnv resumed from :meth:`save`'s file: built from ``envs`` (default: the saved
        factories), on ``para_mode`` (default: the saved one) with ``options`` (``asynchronous``
        defaults to the saved one), every env's state and the finished envs put back. Its next
        :meth:`step` goes on where the saved run stood; no reset is needed.

        Only load files you trust: like any pickle, the file runs code as it loads.
        """
        saved = read_saved(path, "format", "ParallelEnv.save()")
        return cls.resumed(saved, envs, para_mode, **options)

    @classmethod
    def resumed(cls, saved: dict[str, Any], envs: Any = None, para_mode: str | None = None, **options: Any) -> Any:
        """:meth:`load` of what :meth:`saved` returned."""
        if envs is None:
            if saved["factories"] is None:
                raise ValueError("the saved envs did not travel in the file (a TensorEnv, or factories that do not "
                                 "pickle): pass envs=, built as when the ParallelEnv was")
            envs = cloudpickle.loads(saved["factories"])
        options.setdefault("asynchronous", saved["asynchronous"])
        penv = cls(envs, para_mode=saved["para_mode"] if para_mode is None else para_mode, **options)
        try:
            if penv.num_envs != saved["num_envs"]:
                raise ValueError(f"the file holds {saved['num_envs']} envs' states, and envs= builds {penv.num_envs}")
            penv.set_state(saved["states"])
            if penv._calls.policy.tracks_finished:
                finished = penv._calls.finished
                finished[...] = saved["finished"] if isinstance(finished, np.ndarray) \
                    else finished.new_tensor(saved["finished"])
        except BaseException:
            penv.close()
            raise
        return penv


def write_at_once(path: str | os.PathLike[str], saved: Any) -> None:
    """Pickle ``saved`` to ``path`` through a file beside it, renamed over it whole at the end."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False, suffix=".partial") as file:
        file.write(pickling.dumps(saved))
    os.replace(file.name, path)


def read_saved(path: str | os.PathLike[str], key: str, writer: str) -> dict[str, Any]:
    """The dict a save wrote to ``path``, checked to hold ``key`` of this format."""
    with open(path, "rb") as file:
        saved = cloudpickle.load(file)
    if not isinstance(saved, dict) or saved.get(key) != SAVE_FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a file {writer} wrote (format {SAVE_FORMAT})")
    return saved
