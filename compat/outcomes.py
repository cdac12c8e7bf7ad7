"""A pytest plugin that writes each test's outcome as one JSON line (``-p compat.outcomes --outcomes PATH``).

One record per test: ``{"nodeid", "outcome", "message"}``, the outcome one
of ``passed``, ``failed`` (the test body failed), ``error`` (its setup or
teardown did), ``skipped``, ``xfailed`` or ``xpassed``; the message is the
first line of what failed or why it skipped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

_RANK = {"passed": 0, "xpassed": 0, "skipped": 1, "xfailed": 1, "error": 2, "failed": 3}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("parallelenv compat").addoption("--outcomes", required=True, help="JSON-lines file to write")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Recorder(config.getoption("outcomes")), "compat-outcomes")


class _Recorder:
    def __init__(self, path: str) -> None:
        self._path = path
        self._records: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is None:
            return
        record = self._records.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "message": ""})
        if _RANK[outcome] > _RANK[record["outcome"]]:
            record["outcome"], record["message"] = outcome, _message(report)

    def pytest_sessionfinish(self) -> None:
        with open(self._path, "w", encoding="utf-8") as out:
            for record in self._records.values():
                out.write(json.dumps(record) + "\n")


def _outcome(report: pytest.TestReport) -> str | None:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed" if report.when == "call" else None


def _message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        text = str(longrepr[-1])
    else:
        text = str(longrepr or "")
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""
