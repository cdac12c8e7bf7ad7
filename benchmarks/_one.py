"""Measure one (workload, wrapper) pair; run by the harness in a fresh process per repeat.

A fresh interpreter per measurement keeps one wrapper's memory, threads,
imports and leftover processes out of the next one's numbers, and lets a peer
crash without taking the harness down. The harness asks for one repeat at a
time, so that it can interleave the repeats of a workload's wrappers. The result goes to a JSON file rather than
stdout, which the envs and peers are free to print on.

    python -m benchmarks._one --workload busy8 --wrapper gymnasium-async \\
        --steps 500 --repeats 3 --result /tmp/busy8.json

``--parallelenv-from DIR`` measures the ``parallelenv`` package under DIR (another
git revision's, unpacked there by ``--against``) instead of the installed one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.measure import measure
from benchmarks.workloads import WORKLOADS
from benchmarks.wrappers import WRAPPERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._one", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--wrapper", required=True, choices=sorted(WRAPPERS))
    parser.add_argument("--steps", type=int, required=True, help="batch steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--result", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--parallelenv-from", type=Path, metavar="DIR",
                        help="import parallelenv from DIR/parallelenv")
    args = parser.parse_args(argv)
    if args.parallelenv_from:
        # Before anything imports parallelenv; spawn and forkserver workers
        # start from this sys.path, and the harness set PYTHONPATH alike.
        sys.path.insert(0, str(args.parallelenv_from.resolve()))
        # An editable install's finder looks after the path does: a module REV lacks would come from the
        # working tree, two versions in one row. Without it, a wrapper of what REV lacks fails its row.
        sys.meta_path[:] = [finder for finder in sys.meta_path
                            if not getattr(finder, "__module__", "").startswith("__editable__")]
    result = measure(WORKLOADS[args.workload], WRAPPERS[args.wrapper], args.steps, args.repeats)
    if args.parallelenv_from and result.parallelenv_path:
        wanted = str(args.parallelenv_from.resolve() / "parallelenv")
        if result.parallelenv_path != wanted:  # numbers of the wrong package: worse than none
            result.error = f"imported parallelenv from {result.parallelenv_path}, not {wanted}"
    args.result.write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
