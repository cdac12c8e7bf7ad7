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
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import report
from benchmarks.child import REPO_ROOT, Pair, measure_once
from benchmarks.machine import describe, load_average, machine_line
from benchmarks.measure import Measurement
from benchmarks.revision import Revision, RevisionError, checkout
from benchmarks.workloads import GROUPS, WORKLOADS
from benchmarks.wrappers import WRAPPERS, default_wrappers

PACKAGE_DIR = Path(__file__).resolve().parent
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
    parser.add_argument("--list", action="store_true",
                        help="list workloads and wrappers, then exit")
    args = parser.parse_args(argv)
    if args.workloads:  # a group name (tensor-cartpole) stands for every size of it
        args.workloads = [n for item in args.workloads for n in GROUPS.get(item, [item])]
    args.workloads = _names(parser, args.workloads, WORKLOADS, "workload")
    args.wrappers = _names(parser, args.wrappers, WRAPPERS, "wrapper", ALIASES) if args.wrappers else None
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 600.0
    return args


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
    ratios between them stay fair.
    """
    rows = pairs(args)
    return [(round_index, pair) for workload in args.workloads for round_index in range(args.repeats)
            for pair in rows if pair.workload == workload]


def measure_plan(order: list[tuple[int, Pair]], args: argparse.Namespace, log_dir: Path,
                 revision: Revision | None) -> list[Measurement]:
    """Run ``order``; one Measurement per pair, its repeats merged. A skip or failure is not retried."""
    runs: dict[Pair, list[Measurement]] = {pair: [] for _, pair in order}
    progress = tqdm(order, unit="run", file=sys.stderr, dynamic_ncols=True)
    for round_index, pair in progress:
        done = runs[pair]
        if done and (done[-1].skipped or done[-1].error):
            continue
        progress.set_description(f"{pair.workload} {pair.label} {round_index + 1}/{args.repeats}")
        source = revision.root if revision is not None and pair.revision else None
        done.append(measure_once(pair, log_dir, args.timeout, round_index, parallelenv_from=source))
    progress.close()
    return [Measurement.merge(done) for done in runs.values()]


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
    started, load_at_start = time.monotonic(), load_average()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_sigterm_as_interrupt())
            revision = stack.enter_context(checkout(args.against, REPO_ROOT)) if args.against else None
            measurements = measure_plan(order, args, log_dir, revision)
    except RevisionError as exc:
        print(f"python -m benchmarks: error: --against {args.against}: {exc}", file=sys.stderr)
        return 2
    settings = {"mode": "quick" if args.quick else "full", "repeats": args.repeats,
                "steps": {pair.workload: pair.steps for _, pair in order},
                "against": {"revision": revision.name, "commit": revision.commit} if revision else None,
                "wall_s": round(time.monotonic() - started, 1),
                "load_average": {"start": load_at_start, "end": load_average()}}
    _write_outputs(args.out, "quick" if args.quick else "full", [m.to_dict() for m in measurements],
                   {"machine": machine, "settings": settings})
    return 0


def _write_outputs(out: Path, stem: str, measurements: list[dict[str, Any]],
                   meta: dict[str, Any]) -> None:
    rows = report.summarize(measurements)
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
        written = ".md, .json (no chart: pip install matplotlib)"
    print(f"wrote {out / stem}{written} ({meta['settings']['wall_s']} s)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
