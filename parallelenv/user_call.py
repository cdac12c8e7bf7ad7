"""Warnings that point at the line of the user's code that made the call."""

from __future__ import annotations

import os
import sys
import warnings

# Every module of the package lives under this folder, named as its code objects name their files.
_PACKAGE = os.path.dirname(__file__) + os.sep


def warn_at_user_call(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` at the first frame outside parallelenv.

    A fixed ``stacklevel`` cannot do it: the same warning is reached through
    ``step`` or ``send``, the Gymnasium or SB3 view, or VecWorker, each at
    its own depth. The warning then names the user's line, and the default
    filter shows it once per line of the user's code, as warnings are meant to.
    """
    frame = sys._getframe(1)
    level = 2  # warn's stacklevel of our caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
