"""``python -m parallelenv.demo``: CartPole-v1 through every backend, a results table and a chart.

A short run of a real Gymnasium env on each registered backend, the same
seed and actions for all. Each backend is started, then stepped for a
number of steps or seconds, whichever ends first, so that a slow one (``ray``
pays a Ray call per env per step) does not hold the demo up. It prints how
long each took to start, how fast each stepped and whether their
trajectories agreed, and draws env-steps/s and start-up per backend as a PNG.
The tensor backend runs ``parallelenv.envs.CartPole``, the same dynamics as
batched torch code with random streams of its own, so its trajectory is not
compared.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parallelenv import ParallelEnv
from parallelenv.backends import backend_names
from parallelenv.extras import missing_extra

DEFAULT_CHART = Path("build") / "parallelenv-demo.png"
PART_COLOURS = {"wait": "#66c2a5", "send": "#fc8d62", "merge": "#8da0cb", "own": "#e78ac3"}
PART_NAMES = {"wait": "envs (the wait)", "send": "send", "merge": "merge results", "own": "caller's own"}
COLOURS = {"dummy": "#8da0cb", "subproc": "#66c2a5", "ray": "#fc8d62", "ray-subproc": "#fc8d62", "tensor": "#e78ac3"}


@dataclass
class Run:
    """One backend's row: how it started and stepped, or why it did not run."""

    mode: str
    startup_s: float = 0.0
    steps: int = 0
    stepping_s: float = 0.0
    episodes: int = 0
    # The sum of every obs of each step: two backends agree when these do, over the steps both ran.
    checksums: list[float] = field(default_factory=list)
    error: str | None = None
    # Where a batch step's time went, in seconds per batch step (ParallelEnv(stats=True), parallelenv.timing).
    parts: dict[str, float] = field(default_factory=dict)

    def env_steps_per_s(self, num_envs: int) -> float:
        return self.steps * num_envs / self.stepping_s if self.stepping_s else 0.0


def say(line: str) -> None:
    print(line, flush=True)  # a line at a time, in order with the bars and Ray's own output


class Progress:
    """A tqdm bar on a terminal, filled by steps or by seconds, whichever ends the stepping first.

    Off in a log (``disable=None``: stderr is no terminal), where its carriage
    returns would pile up on one line, and without tqdm: the lines printed
    before and after the stepping say the same, less often.
    """

    def __init__(self, mode: str, steps: int, seconds: float) -> None:
        self.steps, self.seconds = steps, seconds
        try:
            from tqdm import tqdm
        except ImportError:  # the demo extra brings tqdm
            self.bar = None
            return
        # No ETA: tqdm's would assume every step is run, and a time budget may end the stepping first.
        self.bar = tqdm(total=1.0, desc=f"{mode:>11}: stepping", bar_format="{desc} |{bar:40}|{postfix}",
                        leave=False, disable=None, file=sys.stderr)

    def show(self, step: int, elapsed: float) -> None:
        if self.bar is None or self.bar.disable:
            return
        self.bar.set_postfix_str(f"{step} steps in {elapsed:.1f} s", refresh=False)
        self.bar.update(min(1.0, max(step / self.steps, elapsed / self.seconds)) - self.bar.n)  # redraws at most 10x a second

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_backend(mode: str, actions: np.ndarray, seconds: float, starting: str = "") -> Run:
    """Start, reset, step (up to ``len(actions)`` steps or ``seconds``) and close one backend."""
    num_envs = actions.shape[1]
    run = Run(mode)
    say(f"{mode:>11}: starting{starting}")
    started = time.perf_counter()
    with ParallelEnv.make("CartPole-v1", num_envs=num_envs, para_mode=mode, asynchronous="restart",
                          stats=True) as penv:
        penv.reset(seed=0)
        run.startup_s = time.perf_counter() - started
        say(f"{mode:>11}: started in {run.startup_s:.2f} s; stepping {len(actions)} steps or {seconds:g} s")
        progress = Progress(mode, len(actions), seconds)
        began = time.perf_counter()
        for step_actions in actions:
            obs, reward, terminated, truncated, _ = penv.step(step_actions)
            run.checksums.append(float(obs.sum()))  # NumPy arrays, or torch tensors from the tensor backend
            run.episodes += int((terminated | truncated).sum())
            elapsed = time.perf_counter() - began
            progress.show(len(run.checksums), elapsed)
            if elapsed >= seconds:
                break
        run.stepping_s = time.perf_counter() - began
        run.steps = len(run.checksums)
        run.parts = penv.stats().caller.per_batch_step()
        progress.close()
    say(f"{mode:>11}: {run.steps} steps in {run.stepping_s:.2f} s, "
        f"{run.env_steps_per_s(num_envs):,.0f} env-steps/s")
    return run


def same_trajectory(run: Run, reference: Run | None) -> str:
    if run.mode == "tensor":
        return "n/a: own RNG"
    if reference is None:
        return "n/a"
    steps = min(run.steps, reference.steps)
    return "yes" if run.checksums[:steps] == reference.checksums[:steps] else "NO"


def print_table(runs: list[Run], num_envs: int) -> None:
    reference = next((run for run in runs if run.error is None and run.mode != "tensor"), None)
    say(f"\nCartPole-v1, {num_envs} envs, asynchronous='restart', seed 0\n")
    say(f"| {'backend':<11} | {'start-up s':>10} | {'steps':>6} | {'env-steps/s':>12} | {'episodes':>8} "
        f"| same trajectory |")
    say(f"|{'-' * 13}|{'-' * 12}|{'-' * 8}|{'-' * 14}|{'-' * 10}|{'-' * 17}|")
    for run in runs:
        if run.error is not None:
            say(f"| {run.mode:<11} | not run: {run.error}")
            continue
        say(f"| {run.mode:<11} | {run.startup_s:>10.2f} | {run.steps:>6} | {run.env_steps_per_s(num_envs):>12,.0f} "
            f"| {run.episodes:>8} | {same_trajectory(run, reference):<15} |")
    say(
        "\nTrajectories are compared over the steps both backends ran. A CartPole step costs ~7 us, less\n"
        "than a round trip to another process: the process and Ray backends pay off on costlier envs\n"
        "(README.rst's Benchmarks; docs/guide/performance.rst); the tensor backend on thousands of envs."
    )
    say("\nWhere a batch step's time goes, in microseconds (penv.stats(); docs/guide/timings.rst):\n")
    say(f"| {'backend':<11} | {'wall':>9} | {'envs (wait)':>11} | {'send':>8} | {'merge':>8} | {'own':>8} |")
    say(f"|{'-' * 13}|{'-' * 11}|{'-' * 13}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    for run in runs:
        if run.error is None:
            us = {part: seconds * 1e6 for part, seconds in run.parts.items()}
            say(f"| {run.mode:<11} | {us['wall']:>9.1f} | {us['wait']:>11.1f} | {us['send']:>8.1f} "
                f"| {us['merge']:>8.1f} | {us['own']:>8.1f} |")
    if any(run.mode.startswith("ray") for run in runs):
        say("The first Ray backend's start-up includes connecting to Ray, or starting a local cluster.")
    if any(run.mode == "tensor" and run.error is None for run in runs):
        say("The tensor backend's start-up includes importing torch, unless something imported it before.")


def draw_chart(path: Path, runs: list[Run], num_envs: int) -> None:
    """Env-steps/s (log scale), start-up seconds and where a batch step's time goes, per backend, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed for a file, and none on a server
    import matplotlib.pyplot as plt

    shown = [run for run in runs if run.error is None]
    modes = [run.mode for run in shown]
    colours = [COLOURS.get(mode, "#b3b3b3") for mode in modes]
    rates = [run.env_steps_per_s(num_envs) for run in shown]
    startups = [run.startup_s for run in shown]
    fig, (speed, startup, breakdown) = plt.subplots(1, 3, figsize=(14, 0.45 * len(shown) + 1.8), sharey=True,
                                                    gridspec_kw={"width_ratios": [3, 2, 2]})
    speed.barh(modes, rates, color=colours)
    speed.set_xscale("log")  # on a linear scale dummy's CartPole bar would flatten ray's
    speed.set_xlim(10 ** math.floor(math.log10(min(rates) / 2)), max(rates) * 4)
    speed.set_xlabel("env-steps/s (log scale; higher is faster)")
    for position, (rate, run) in enumerate(zip(rates, shown, strict=True)):
        speed.text(rate, position, f"  {rate:,.0f} ({run.steps} steps)", va="center", fontsize=8)
    speed.invert_yaxis()
    startup.barh(modes, startups, color=colours)
    startup.set_xlim(right=max(startups) * 1.35)
    startup.set_xlabel("start-up s: construction and first reset")
    for position, seconds in enumerate(startups):
        startup.text(seconds, position, f"  {seconds:.2f}", va="center", fontsize=8)
    left = np.zeros(len(shown))
    for part, colour in PART_COLOURS.items():  # each part's share of the batch step's wall time
        shares = np.array([100 * run.parts[part] / run.parts["wall"] if run.parts.get("wall") else 0.0 for run in shown])
        breakdown.barh(modes, shares, left=left, color=colour, label=PART_NAMES[part])
        left += shares
    breakdown.set_xlim(0, 100)
    breakdown.set_xlabel("% of a batch step (penv.stats())")
    breakdown.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)
    fig.suptitle(f"parallelenv demo: CartPole-v1, {num_envs} envs, asynchronous='restart'; "
                 f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the parts' legend sits below its panel
    plt.close(fig)


def quiet_ray(modes: list[str]) -> None:
    """Choose Ray's token authentication explicitly, as its default already is, to silence its notice.

    Ray reads ``RAY_AUTH_MODE`` once, when it is imported, so this only helps
    (and only runs) before that; a value the caller set stays.
    """
    if any(mode.startswith("ray") for mode in modes) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m parallelenv.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16, help="CartPole-v1 envs per backend (default: 16)")
    parser.add_argument("--steps", type=int, default=1000, help="steps per backend at most (default: 1000)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of stepping per backend at most (default: 3)")
    parser.add_argument("--modes", nargs="*", default=backend_names(), help="backends (default: every registered one)")
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART, help=f"the PNG to write (default: {DEFAULT_CHART})")
    args = parser.parse_args(argv)
    quiet_ray(args.modes)
    say(f"CartPole-v1 on {', '.join(args.modes)}: {args.num_envs} envs each, up to {args.steps} steps "
        f"or {args.seconds:g} s of stepping per backend\n")
    actions = np.random.default_rng(0).integers(0, 2, size=(args.steps, args.num_envs))
    runs = []
    first_ray = next((mode for mode in args.modes if mode.startswith("ray")), None)
    for mode in args.modes:
        starting = " (and Ray: a local cluster, unless one is running, takes seconds)" if mode == first_ray else ""
        try:
            runs.append(run_backend(mode, actions, args.seconds, starting))
        except ImportError as missing:  # a backend whose extra is not installed
            say(f"{mode:>11}: not run: {missing}")
            runs.append(Run(mode, error=str(missing)))
    print_table(runs, args.num_envs)
    if not any(run.error is None for run in runs):
        return
    try:
        draw_chart(args.chart, runs, args.num_envs)
    except ImportError:
        say(f"\nNo chart: {missing_extra('the chart needs matplotlib', 'demo')}.")
        return
    say(f"\nChart of env-steps/s, start-up and where a batch step's time goes per backend: {args.chart.resolve()}")


if __name__ == "__main__":
    main()
