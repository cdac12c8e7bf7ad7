"""What to install for a part that needs an optional package: one message for every missing extra.

parallelenv is installed from a clone (README, "Install"), so the command is
the clone's editable install of the extra, with the pins of ``constraints.txt``;
where the extra brings torch, the pins are what keep pip from choosing a
CUDA build of gigabytes.
"""

from __future__ import annotations

# The extras of setup.cfg whose packages bring torch (SB3's need it too).
EXTRAS_WITH_TORCH = frozenset({"torch", "sb3", "demo", "all", "test", "bench"})


def install_command(extra: str) -> str:
    """The command that installs ``extra`` from the clone's root."""
    return f"pip install -e '.[{extra}]' -c constraints.txt"


def missing_extra(need: str, extra: str) -> str:
    """The message for a missing package: ``need`` says what needs which package, ``extra`` installs it.

    Example:
        >>> print(missing_extra("the Ray backends need Ray", "ray"))
        the Ray backends need Ray, which the extra parallelenv[ray] installs: from the clone's root, pip install -e '.[ray]' -c constraints.txt
    """
    message = f"{need}, which the extra parallelenv[{extra}] installs: from the clone's root, {install_command(extra)}"
    if extra in EXTRAS_WITH_TORCH:
        message += " (its pins keep pip from fetching a CUDA build of torch, gigabytes of it)"
    return message
