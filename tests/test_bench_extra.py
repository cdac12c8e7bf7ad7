"""The ``bench`` extra installs what the benchmarks' workloads and peers import, and nothing is found by luck.

A fresh ``pip install -e '.[bench]'`` once lacked ``imageio``, which
Gymnasium's MuJoCo envs import (their renderer): every Gymnasium-based
wrapper failed on ``cheetah8``, while this checkout's venv, where the test
extra had brought it, ran them all. So the test does not ask whether the
imports succeed here: it builds and steps every workload's env, imports every
peer the harness runs, and checks that each distribution those imports
loaded is one the bench extra's requirements (setup.cfg), followed through the
installed packages' own requirements, would install.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What benchmarks/wrappers.py imports for the peers and the harness itself (tqdm, psutil, matplotlib).
PEER_MODULES = ("gymnasium.vector", "stable_baselines3.common.vec_env", "tianshou.env", "ray", "torch", "envpool",
                "tqdm", "psutil", "matplotlib.pyplot")

# Builds and steps one env of every workload whose simulator is here, imports the peers that are here
# (the harness skips the others, saying so), prints the top-level modules loaded.
IMPORT_ALL = f"""
import importlib, importlib.util, json, sys
for hidden in sys.argv[1:]:
    sys.modules[hidden] = None  # as if not installed: importing it raises ImportError
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.workloads import WORKLOADS
here = lambda name: importlib.util.find_spec(name) is not None
for workload in WORKLOADS.values():
    if all(map(here, workload.requires)):
        env = workload.make_env()
        env.reset(seed=0)
        env.step(env.action_space.sample())
        env.close()
for name in {PEER_MODULES!r}:
    if here(name.partition(".")[0]):
        importlib.import_module(name)
print(json.dumps(sorted({{name.partition(".")[0] for name in sys.modules}})))
"""


def bench_requirements() -> list[str]:
    """The bench extra's requirements, as setup.cfg says them now (the installed metadata may be older)."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    section = setup["options"]["install_requires"] + setup["options.extras_require"]["bench"]
    return [line.strip() for line in section.splitlines() if line.strip() and not line.strip().startswith("#")]


def installable(requirements: list[str]) -> tuple[set[str], list[str]]:
    """The distributions ``requirements`` install, through the installed ones' requirements (extras and
    markers followed), and the requirements (of this platform) that are not installed (EnvPool may be
    one: the harness runs without it; what is not installed is not imported either)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    reached: set[str] = set()
    missing: list[str] = []
    todo = [(Requirement(line), "") for line in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        reached.add(name)
        for line in distribution.requires or []:
            wanted = Requirement(line)
            for asked in requirement.extras or {""}:
                todo.append((wanted, asked))
    return reached, missing


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bench_extra_installs_what_every_workload_and_peer_imports():
    pytest.importorskip("packaging")
    pytest.importorskip("mujoco", reason="the bench extra is not installed here")
    from packaging.utils import canonicalize_name

    reached, _ = installable(bench_requirements())
    modules = _import_all()
    assert modules is not None, "the workloads and peers failed to import with every package installed here"
    # Distributions of this interpreter's own site-packages only: another one's, on a path some process
    # of the session left behind, would claim modules that packages here vendor (Ray's colorama).
    site_dirs = {str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("purelib", "platlib")}
    provides: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            if str(Path(metadata.distribution(dist).locate_file("")).resolve()) in site_dirs:
                provides.setdefault(canonicalize_name(dist), set()).add(module)
    ours = {"parallelenv", "benchmarks"}  # from the checkout (other packages ship a "benchmarks" too)
    loaded = {dist for dist, names in provides.items() if names & (set(modules) - ours - sys.stdlib_module_names)}
    # A package imported where it is installed but not needed (``try: import orjson``) is no requirement:
    # the imports must fail without it to count.
    needed = [dist for dist in sorted(loaded - reached - ours) if _import_all(hide=provides[dist]) is None]
    assert not needed, (
        f"the workloads or peers import {needed}, which the bench extra does not install: add them to setup.cfg's "
        "bench extra and pin them in constraints.txt")


def _import_all(hide: set[str] = frozenset()) -> list[str] | None:
    """The top-level modules that building the workloads' envs and importing the peers loads, in a fresh
    interpreter where the modules ``hide`` are not importable; None if that fails."""
    # Without the PYTHONPATH other tests' processes leave behind (the Ray cluster's import path may
    # carry another interpreter's site-packages): fresh means only what a bench install would have.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *sorted(hide)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    return json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else None


def test_every_bench_requirement_is_pinned():
    """make bench installs with constraints.txt: a requirement it does not pin resolves to whatever is newest."""
    pytest.importorskip("packaging")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {canonicalize_name(re.split(r"[=<>;\s]", line, maxsplit=1)[0])
              for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")}
    unpinned = [line for line in bench_requirements() if canonicalize_name(Requirement(line).name) not in pinned]
    assert not unpinned, f"bench requirements without a pin in constraints.txt: {unpinned}"
