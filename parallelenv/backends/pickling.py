"""The one pickler for what the caller's code sends to where the envs run.

cloudpickle, since it sends by value what the user's script (``__main__``)
defines, which a worker could not import; but code keeps its file name.
After its 3.1.2 release (cloudpipe/cloudpickle#560, for 3.2) cloudpickle
names every code object it sends ``<dynamic-code>``, so that a payload does
not depend on where the code was written. An env class of the training script would then
raise in a worker with ``File "<dynamic-code>", line 5, in step`` and no
source line. Here each code object gets its own file name back when it is
unpickled, so that the traceback of an :class:`~parallelenv.EnvError` names
the user's file, and shows the line wherever that file can be read.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle


def dumps(obj: Any, pickler: type[pickle.Pickler] | None = None) -> bytes:
    """``obj`` pickled as :func:`cloudpickle.dumps` does, its code under its own file names; ``pickler``:
    a subclass of :class:`Pickler` with reductions of its own."""
    with io.BytesIO() as file:
        (pickler or Pickler)(file, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        return file.getvalue()


def _reduce_code(code: types.CodeType) -> tuple[Any, ...]:
    # cloudpickle's own reduction, whose arguments change with the Python
    # version, is kept as it is; only the file name is put back after it.
    constructor, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return _with_file_name, (constructor, args, code.co_filename)


def _with_file_name(constructor: Any, args: tuple[Any, ...], file_name: str) -> types.CodeType:
    return constructor(*args).replace(co_filename=file_name)


class Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)
