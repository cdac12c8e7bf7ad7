"""The soak's table: one block per backend, one row per resource, PASS or FAIL on each."""

from __future__ import annotations

from collections import Counter

from parallelenv.healing import WORKER_RECYCLED
from soak.judge import Verdict
from soak.run import Outcome

HEADER = f"  {'resource':<26}{'start':>10}{'end':>10}{'growth':>10}{'allowed':>10}  {'verdict':<8}rule"


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items())) or "none"


def _row(verdict: Verdict) -> str:
    name = f"{verdict.resource} ({verdict.unit})" if verdict.unit else verdict.resource
    numbers = f"{verdict.start:>10.1f}{verdict.end:>10.1f}{verdict.growth:>+10.1f}{verdict.allowance:>10.1f}"
    return f"  {name:<26}{numbers}  {'PASS' if verdict.passed else 'FAIL':<8}{verdict.rule}"


def block(outcome: Outcome) -> str:
    restarts = Counter({kind: n for kind, n in outcome.logged.items() if kind != WORKER_RECYCLED})
    lines = [
        f"{outcome.para_mode}: {outcome.steps:,} steps in {outcome.seconds:.0f} s, "
        f"{outcome.env_steps_per_s:,.0f} env-steps/s -- {'PASS' if outcome.passed else 'FAIL'}",
        f"  faults injected: {_counts(outcome.injected)}",
        f"  restarts logged: {_counts(restarts)}; recycles: {outcome.logged[WORKER_RECYCLED]}",
        HEADER,
        *(_row(verdict) for verdict in outcome.verdicts),
    ]
    return "\n".join(lines)
