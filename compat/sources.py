"""The peers' own test suites, of the versions installed here, fetched into a scratch directory.

- Stable-Baselines3's tests ship in its source distribution on the package
  registry: ``pip download --no-binary :all: --no-deps stable-baselines3==<installed>``.
- Gymnasium's source distribution carries no ``tests/vector``; they come from
  its git repository (a URL, or a local clone or mirror for machines without
  GitHub), at the tag ``v<installed>`` or, where the release was not tagged,
  at the commit ``Update to v<installed>``.

Only the tests and the peer's pytest configuration are extracted, never its
package source: the tests must import the installed package, which the shim
patches. A suite already fetched is reused.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

GYMNASIUM_GIT = "https://github.com/Farama-Foundation/Gymnasium.git"
CONFIG_FILES = ("pyproject.toml", "setup.cfg")
ORIGIN = ".origin"  # where the suite came from; its presence marks a complete fetch


@dataclass(frozen=True)
class Suite:
    """A peer's test suite on disk: pytest runs ``tests`` from ``root``."""

    peer: str
    version: str
    root: Path
    tests: str
    origin: str  # where it came from, for the report


def sb3_suite(scratch: Path) -> Suite:
    version = metadata.version("stable-baselines3")
    root = scratch / f"stable-baselines3-{version}"
    if not _fetched(root):
        downloads = scratch / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-binary",
              ":all:", "--no-deps", f"stable-baselines3=={version}", "-d", str(downloads)])
        archives = [path for name in ("stable_baselines3", "stable-baselines3")
                    for path in downloads.glob(f"{name}-{version}.tar.gz")]
        if not archives:
            raise SystemExit(f"pip download left no stable-baselines3 {version} sdist in {downloads}")
        with tarfile.open(archives[0]) as archive:
            _extract(archive, root, strip_top=True)
        _stamp(root, f"stable-baselines3=={version} sdist")
    return Suite("sb3", version, root, "tests/test_vec_envs.py", _origin(root))


def gymnasium_suite(scratch: Path, source: str) -> Suite:
    version = metadata.version("gymnasium")
    root = scratch / f"gymnasium-{version}"
    if not _fetched(root):
        git_dir = _git_dir(source, scratch)
        commit, how = _release_commit(git_dir, version)
        data = _run(["git", "--git-dir", str(git_dir), "archive", commit, "tests", *_present(git_dir, commit)])
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            _extract(archive, root, strip_top=False)
        _stamp(root, f"{source} at {how} ({commit[:10]})")
    return Suite("gymnasium", version, root, "tests/vector", _origin(root))


def _fetched(root: Path) -> bool:
    return (root / ORIGIN).is_file()


def _stamp(root: Path, origin: str) -> None:
    """Written last: a suite whose fetch was cut short has none, and is fetched again."""
    (root / ORIGIN).write_text(origin + "\n")


def _origin(root: Path) -> str:
    return (root / ORIGIN).read_text().strip()


def _git_dir(source: str, scratch: Path) -> Path:
    """A git directory holding Gymnasium's history: ``source`` itself if local, else a blobless clone of it."""
    local = Path(source)
    if local.exists():
        dot_git = local / ".git"
        return dot_git if dot_git.is_dir() else local
    clone = scratch / "gymnasium.git"
    if not clone.exists():
        try:
            _run(["git", "clone", "--quiet", "--bare", "--filter=blob:none", source, str(clone)])
        except SystemExit as failed:
            shutil.rmtree(clone, ignore_errors=True)
            raise SystemExit(f"{failed}\nWithout GitHub, point GYMNASIUM_GIT (or --gymnasium-git) at a local clone "
                             "or mirror of Gymnasium") from None
    return clone


def _release_commit(git_dir: Path, version: str) -> tuple[str, str]:
    """The commit released as ``version``: its tag, else the commit that bumped the version."""
    tag = f"v{version}"
    found = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode == 0:
        return found.stdout.strip(), f"tag {tag}"
    subject = f"Update to v{version}"
    log = _run(["git", "--git-dir", str(git_dir), "log", "--all", "--format=%H %s", "--fixed-strings",
                f"--grep={subject}"]).decode()
    for line in log.splitlines():
        commit, _, line_subject = line.partition(" ")
        if line_subject == subject:
            return commit, f"commit {subject!r}"
    raise SystemExit(f"{git_dir} has neither the tag {tag} nor a commit {subject!r}: which commit is gymnasium {version}?")


def _present(git_dir: Path, commit: str) -> list[str]:
    """The peer's configuration files that exist at ``commit``."""
    names = _run(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", commit]).decode().split()
    return [name for name in CONFIG_FILES if name in names]


def _extract(archive: tarfile.TarFile, root: Path, strip_top: bool) -> None:
    """Extract ``tests/`` and the pytest configuration files into ``root``; nothing else."""
    members = []
    for member in archive.getmembers():
        name = member.name.split("/", 1)[1] if strip_top and "/" in member.name else member.name
        if name.startswith("tests/") or name in CONFIG_FILES:
            member.name = name
            members.append(member)
    if not any(member.name.startswith("tests/") for member in members):
        raise SystemExit(f"{archive.name or 'the archive'} holds no tests/ directory")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    archive.extractall(root, members=members, filter="data")


def _run(command: list[str]) -> bytes:
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr.decode(errors='replace')}")
    return result.stdout
