"""``python -m compat`` (``make compat``): the peers' vector-env suites against our views, with a verdict per failure.

Each suite runs once with the peer's own classes (the *reference*) and once
per backend with :mod:`compat.shim` swapping them for our views. A test that
fails under a view is then:

- *environment* if it fails in the reference run too (an optional
  dependency of the peer's tests missing here, say): nothing to learn about us;
- *not ours* if :mod:`compat.known` gives the reason;
- *ours* otherwise. The exit status is 1 when any failure is ours.

Example:
    $ make compat                                    # both suites, dummy and subproc
    $ .venv/bin/python -m compat --peers sb3 --para-modes subproc -k terminal_obs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compat import known
from compat.sources import GYMNASIUM_GIT, Suite, gymnasium_suite, sb3_suite

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "peer"  # the target that runs the peer's own classes
FAILED = ("failed", "error")
COLUMNS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


@dataclass
class Verdicts:
    """The failures under our views, by node id: the runs each failed in, and what is known of it."""

    ours: dict[str, tuple[list[str], str]] = field(default_factory=dict)  # the note: what the fix needs, if known
    not_ours: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    environment: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    used: set[known.Known] = field(default_factory=set)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    scratch = Path(args.scratch).resolve()
    if scratch == REPO_ROOT or REPO_ROOT in scratch.parents:
        raise SystemExit(f"--scratch {scratch} is inside the repository; their tests stay out of it")
    scratch.mkdir(parents=True, exist_ok=True)
    ours = unexplained = 0
    for peer in args.peers:
        suite = gymnasium_suite(scratch, args.gymnasium_git) if peer == "gymnasium" else sb3_suite(scratch)
        print(f"\n== {suite.peer} {suite.version}: {suite.tests} (from {suite.origin}; in {suite.root})", flush=True)
        outcomes = {}
        if args.reference:
            outcomes[REFERENCE] = _reference(suite, scratch, args)
        for para_mode in args.para_modes:
            outcomes[para_mode] = _run(suite, para_mode, scratch, args)
        if args.keyword and REFERENCE in outcomes:  # a saved whole run: count only the tests -k chose
            chosen = {nodeid for target in args.para_modes for nodeid in outcomes[target]}
            outcomes[REFERENCE] = {nodeid: record for nodeid, record in outcomes[REFERENCE].items() if nodeid in chosen}
        verdicts = _judge(suite, outcomes)
        _print_counts(outcomes)
        _print_verdicts(suite, verdicts, args.para_modes, whole_run=args.keyword is None)
        ours += len(verdicts.ours)
        unexplained += sum(1 for _, note in verdicts.ours.values() if not note)
    print(f"\n== {ours} failures are ours ({unexplained} unexplained by compat/known.py)")
    return 1 if ours else 0


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m compat", description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=_names(("gymnasium", "sb3")), default=["gymnasium", "sb3"],
                        help="comma-separated: gymnasium,sb3")
    parser.add_argument("--para-modes", type=_names(known.PARA_MODES), default=list(known.PARA_MODES),
                        help="comma-separated backends under the views: dummy,subproc")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the run with the peer's own classes (failures then cannot be told environmental)")
    parser.add_argument("--rerun-reference", action="store_true",
                        help="run the peer's own classes again, not reusing the last whole run's results")
    parser.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "parallelenv-compat"),
                        help="where the peers' tests and the results go (outside the repository)")
    parser.add_argument("--gymnasium-git", default=os.environ.get("GYMNASIUM_GIT", GYMNASIUM_GIT),
                        help="Gymnasium's git repository: a URL, or a local clone or mirror (env GYMNASIUM_GIT)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression, to run part of a suite")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (pytest-timeout)")
    return parser.parse_args(argv)


def _names(valid: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [name for name in text.split(",") if name]
        unknown = [name for name in names if name not in valid]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(valid)}")
        return names

    return parse


def _reference(suite: Suite, scratch: Path, args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The suite's outcomes with the peer's own classes: those of the last whole run if there is one.

    They depend on the peer and the machine, not on our code, and the
    reference run of SB3's suite takes minutes (SubprocVecEnv under every start method).
    """
    saved = scratch / "results" / f"{suite.peer}-{suite.version}-reference.jsonl"
    if saved.exists() and not args.rerun_reference:
        print(f"   reusing {saved} (--rerun-reference runs it again)", flush=True)
        return _records(saved)
    outcomes = _run(suite, REFERENCE, scratch, args)
    if args.keyword is None:
        shutil.copyfile(scratch / "results" / f"{suite.peer}-{REFERENCE}.jsonl", saved)
    return outcomes


def _run(suite: Suite, target: str, scratch: Path, args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Run the suite on ``target``; each test's outcome record by node id."""
    results = scratch / "results"
    results.mkdir(exist_ok=True)
    records, log = results / f"{suite.peer}-{target}.jsonl", results / f"{suite.peer}-{target}.log"
    records.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", suite.tests, "-q", "-p", "no:cacheprovider",
               "-p", "compat.outcomes", "--outcomes", str(records), "-o", f"timeout={args.timeout}"]
    if target != REFERENCE:
        command += ["-p", "compat.shim", "--peer", suite.peer, "--para-mode", target]
    if args.keyword:
        command += ["-k", args.keyword]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.run(command, cwd=suite.root, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if not records.exists():
        raise SystemExit(f"pytest on {target} exited {code} without results; see {log}")
    print(f"   ran {target:8} in {time.monotonic() - started:5.0f} s (pytest exit {code}; log {log})", flush=True)
    return _records(records)


def _records(path: Path) -> dict[str, dict[str, str]]:
    outcomes = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        outcomes[record["nodeid"]] = record
    return outcomes


def _judge(suite: Suite, outcomes: dict[str, dict[str, dict[str, str]]]) -> Verdicts:
    verdicts = Verdicts()
    reference = outcomes.get(REFERENCE)
    for target, records in outcomes.items():
        if target == REFERENCE:
            continue
        for nodeid, record in records.items():
            if record["outcome"] not in FAILED:
                continue
            verdicts.messages.setdefault(nodeid, record["message"])
            theirs = reference.get(nodeid) if reference is not None else None
            if theirs is not None and theirs["outcome"] in FAILED:
                verdicts.environment.setdefault(nodeid, ([], "theirs: " + theirs["message"]))[0].append(target)
                continue
            entry = known.find(known.NOT_OURS, suite.peer, nodeid, target)
            if entry is not None:
                verdicts.not_ours.setdefault(nodeid, ([], entry.reason))[0].append(target)
            else:
                entry = known.find(known.OURS_PENDING, suite.peer, nodeid, target)
                note = entry.reason if entry is not None else ""
                verdicts.ours.setdefault(nodeid, ([], note))[0].append(target)
            if entry is not None:
                verdicts.used.add(entry)
    return verdicts


def _print_counts(outcomes: dict[str, dict[str, dict[str, str]]]) -> None:
    print(f"   {'run':10}" + "".join(f"{column:>9}" for column in COLUMNS))
    for target, records in outcomes.items():
        counts = {column: 0 for column in COLUMNS}
        for record in records.values():
            counts[record["outcome"]] += 1
        name = f"{target} (own)" if target == REFERENCE else target
        print(f"   {name:10}" + "".join(f"{counts[column]:>9}" for column in COLUMNS))


def _print_verdicts(suite: Suite, verdicts: Verdicts, para_modes: Sequence[str], whole_run: bool) -> None:
    def show(title: str, failures: dict[str, tuple[list[str], str]], unexplained: str) -> None:
        print(f"   {title}: {len(failures)}")
        # One line per test and reason: a parametrised test failing for one reason is one line.
        groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
        for nodeid, (targets, note) in sorted(failures.items()):
            test, _, params = nodeid.partition("[")
            note = note or unexplained + verdicts.messages[nodeid]
            groups.setdefault((test, note, tuple(sorted(targets))), []).append(params.removesuffix("]"))
        for (test, note, targets), params in groups.items():
            where = "" if sorted(targets) == sorted(para_modes) else f" [{', '.join(targets)} only]"
            cases = "" if params == [""] else f"[{params[0]}]" if len(params) == 1 else f" ({len(params)} cases)"
            print(f"     {test}{cases}{where}\n         {note}")

    show("ours", verdicts.ours, "UNEXPLAINED: ")
    show("not ours (compat/known.py)", verdicts.not_ours, "")
    show(f"environment (fails with {suite.peer}'s own classes too)", verdicts.environment, "")
    known_entries = [*known.NOT_OURS, *known.OURS_PENDING]
    stale = [entry for entry in known_entries if entry.peer == suite.peer and entry not in verdicts.used
             and set(entry.para_modes) & set(para_modes)]
    if stale and whole_run:
        print("   stale entries in compat/known.py (they explain no failure now):")
        for entry in stale:
            print(f"     {entry.test} {entry.params or ''}: {entry.reason}")
