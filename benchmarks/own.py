"""Modules of this checkout's ``parallelenv`` that the harness itself runs, loaded by path: never REV's.

With ``--against REV`` a measuring process imports REV's ``parallelenv``
(its folder comes first on the path, :mod:`benchmarks.child`), and REV may be
as old as 87653c1, which has no ``parallelenv.backends.subproc.futex``, or
hold another version of what the harness uses. So the code the harness runs
in a measuring process imports only the measured package's public API (in
the wrappers), and what it needs of the package's internals for itself (the
lockstep bound's futex and its tie of a process to its parent) it loads from
this checkout's file by path, under a private module name: both sides of a
comparison then run the very same harness, with no copy of that code to keep
in step. A module loaded so must import nothing of ``parallelenv`` (a
relative or ``parallelenv`` import inside it would reach the measured package
again): :func:`own_module` refuses one that does.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "parallelenv"
PRIVATE_PREFIX = "_harness_parallelenv"  # sys.modules name of what own_module loads: not the measured package's


def own_module(dotted: str) -> ModuleType:
    """This checkout's ``parallelenv.<dotted>`` (e.g. ``backends.subproc.futex``), whichever ``parallelenv``
    the process imports; loaded once per process, as ``_harness_parallelenv.<dotted>``."""
    name = f"{PRIVATE_PREFIX}.{dotted}"
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    path = PACKAGE_DIR.joinpath(*dotted.split(".")).with_suffix(".py")
    _check_imports(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}", name=name, path=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs, as an import does: ctypes, dataclasses look it up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _check_imports(path: Path) -> None:
    """Refuse a module that imports its own package: loaded by path, that import would be the measured one's."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for imported in names:
            if imported.startswith(".") or imported.partition(".")[0] == "parallelenv":
                raise ImportError(f"{path} imports {imported}: the harness loads by path only a module that "
                                  "imports nothing of parallelenv (else it runs the measured package's code "
                                  "again)", path=str(path))
