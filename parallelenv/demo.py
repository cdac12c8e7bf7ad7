"""``python -m parallelenv.demo``: CartPole-v1 through every backend, with a results table.

A short run of a real Gymnasium env on each registered backend, the same
seed and actions for all; it prints how fast each stepped, how long each
took to start, and whether their trajectories agreed. The tensor backend
runs ``parallelenv.envs.CartPole``, the same dynamics as batched torch code
with random streams of its own, so its trajectory is not compared.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from parallelenv import ParallelEnv
from parallelenv.backends import backend_names


def _progress(total: int, description: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the demo extra brings tqdm; run without a bar otherwise
        return None
    return tqdm(total=total, desc=description, unit="step", leave=False)


def run_backend(mode: str, num_envs: int, steps: int, actions: np.ndarray) -> dict[str, Any]:
    """Start, reset, step and close one backend; returns its row of the table."""
    started = time.perf_counter()
    with ParallelEnv.make("CartPole-v1", num_envs=num_envs, para_mode=mode, asynchronous="restart") as penv:
        penv.reset(seed=0)
        startup = time.perf_counter() - started
        bar = _progress(steps, f"{mode:>8}")
        checksum = 0.0
        episodes = 0
        began = time.perf_counter()
        for step_actions in actions:
            obs, reward, terminated, truncated, _ = penv.step(step_actions)
            checksum += float(obs.sum())  # NumPy arrays, or torch tensors from the tensor backend
            episodes += int((terminated | truncated).sum())
            if bar is not None:
                bar.update()
        elapsed = time.perf_counter() - began
        if bar is not None:
            bar.close()
    return {
        "mode": mode,
        "steps_per_s": steps * num_envs / elapsed,
        "startup_s": startup,
        "episodes": episodes,
        "checksum": checksum,
    }


def print_table(rows: list[dict[str, Any]], num_envs: int, steps: int) -> None:
    reference = next((row["checksum"] for row in rows if "checksum" in row), None)
    print(f"\nCartPole-v1, {num_envs} envs, {steps} steps each, asynchronous='restart', seed 0\n")
    print(f"| {'backend':<11} | {'env-steps/s':>12} | {'start-up s':>10} | {'episodes':>8} | same trajectory |")
    print(f"|{'-' * 13}|{'-' * 14}|{'-' * 12}|{'-' * 10}|{'-' * 17}|")
    for row in rows:
        if "error" in row:
            print(f"| {row['mode']:<11} | {'not run: ' + row['error']}")
            continue
        if row["mode"] == "tensor":
            same = "n/a: own RNG"
        else:
            same = "yes" if row["checksum"] == reference else "NO"
        print(
            f"| {row['mode']:<11} | {row['steps_per_s']:>12,.0f} | {row['startup_s']:>10.2f} "
            f"| {row['episodes']:>8} | {same:<15} |"
        )
    print(
        "\nA CartPole step costs ~7 us, less than a round trip to another process: the process and Ray\n"
        "backends pay off on costlier envs (README.rst, Benchmarks); the tensor backend on thousands of envs."
    )
    if any(row["mode"].startswith("ray") for row in rows):
        print("The first Ray backend's start-up includes starting a local Ray cluster.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--modes", nargs="*", default=backend_names())
    args = parser.parse_args(argv)
    actions = np.random.default_rng(0).integers(0, 2, size=(args.steps, args.num_envs))
    rows = []
    for mode in args.modes:
        try:
            rows.append(run_backend(mode, args.num_envs, args.steps, actions))
        except ImportError as missing:  # a backend whose extra is not installed
            rows.append({"mode": mode, "error": str(missing)})
    print_table(rows, args.num_envs, args.steps)


if __name__ == "__main__":
    main()
