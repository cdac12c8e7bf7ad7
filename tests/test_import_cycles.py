"""No import cycles between the package's modules, read from the source with ``ast``.

Every ``import`` of a parallelenv module counts wherever it is written: at
module level, inside a function (a lazy import only hides a cycle until the
call) and under ``if TYPE_CHECKING:`` (a type checker follows it, and a
cycle there is a layering knot all the same). ``from parallelenv.a import b``
is an edge to ``parallelenv.a.b`` where that is a module, else to
``parallelenv.a``: a package's ``__init__`` is a module like the others.
Importing ``parallelenv.a.b`` also runs ``parallelenv.a``'s ``__init__``, but
that is not counted: every submodule would then depend on its package.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "parallelenv"

Graph = dict[str, dict[str, list[int]]]  # module -> module it imports -> the lines of those imports


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package in folder ``root``, by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph(root: Path) -> Graph:
    """Which of the package's modules each one imports, and on what lines."""
    modules = module_names(root)
    graph: Graph = {name: {} for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node, name, is_package, modules):
                graph[name].setdefault(target, []).append(node.lineno)
    return graph


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [found for alias in node.names if (found := _longest_module(alias.name, modules))]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        # A package's own __init__ is the base of its level-1 imports; a plain module's is its package.
        base = module.split(".")
        drop = node.level - 1 if is_package else node.level
        base = base[: len(base) - drop] if drop else base
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    targets = []
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        found = submodule if submodule in modules else _longest_module(source, modules)
        if found:
            targets.append(found)
    return targets


def _longest_module(dotted: str, modules: dict[str, Path]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in modules:
            return candidate
    return None


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components of ``graph`` that hold a cycle (more than one module, or one importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # Iterative, so that a deep chain of imports cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return sorted(found)


def cycles(graph: Graph) -> list[list[str]]:
    """Simple cycles that between them use every import inside every cycle-holding component: for each
    such import ``a -> b``, a shortest way back from ``b`` to ``a``. Each is ``[a, b, ..., a]``."""
    chains: dict[tuple[str, ...], list[str]] = {}
    for component in strongly_connected(graph):
        members = set(component)
        for first in component:
            for second in sorted(graph[first]):
                if second not in members:
                    continue
                chain = [first, *_shortest_path(graph, members, second, first)]
                # One key per cycle, whichever module it was found from.
                turn = chain[:-1].index(min(chain[:-1]))
                key = tuple(chain[turn:-1] + chain[:turn])
                chains.setdefault(key, [*key, key[0]])
    return [chains[key] for key in sorted(chains)]


def _shortest_path(graph: Graph, members: set[str], start: str, end: str) -> list[str]:
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == end:
            break
        for successor in sorted(graph[node]):
            if successor in members and successor not in came_from:
                came_from[successor] = node
                queue.append(successor)
    path: list[str] = []
    step: str | None = end
    while step is not None:
        path.append(step)
        step = came_from[step]
    return path[::-1]


def describe(graph: Graph, chain: list[str]) -> str:
    """``a -> b -> a``, each arrow with the lines of ``a`` that import ``b``."""
    text = chain[0]
    for importer, imported in zip(chain, chain[1:], strict=False):
        lines = ",".join(str(line) for line in sorted(set(graph[importer][imported])))
        text += f" -(line {lines})-> {imported}"
    return text


def test_the_package_has_no_import_cycles():
    graph = import_graph(PACKAGE_ROOT)
    assert len(graph) > 50 and graph["parallelenv"], "the walk found too little of the package to judge it"
    found = [describe(graph, chain) for chain in cycles(graph)]
    if found:
        pytest.fail(f"{len(found)} import cycle(s), each arrow with its lines in the importer:\n" + "\n".join(found),
                    pytrace=False)


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_finder_names_a_two_module_cycle_with_its_lines(tmp_path):
    package = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "import os\n\nfrom pkg.b import thing\n",
        "b.py": "def later():\n    from . import a\n",
    })
    graph = import_graph(package)
    assert [describe(graph, chain) for chain in cycles(graph)] == ["pkg.a -(line 3)-> pkg.b -(line 2)-> pkg.a"]


def test_the_finder_follows_type_checking_and_package_imports(tmp_path):
    package = _write(tmp_path, {
        "__init__.py": "from pkg.sub.c import C\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import pkg\n    from .. import D\n",
    })
    graph = import_graph(package)
    assert graph["pkg.sub.c"] == {"pkg": [4, 5]}
    assert cycles(graph) == [["pkg", "pkg.sub.c", "pkg"]]


def test_the_finder_passes_an_acyclic_package_and_ignores_other_packages(tmp_path):
    package = _write(tmp_path, {
        "__init__.py": "from pkg.a import A\nfrom pkg.sub import b\n",
        "a.py": "import numpy\nfrom pkg.sub.b import B\n",
        "sub/__init__.py": "",
        "sub/b.py": "import pkgother\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy.typing\n",
    })
    graph = import_graph(package)
    assert graph["pkg"] == {"pkg.a": [1], "pkg.sub.b": [2]}
    assert graph["pkg.a"] == {"pkg.sub.b": [2]}
    assert cycles(graph) == []


@pytest.mark.parametrize("loop", ["from pkg import a\n", "import pkg.a as me\n"])
def test_the_finder_sees_a_module_importing_itself(tmp_path, loop):
    package = _write(tmp_path, {"__init__.py": "", "a.py": loop})
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.a"]]
