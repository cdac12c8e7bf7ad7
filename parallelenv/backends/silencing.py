"""Silencing the warnings that envs raise, for ``no_warning``."""

from __future__ import annotations

import sys
import warnings
from typing import Any

# What ``warnings.simplefilter("ignore")`` inserts.
_IGNORE_EVERY_WARNING = ("ignore", None, Warning, None, 0)
# Where catch_warnings keeps its filters per context (free-threaded builds,
# or -X context_aware_warnings), warnings.filters is not where they are read.
_FILTERS_PER_CONTEXT = getattr(sys.flags, "context_aware_warnings", False)
# How catch_warnings tells the warnings machinery that the filters changed
# (its caches of warnings already shown depend on them), where it exists.
_FILTERS_MUTATED = None if _FILTERS_PER_CONTEXT else getattr(warnings, "_filters_mutated", None)


class silenced:
    """Ignore the warnings raised inside envs while in effect, when ``no_warning`` is set.

    The dummy backend enters one around every call it runs, so it costs as
    little as a filter can: it swaps in a filter list that starts with an
    ignore-everything filter and puts the caller's back on exit, as
    ``catch_warnings`` does less its other bookkeeping, which is most of
    what ``catch_warnings`` costs a call. Where the filters are kept per
    context, or the hook that marks them changed is missing, it is
    ``catch_warnings`` itself.
    """

    __slots__ = ("_no_warning", "_saved", "_catcher")

    def __init__(self, no_warning: bool) -> None:
        self._no_warning = no_warning
        self._saved: list[Any] | None = None
        self._catcher: Any = None

    def __enter__(self) -> None:
        if not self._no_warning:
            return
        if self._saved is not None or self._catcher is not None:
            raise RuntimeError("silenced is already in effect: it cannot be entered twice at once")
        if _FILTERS_MUTATED is not None:
            self._saved = warnings.filters
            warnings.filters = [_IGNORE_EVERY_WARNING, *self._saved]
            _FILTERS_MUTATED()
            return
        self._catcher = warnings.catch_warnings()
        self._catcher.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            warnings.filters, self._saved = self._saved, None
            _FILTERS_MUTATED()  # type: ignore[misc]
        elif self._catcher is not None:
            self._catcher.__exit__(*exc_info)
            self._catcher = None
