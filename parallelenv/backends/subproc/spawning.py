"""How worker processes start: the start method, and what each inherits from the caller.

The subprocess backend starts its workers with these, and so does the Ray
backend's ``ray-subproc`` host, which runs a subprocess backend inside an actor.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
from collections.abc import Iterator
from typing import Any

from parallelenv.backends.subproc import forkserver_folder


def default_start_method() -> str:
    # forkserver: as safe as spawn (never forks a parent that runs threads, as
    # Ray or torch do) and nearly as fast as fork, since the server preloads
    # numpy and gymnasium once and forks each worker from that state.
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def start_context(start_method: str | None) -> Any:
    """The multiprocessing context of ``start_method`` (default: :func:`default_start_method`)."""
    method = start_method or default_start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["parallelenv.backends.subproc.forkserver_preload"])
        forkserver_folder.mark_and_sweep()
    return ctx


@contextlib.contextmanager
def main_module_not_rerun() -> Iterator[None]:
    """Start processes without making them re-run the caller's script.

    spawn and forkserver children import ``__main__`` from its path so that
    pickles can refer to it. Ours never do: env factories travel by
    cloudpickle, which sends ``__main__`` objects by value. Without this, a
    script that builds a ParallelEnv at top level, without the
    ``if __name__ == "__main__"`` guard, would start workers that start workers.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main.__spec__, "name", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


@contextlib.contextmanager
def single_threaded_numerics() -> Iterator[None]:
    """Start workers with one BLAS/OpenMP thread each, unless the user chose otherwise.

    There is already one worker per core; a multi-threaded BLAS in each would
    oversubscribe the cores and spin threads the envs need. This takes effect
    when the worker (or the forkserver, the first time) starts its numpy.
    """
    added = [name for name in _THREAD_VARIABLES if name not in os.environ]
    os.environ.update({name: "1" for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
