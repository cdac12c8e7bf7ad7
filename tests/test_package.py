"""What the distribution holds: the licence, the typing marker, and one version."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import parallelenv

ROOT = Path(__file__).resolve().parent.parent
BUILD_FILES = ["setup.cfg", "setup.py", "README.rst", "LICENSE"]


def test_the_package_is_marked_typed():
    assert importlib.resources.files("parallelenv").joinpath("py.typed").is_file()


def test_the_licence_is_mit_as_the_metadata_says():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 the parallelenv authors" in text
    assert importlib.metadata.metadata("parallelenv")["License"] == "MIT"


def test_the_installed_version_is_the_package_version():
    assert importlib.metadata.version("parallelenv") == parallelenv.__version__


def test_the_build_reads_the_version_without_importing_the_package():
    """setup.cfg's ``attr:`` is read from the source: a build needs neither ray, torch nor numpy."""
    check = (
        "import sys\n"
        "from setuptools.config.expand import read_attr\n"
        "print(read_attr('parallelenv.__version__', root_dir=sys.argv[1]))\n"
        "assert 'parallelenv' not in sys.modules, sorted(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", check, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == parallelenv.__version__


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_wheel_ships_py_typed_and_the_licence(tmp_path):
    source = tmp_path / "source"  # a copy: the build leaves build/ and egg-info where it runs
    shutil.copytree(ROOT / "parallelenv", source / "parallelenv", ignore=shutil.ignore_patterns("__pycache__"))
    for name in BUILD_FILES:
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"parallelenv-{parallelenv.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "parallelenv/py.typed" in names
    assert any(".dist-info/" in name and name.endswith("/LICENSE") for name in names), names
