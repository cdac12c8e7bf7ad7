"""A step's infos: Gymnasium's vector info layout, and the columns that carry numeric infos in shared memory.

:mod:`parallelenv.infos.keys` names every info key the library itself writes;
:mod:`parallelenv.infos.vector` merges per-env info dicts into a vector
info and reads an env's own info back out of one;
:mod:`parallelenv.infos.columns` lays numeric infos out in shared memory.
"""

from parallelenv.infos.keys import ENV_RESTARTED, RESTART_KEYS, WORKER_RESTARTED
from parallelenv.infos.vector import (
    add_info,
    as_kind,
    ended_states,
    env_info,
    every_scalar_as_python,
    joined_rows,
    numpy_scalars_as_python,
    python_dtypes_as_python,
    rebuilt_envs,
    reset_info,
    step_info,
    vector_info,
)

__all__ = [
    "ENV_RESTARTED", "RESTART_KEYS", "WORKER_RESTARTED", "add_info", "as_kind", "ended_states", "env_info",
    "every_scalar_as_python", "joined_rows", "numpy_scalars_as_python", "python_dtypes_as_python", "rebuilt_envs",
    "reset_info", "step_info", "vector_info",
]
