"""The library's own info keys are named in one module, parallelenv.infos.keys, and spelled nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import parallelenv
from parallelenv import infos
from parallelenv.infos import keys

PACKAGE = Path(parallelenv.__file__).parent
KEYS_MODULE = Path(keys.__file__).resolve()

# Every key and the mask beside it, as strings: what no other module may spell as an info key.
SPELLINGS = {spelling for key in keys.LIBRARY_KEYS for spelling in (key, keys.MASK_PREFIX + key)}

# String literals equal to a key that are no info key: (module, the top-level name they are under).
NOT_INFOS = {
    ("policies.py", "POLICIES"): "the asynchronous policies by name ('idle')",
    ("integrations/registration.py", "register_vector_env"): "gym.register's kwargs: make_vector_env's env_id",
}

_KEYED_CALLS = {"get", "pop", "setdefault"}


def _owner(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node of a module by the name of the top-level statement it is in (a def, a class, an assignment)."""
    owners: dict[ast.AST, str] = {}
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = statement.name
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), "")
        else:
            name = ""
        for node in ast.walk(statement):
            owners[node] = name
    return owners


def _as_keys(tree: ast.Module) -> list[ast.Constant]:
    """The string literals of ``tree`` used as a dict's key: ``x["k"]`` (read, written or deleted), a dict
    literal's key, ``x.get/pop/setdefault("k")``, ``"k" in x``, a member of a set literal, and a member of a
    tuple or list bound to a name holding ``KEYS``."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            found.append(node.slice)
        elif isinstance(node, ast.Dict):
            found.extend(key for key in node.keys if key is not None)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KEYED_CALLS:
            found.extend(node.args[:1])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            found.append(node.left)
        elif isinstance(node, ast.Set):
            found.extend(node.elts)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple | ast.List) and any(
                isinstance(target, ast.Name) and "KEYS" in target.id for target in node.targets):
            found.extend(node.value.elts)
    return [node for node in found if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def spelled_keys(root: Path = PACKAGE) -> list[str]:
    """``path:line: 'key'`` for each info key of the library spelled as a literal outside keys.py."""
    spelled = []
    for path in sorted(root.rglob("*.py")):
        if path.resolve() == KEYS_MODULE:
            continue
        module = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        owners = _owner(tree)
        for literal in _as_keys(tree):
            if literal.value in SPELLINGS and (module, owners.get(literal, "")) not in NOT_INFOS:
                spelled.append(f"{module}:{literal.lineno}: {literal.value!r}")
    return spelled


def test_no_module_but_keys_spells_an_info_key_of_the_library():
    assert spelled_keys() == [], "import these keys from parallelenv.infos.keys"


@pytest.mark.parametrize("line", [
    'info["idle"] = mask',
    'info["_env_id"] = mask',
    'info = {**info, "reset": True}',
    'info.pop("TimeLimit.truncated", None)',
    'found = "final_obs" in info',
    'RESERVED = frozenset({"env_id"})',
    'CUT_KEYS = (A, "failure")',
    'del info["_ended_state"]',
])
def test_a_key_spelled_elsewhere_is_found(tmp_path, line):
    (tmp_path / "writer.py").write_text(f"def write(info, mask):\n    {line}\n")
    (tmp_path / "policies.py").write_text('POLICIES = {"idle": 1}\nmethod = "reset"\nwhy = ("reset", 1)\n')
    assert spelled_keys(tmp_path) == [f"writer.py:2: {literal!r}" for literal in _literals(line)]


def _literals(line: str) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(line)) if isinstance(node, ast.Constant)
            and node.value in SPELLINGS]


def test_the_keys_module_names_each_key_once_and_the_package_re_exports_it():
    values = [value for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)
              and not name.endswith("_MASK") and name != "MASK_PREFIX"]
    assert sorted(values) == sorted(keys.LIBRARY_KEYS)
    assert infos.ENV_RESTARTED is keys.ENV_RESTARTED and infos.WORKER_RESTARTED is keys.WORKER_RESTARTED
    assert infos.RESTART_KEYS is keys.RESTART_KEYS
    # The strings are the contract (docs, README, the frameworks' views).
    assert keys.LIBRARY_KEYS == {
        "ended_state", "reset", "reset_info", "idle", "env_id", "worker_restarted", "env_restarted", "failure",
        "final_obs", "final_info", "terminal_observation", "TimeLimit.truncated",
    }
