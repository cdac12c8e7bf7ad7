"""Measure one (workload, wrapper) pair; run by the harness in a fresh process.

A fresh interpreter per pair keeps one wrapper's memory, threads, imports and
leftover processes out of the next one's numbers, and lets a peer crash
without taking the harness down. The result goes to a JSON file rather than
stdout, which the envs and peers are free to print on.

    python -m benchmarks._one --workload busy8 --wrapper gymnasium-async \\
        --steps 500 --repeats 3 --result /tmp/busy8.json
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
    args = parser.parse_args(argv)
    result = measure(WORKLOADS[args.workload], WRAPPERS[args.wrapper], args.steps, args.repeats)
    args.result.write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
