"""Env state as a value: take it, put it back, check that it continues exactly, save a run and resume it.

:mod:`~parallelenv.state.capture` takes one env's state where the env runs;
:mod:`~parallelenv.state.check` verifies that an env's state continues
exactly; :mod:`~parallelenv.state.front` is the ParallelEnv's side
(``get_state``, ``set_state``, ``save``, ``load``).
"""

from parallelenv.state.capture import EnvState, StateError
from parallelenv.state.check import StateCheck, check_state

__all__ = ["EnvState", "StateCheck", "StateError", "check_state"]
