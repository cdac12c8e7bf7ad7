"""Benchmark parallelenv against its peers: ``python -m benchmarks [--quick]``.

Plans the (workload, wrapper) pairs, measures each repeat of each in a fresh
Python process (``benchmarks._one``), the repeats of a workload's wrappers
interleaved, then prints a markdown table and writes it, the same as JSON,
and a PNG chart to ``--out``. ``--against REV`` also measures each of
parallelenv's wrappers with REV's parallelenv, as ``WRAPPER@REV``, and
reports working tree / REV. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import report
from benchmarks.child import REPO_ROOT, Pair, measure_once, not_measured, unavailable
from benchmarks.machine import Wait, describe, load_average, machine_line, wait_for_quiet
from benchmarks.measure import Measurement
from benchmarks.revision import Revision, RevisionError, checkout
from benchmarks.workloads import GROUPS, WORKLOADS
from benchmarks.wrappers import WRAPPERS, default_wrappers

PACKAGE_DIR = Path(__file__).resolve().parent
# make bench-quick's promise is two minutes, busy machine or not: the runs get
# this much, the table and chart the rest. Nor does it wait for an idle CPU: on
# a machine kept busy by others every run would wait its whole patience.
QUICK_BUDGET_S = 90.0
WAIT_IDLE_S = 20.0
IDLE_PERCENT = 10.0
MIN_RUN_S = 5.0  # a run needs about this long (start, imports, warm-up): not started with less budget left
# Ours answer to their name without the prefix too: --wrappers subproc dummy.
ALIASES = {name.removeprefix("parallelenv-"): name for name, spec in WRAPPERS.items()
           if spec.ours and name.startswith("parallelenv-")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: fewer steps, 1 repeat, fewer peers (< 2 min on 2 cores)")
    parser.add_argument("--workloads", nargs="+", metavar="NAME",
                        help=f"subset of: {', '.join(WORKLOADS)}, or {', '.join(GROUPS)} for all "
                             "its sizes (default: all)")
    parser.add_argument("--wrappers", nargs="+", metavar="NAME",
                        help=f"run these on every chosen workload; from: {', '.join(WRAPPERS)}; "
                             "'parallelenv-' may be left out (default: each workload's usual set)")
    parser.add_argument("--repeats", type=int,
                        help="timed repeats per pair, each a round over the workload's wrappers "
                             "(default 3; quick 1)")
    parser.add_argument("--against", metavar="REV",
                        help="also measure parallelenv's wrappers with the parallelenv of git "
                             "revision REV (HEAD, a tag, a hash), as WRAPPER@REV")
    parser.add_argument("--steps", type=int,
                        help="batch steps per repeat for every workload (default: per workload)")
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR / "results",
                        help="folder for the .md, .json and .png (default: benchmarks/results)")
    parser.add_argument("--timeout", type=float,
                        help="seconds before one measuring process (one repeat) is killed (default 600; quick 60)")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no run after this many seconds; the table holds what finished "
                             f"(default: none; quick {QUICK_BUDGET_S:g})")
    parser.add_argument("--wait-idle", type=float, metavar="SECONDS",
                        help=f"before each run, wait up to this long for the CPU to be under {IDLE_PERCENT:g}%% "
                             f"busy, saying so (default {WAIT_IDLE_S:g}; quick 0: no wait)")
    parser.add_argument("--list", action="store_true",
                        help="list workloads and wrappers, then exit")
    args = parser.parse_args(argv)
    given_workloads = args.workloads
    if args.workloads:  # a group name (tensor-cartpole) stands for every size of it
        args.workloads = [n for item in args.workloads for n in GROUPS.get(item, [item])]
    args.workloads = _names(parser, args.workloads, WORKLOADS, "workload", {"halfcheetah8": "cheetah8"})
    if args.quick and given_workloads is None:
        args.workloads = [name for name in args.workloads if WORKLOADS[name].quick]
    args.wrappers = _names(parser, args.wrappers, WRAPPERS, "wrapper", ALIASES) if args.wrappers else None
    _fill_defaults(args)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _fill_defaults(args: argparse.Namespace) -> None:
    """The settings left unset take a full run's values, or a quick one's."""
    quick = args.quick
    if args.repeats is None:
        args.repeats = 1 if quick else 3
    if args.timeout is None:
        args.timeout = 60.0 if quick else 600.0
    if args.budget is None and quick:
        args.budget = QUICK_BUDGET_S
    if args.wait_idle is None:
        args.wait_idle = 0.0 if quick else WAIT_IDLE_S


def _names(parser: argparse.ArgumentParser, given: list[str] | None, valid: dict[str, Any],
           what: str, aliases: dict[str, str] | None = None) -> list[str]:
    """Accept 'a b' and 'a,b', once each; reject unknown names with the valid ones listed."""
    names = [n for item in given for n in item.split(",") if n] if given else list(valid)
    names = list(dict.fromkeys((aliases or {}).get(n, n) for n in names))
    unknown = [n for n in names if n not in valid]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return names


def pairs(args: argparse.Namespace) -> list[Pair]:
    """The table's rows: per workload each wrapper, and with --against its twin on REV right after it."""
    rows = []
    for workload in args.workloads:
        spec = WORKLOADS[workload]
        steps = args.steps or (spec.quick_steps if args.quick else spec.steps)
        for wrapper in args.wrappers or default_wrappers(workload, args.quick):
            rows.append(Pair(workload, wrapper, steps))
            if args.against and WRAPPERS[wrapper].ours:
                rows.append(Pair(workload, wrapper, steps, revision=args.against))
    return rows


def plan(args: argparse.Namespace) -> list[tuple[int, Pair]]:
    """(round, pair) in the order measured, one fresh process each.

    Each round measures every pair of a workload once (A A' B B', then A A'
    B B' again, ...) rather than all of A's repeats back to back: the host's
    drift over minutes then hits every wrapper of the workload alike, and the
    ratios between them stay fair. A workload and its twin (infos8 and
    noinfos8) share their rounds, for the same reason.
    """
    rows = pairs(args)
    return [(round_index, pair) for block in _blocks(args.workloads) for round_index in range(args.repeats)
            for workload in block for pair in rows if pair.workload == workload]


def _blocks(workloads: list[str]) -> list[list[str]]:
    """The workloads measured round by round together: each alone, or with its twin where both are chosen."""
    partner = {w.name: w.twin for w in WORKLOADS.values() if w.twin}
    partner.update({twin: name for name, twin in list(partner.items())})
    blocks: list[list[str]] = []
    placed: set[str] = set()
    for name in workloads:
        if name not in placed:
            twin = partner.get(name)
            blocks.append([name, twin] if twin in workloads and twin not in placed else [name])
            placed.update(blocks[-1])
    return blocks


@dataclass
class RunLog:
    """What happened to the plan as a whole: waits for an idle CPU, and why it stopped early, if it did."""

    planned: int
    patience_s: float
    runs: int = 0
    waits: list[Wait] = field(default_factory=list)
    stopped: str | None = None

    @property
    def has_waited(self) -> bool:
        return any(wait.waited_s > 0 for wait in self.waits)

    def summary(self) -> str:
        """One line: the waits for an idle CPU, and how far the plan got."""
        idle = self.to_dict()["idle_wait"]
        if self.patience_s <= 0:
            waits = "no wait for an idle CPU"
        else:
            waits = (f"waited {idle['waited_s']:.0f} s for an idle CPU before {idle['runs_waited']} of "
                     f"{len(self.waits)} runs, {idle['gave_up']} times in vain after {self.patience_s:g} s")
        stopped = f"; stopped early ({self.stopped}) after {self.runs} of {self.planned} runs" if self.stopped else ""
        return waits + stopped

    def to_dict(self) -> dict[str, Any]:
        waited = [wait for wait in self.waits if wait.waited_s > 0]
        return {"planned": self.planned, "runs": self.runs, "stopped": self.stopped,
                "idle_wait": {"patience_s": self.patience_s, "runs_waited": len(waited),
                              "waited_s": round(sum(wait.waited_s for wait in waited), 1),
                              "gave_up": sum(not wait.idle for wait in waited)}}


def measure_plan(order: list[tuple[int, Pair]], args: argparse.Namespace, log_dir: Path,
                 revision: Revision | None) -> tuple[list[Measurement], RunLog]:
    """Run ``order``; one Measurement per pair, its repeats merged. A skip or failure is not retried.

    Ctrl-C (or SIGTERM) and a spent ``--budget`` stop it early; the pairs it
    did not reach are rows that say so, and the rest keep what finished.
    """
    runs: dict[Pair, list[Measurement]] = {pair: [] for _, pair in order}
    log = RunLog(len(order), args.wait_idle)
    deadline = time.monotonic() + (math.inf if args.budget is None else args.budget)
    # A bar that redraws itself in place only on a terminal: in a file its updates pile up on one line.
    progress = tqdm(order, unit="run", file=sys.stderr, dynamic_ncols=True, disable=not on_a_terminal())
    lines = WorkloadLines(order, quiet=not progress.disable)
    try:
        for index, (round_index, pair) in enumerate(progress):
            done = runs[pair]
            if done and (done[-1].skipped or done[-1].error):
                lines.passed(index, pair, ran=False)
                continue
            if (missing := unavailable(pair)) is not None:
                done.append(not_measured(pair, skipped=missing))
                lines.passed(index, pair, ran=False)
                continue
            if deadline - time.monotonic() < MIN_RUN_S:
                log.stopped = f"its --budget of {args.budget:g} s was spent"
                break
            progress.set_description(f"{pair.workload} {pair.label} {round_index + 1}/{args.repeats}")
            if args.wait_idle > 0:
                log.waits.append(_wait_for_idle_cpu(progress, args.wait_idle, first=not log.has_waited))
            source = revision.root if revision is not None and pair.revision else None
            result = measure_once(pair, log_dir, min(args.timeout, deadline - time.monotonic()), round_index,
                                  parallelenv_from=source)
            if result.error and time.monotonic() >= deadline:  # killed by the budget, not by its own timeout
                log.stopped = f"its --budget of {args.budget:g} s was spent"
                break
            done.append(result)
            log.runs += 1
            lines.passed(index, pair, ran=True)
    except KeyboardInterrupt:  # the running child's group is gone already (measure_once's finally)
        log.stopped = "interrupted"
    finally:
        progress.close()
    return [Measurement.merge(done) if done else not_measured(pair, skipped=f"not run: {log.stopped}")
            for pair, done in runs.items()], log


def on_a_terminal() -> bool:
    """Whether both the table (stdout) and the progress (stderr) go to a terminal: a run logged to a file
    gets a line per workload instead of a bar."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class WorkloadLines:
    """Progress as one line per workload, printed when its last run of the plan is over: for a log or a file."""

    def __init__(self, order: list[tuple[int, Pair]], quiet: bool) -> None:
        self._last = {pair.workload: index for index, (_, pair) in enumerate(order)}
        self._workloads = list(self._last)
        self._runs: dict[str, int] = defaultdict(int)
        self._started = time.monotonic()
        self._quiet = quiet

    def passed(self, index: int, pair: Pair, ran: bool) -> None:
        """The plan's entry ``index`` is over: ``pair`` measured once (``ran``), or passed over (skipped)."""
        self._runs[pair.workload] += ran
        if self._quiet or self._last[pair.workload] != index:
            return
        position = self._workloads.index(pair.workload) + 1
        print(f"[{position}/{len(self._workloads)}] {pair.workload}: {self._runs[pair.workload]} run(s), "
              f"{time.monotonic() - self._started:.0f} s so far", file=sys.stderr, flush=True)


def _wait_for_idle_cpu(progress: tqdm, patience_s: float, first: bool) -> Wait:
    """``wait_for_quiet``, shown on the progress bar while it waits, and explained the first time."""
    explained = not first

    def show(busy: float, waited: float) -> None:
        nonlocal explained
        if not explained:
            progress.write(f"waiting up to {patience_s:g} s before each run for the CPU to be under "
                           f"{IDLE_PERCENT:g}% busy (a measurement beside other work is skewed); "
                           "--wait-idle 0 measures at once", file=sys.stderr)
            explained = True
        progress.set_postfix_str(f"waiting for an idle CPU: {busy:.0f}% busy, {waited:.0f}/{patience_s:g} s")

    wait = wait_for_quiet(IDLE_PERCENT, patience_s, on_busy=show)
    if wait.waited_s > 0:
        progress.set_postfix_str("" if wait.idle else f"CPU still {wait.busy_percent:.0f}% busy: measuring anyway")
    return wait


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """``kill`` cleans up as Ctrl-C does: the running child's group and REV's copy go."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def list_choices() -> None:
    print("workloads:")
    for spec in WORKLOADS.values():
        print(f"  {spec.name:12} N={spec.num_envs:<3} {spec.description}")
    print("wrappers:")
    for name, wrapper in WRAPPERS.items():
        only = ""
        if wrapper.workloads:
            only = f" (by default only on {', '.join(sorted(wrapper.workloads))})"
        if not wrapper.quick:
            only += " (not in --quick)"
        print(f"  {name:26} {wrapper.kind:11} {wrapper.note}{only}")
    print(f"parallelenv's wrappers also answer to their name without 'parallelenv-' "
          f"({', '.join(ALIASES)}); --against REV measures each of them with REV's parallelenv too.")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_choices()
        return 0
    order = plan(args)
    if args.against and not any(pair.revision for _, pair in order):
        print("python -m benchmarks: error: --against compares parallelenv's wrappers, and none is chosen",
              file=sys.stderr)
        return 2
    machine = describe()
    print(f"{machine['date']}; {machine_line(machine)}", file=sys.stderr)
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.quick:
        print(f"--quick: {len(order)} runs, none started after {args.budget:g} s; "
              + ("no wait for an idle CPU" if args.wait_idle <= 0 else f"up to {args.wait_idle:g} s of wait "
                 "for an idle CPU before each"), file=sys.stderr)
    started, load_at_start = time.monotonic(), load_average()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_sigterm_as_interrupt())
            revision = stack.enter_context(checkout(args.against, REPO_ROOT)) if args.against else None
            measurements, run_log = measure_plan(order, args, log_dir, revision)
    except RevisionError as exc:
        print(f"python -m benchmarks: error: --against {args.against}: {exc}", file=sys.stderr)
        return 2
    print(run_log.summary(), file=sys.stderr)
    settings = {"mode": "quick" if args.quick else "full", "repeats": args.repeats,
                "steps": {pair.workload: pair.steps for _, pair in order},
                "against": {"revision": revision.name, "commit": revision.commit} if revision else None,
                "wall_s": round(time.monotonic() - started, 1),
                "load_average": {"start": load_at_start, "end": load_average()}, "plan": run_log.to_dict()}
    _write_outputs(args.out, "quick" if args.quick else "full", [m.to_dict() for m in measurements],
                   {"machine": machine, "settings": settings})
    # What finished is written either way; the exit status still tells a script that it was cut short.
    return 130 if run_log.stopped == "interrupted" else 0


def _write_outputs(out: Path, stem: str, measurements: list[dict[str, Any]],
                   meta: dict[str, Any]) -> None:
    rows = report.summarize(measurements, meta["machine"]["cores"])
    table = report.markdown(rows, meta)
    print(table)
    (out / f"{stem}.md").write_text(table)
    report.write_json(out / f"{stem}.json", rows, meta)
    title = f"parallelenv benchmarks, {meta['machine']['date']}; {meta['machine']['cpu']}, " \
            f"{meta['machine']['cores']} cores"
    try:
        report.plot(out / f"{stem}.png", rows, title)
        written = ".md, .json, .png"
    except ImportError:  # matplotlib comes with the bench extra; the numbers stand without it
        from parallelenv.extras import install_command

        written = f".md, .json (no chart: matplotlib is missing; {install_command('bench')})"
    print(f"wrote {out / stem}{written} ({meta['settings']['wall_s']} s)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
