"""Another git revision's ``parallelenv``, measured beside the working tree's (``--against REV``).

Only the package comes from REV; the harness, workloads and wrappers stay the
working tree's, so both sides run the very same measuring code and differ by
the library alone. The copy is made with ``git archive``, which changes no git
state (no worktree to prune, no index, no ref), into a temporary folder that
is removed when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "parallelenv"


class RevisionError(ValueError):
    """REV is not a commit of this repository, or holds no ``parallelenv`` package."""


@dataclass(frozen=True)
class Revision:
    """REV's ``parallelenv``, unpacked under ``root``."""

    name: str  # as given: HEAD, a tag, a hash
    commit: str  # what it named when the run started: later commits do not move it
    root: Path  # holds parallelenv/; put it first on a child's path to import REV's package


@contextlib.contextmanager
def checkout(name: str, repo: Path) -> Iterator[Revision]:
    """Unpack REV's ``parallelenv/`` into a temporary folder for the block's duration."""
    commit = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}").decode().strip()
    with tempfile.TemporaryDirectory(prefix=f"parallelenv-{commit[:10]}-") as tmp:
        archive = _git(repo, "archive", "--format=tar", commit, "--", PACKAGE)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            # Our own repository's files; the "data" filter (where this Python
            # has it) refuses links and paths that leave the folder all the same.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        yield Revision(name, commit, Path(tmp))


def _git(repo: Path, *args: str) -> bytes:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip() or "not a commit"
        raise RevisionError(f"git {args[0]} {args[-1]}: {reason}")
    return done.stdout
