"""Benchmark parallelenv against its peers: ``python -m benchmarks [--quick]``.

Plans the (workload, wrapper) pairs, measures each in a fresh Python process
(``benchmarks._one``), then prints a markdown table and writes it, the same
as JSON, and a PNG chart to ``--out``. Progress goes to stderr, the table to
stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import report
from benchmarks.machine import describe, load_average, machine_line, wait_for_quiet
from benchmarks.measure import Measurement
from benchmarks.workloads import GROUPS, WORKLOADS
from benchmarks.wrappers import WRAPPERS, default_wrappers

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: fewer steps, 1 repeat, fewer peers (< 2 min on 2 cores)")
    parser.add_argument("--workloads", nargs="+", metavar="NAME",
                        help=f"subset of: {', '.join(WORKLOADS)}, or {', '.join(GROUPS)} for all "
                             "its sizes (default: all)")
    parser.add_argument("--wrappers", nargs="+", metavar="NAME",
                        help=f"run these on every chosen workload; from: {', '.join(WRAPPERS)} "
                             "(default: each workload's usual set)")
    parser.add_argument("--repeats", type=int, help="timed repeats per pair (default 3; quick 1)")
    parser.add_argument("--steps", type=int,
                        help="batch steps per repeat for every workload (default: per workload)")
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR / "results",
                        help="folder for the .md, .json and .png (default: benchmarks/results)")
    parser.add_argument("--timeout", type=float,
                        help="seconds before one pair is killed (default 600; quick 60)")
    parser.add_argument("--list", action="store_true",
                        help="list workloads and wrappers, then exit")
    args = parser.parse_args(argv)
    if args.workloads:  # a group name (tensor-cartpole) stands for every size of it
        args.workloads = [n for item in args.workloads for n in GROUPS.get(item, [item])]
    args.workloads = _names(parser, args.workloads, WORKLOADS, "workload")
    args.wrappers = _names(parser, args.wrappers, WRAPPERS, "wrapper") if args.wrappers else None
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 600.0
    return args


def _names(parser: argparse.ArgumentParser, given: list[str] | None, valid: dict[str, Any],
           what: str) -> list[str]:
    """Accept 'a b' and 'a,b'; reject unknown names with the valid ones listed."""
    names = [n for item in given for n in item.split(",") if n] if given else list(valid)
    unknown = [n for n in names if n not in valid]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return names


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(workload, wrapper, steps) in the order they are measured."""
    pairs = []
    for workload in args.workloads:
        spec = WORKLOADS[workload]
        steps = args.steps or (spec.quick_steps if args.quick else spec.steps)
        for wrapper in args.wrappers or default_wrappers(workload, args.quick):
            pairs.append((workload, wrapper, steps))
    return pairs


def run_pair(workload: str, wrapper: str, steps: int, args: argparse.Namespace,
             log_dir: Path) -> dict[str, Any]:
    """Measure one pair in a fresh interpreter; a crash or hang becomes an error row."""
    wait_for_quiet()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks._one", "--workload", workload,
                   "--wrapper", wrapper, "--steps", str(steps), "--repeats", str(args.repeats),
                   "--result", str(result_path)]
        log_path = log_dir / f"{workload}-{wrapper}.log"
        with log_path.open("w") as log:
            returncode = _run_in_own_group(command, log, args.timeout)
        if result_path.exists():
            return json.loads(result_path.read_text())
    return _crashed(workload, wrapper, steps, returncode, log_path, args.timeout)


def _run_in_own_group(command: list[str], log: Any, timeout: float) -> int | None:
    """Run ``command``; kill its whole process group at the end. None on timeout."""
    env = dict(os.environ)
    # Workers that unpickle env factories (subprocesses, Ray actors) import
    # benchmarks.workloads by path; make it importable from anywhere.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # Its own session, so that it and anything it leaves behind can be
    # stopped together by process group without touching anything else.
    child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=log,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        returncode: int | None = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return returncode


def _crashed(workload: str, wrapper: str, steps: int, returncode: int | None,
             log_path: Path, timeout: float) -> dict[str, Any]:
    spec = WRAPPERS[wrapper]
    if returncode is None:
        error = f"timed out after {timeout:g} s"
    else:
        tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        error = f"process exited with code {returncode}: {tail[-1][:200] if tail else 'no output'}"
    measurement = Measurement(workload, wrapper, spec.kind, spec.ours,
                              WORKLOADS[workload].num_envs, steps, error=error)
    return measurement.to_dict()


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_choices()
        return 0
    pairs = plan(args)
    machine = describe()
    print(f"{machine['date']}; {machine_line(machine)}", file=sys.stderr)
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.monotonic(), load_average()
    measurements = []
    progress = tqdm(pairs, unit="pair", file=sys.stderr, dynamic_ncols=True)
    for workload, wrapper, steps in progress:
        progress.set_description(f"{workload} {wrapper}")
        measurements.append(run_pair(workload, wrapper, steps, args, log_dir))
    progress.close()
    settings = {"mode": "quick" if args.quick else "full", "repeats": args.repeats,
                "steps": {w: s for w, _, s in pairs},
                "wall_s": round(time.monotonic() - started, 1),
                "load_average": {"start": load_at_start, "end": load_average()}}
    _write_outputs(args.out, "quick" if args.quick else "full", measurements,
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
