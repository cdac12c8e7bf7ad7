"""``python -m soak``: soak every CPU backend in turn, print a table each, exit 1 on any FAIL."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from collections.abc import Sequence

from parallelenv.extras import install_command
from soak.cluster import local_ray
from soak.profiles import PROFILES
from soak.report import block
from soak.run import soak


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m soak", description="Soak every CPU backend in turn under faults, healing and recycling; "
        "print a table each, exit 1 on any FAIL.")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="minutes per backend, not in all (default 10: about 40 for the four)")
    parser.add_argument("--backends", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    parser.add_argument("--seed", type=int, default=0, help="seeds the faults' steps, kinds and envs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    backends = list(args.backends)
    if any(PROFILES[name].needs_ray for name in backends) and importlib.util.find_spec("ray") is None:
        print(f"ray is not installed: the ray and ray-subproc soaks are skipped ({install_command('ray')})")
        backends = [name for name in backends if not PROFILES[name].needs_ray]
    failed = []
    with local_ray(any(PROFILES[name].needs_ray for name in backends)):
        for name in backends:
            print(f"soaking {name} for {args.minutes:g} min ...", flush=True)
            try:
                outcome = soak(PROFILES[name], args.minutes * 60, args.seed)
            except Exception:  # one backend's crash is its FAIL; the others still run
                print(f"{name}: FAIL, the soak raised:\n{traceback.format_exc()}", flush=True)
                failed.append(name)
                continue
            print(block(outcome), flush=True)
            if not outcome.passed:
                failed.append(name)
    print(f"soak: FAIL on {', '.join(failed)}" if failed else "soak: PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
