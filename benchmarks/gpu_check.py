"""The tensor backend on a CUDA device: its tests, the shipped envs against the CPU, and their speed.

``make gpu-check`` runs this on a machine with a CUDA torch (``make
gpu-wheels`` first fetches, where the network is, what such a machine
lacks). It writes one markdown report, and prints it:

- the test modules of the tensor backend and those holding ``gpu`` tests,
  with torch's device there (the ``gpu`` tests run on ``cuda``; they skip,
  saying so, where no CUDA device is);
- each shipped tensor env stepped through ``ParallelEnv(para_mode="tensor")``
  on ``cuda`` and on the CPU from the same seed with the same actions, and how
  far apart the two came;
- each shipped tensor env on ``cuda`` with ``compile=True`` against its
  eager step, 1,000 steps, each from the eager env's state;
- CartPole's env-steps per second through the front object (eager and
  compiled) and called directly, at each size (65,536 / 1M / 16M envs by default) on ``cuda``, and
  at the sizes the CPU can take on one thread, for reference.

    python -m benchmarks.gpu_check --out build/gpu-check/gpu-check.md
    python -m benchmarks.gpu_check --sizes 4096 --steps 5 --repeats 1 --no-tests   # a smoke run on a CPU

The exit status is 1 when a test or a device check failed, else 0 (also where
there is no CUDA device: the report says so in its first lines).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.machine import describe, machine_line

REPO_ROOT = Path(__file__).resolve().parent.parent
SIZES = (65_536, 1_048_576, 16_777_216)
CPU_MAX_ENVS = 65_536  # one CPU thread at 16M envs would take minutes a size
ACTION_ROWS = 16  # pre-sampled rows cycled through: (steps, 16M) int64 actions would be gigabytes
ACTION_SEED = 12345
CHECK_ENVS, CHECK_STEPS = 256, 250  # past Pendulum's 200-step episodes: restarts compared too
# Float32 kernels on two devices round differently in the last bits; from the same state, one step apart
# by more than this is a bug, not rounding.
CHECK_ATOL = 1e-4
# Compiled against eager on one device (tests/test_tensor_compiled.py states why these bounds).
COMPILED_STEPS, COMPILED_RTOL, COMPILED_ATOL = 1000, 1e-6, 4e-6


@dataclass
class TestRun:
    """One pytest run: what it ran, and its summary line's counts."""

    name: str
    command: list[str]
    returncode: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    skips: list[str] = field(default_factory=list)


def run_tests(device_note: str) -> list[TestRun]:
    """The tensor tests, and every ``gpu`` test elsewhere, each module set in its own pytest run."""
    gpu_modules = sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "tests").glob("test_*.py")
                         if "mark.gpu" in path.read_text() and path.name != "test_tensor.py")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    runs = [TestRun("tests/test_tensor.py (its gpu tests on cuda, the rest on the CPU)",
                    [*base, "tests/test_tensor.py"]),
            TestRun(f"gpu tests of {', '.join(gpu_modules)}", [*base, "-m", "gpu", *gpu_modules])]
    for run in runs:
        print(f"$ {' '.join(run.command[1:])}   # {device_note}", flush=True)
        done = subprocess.run(run.command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        print(done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True)
        run.returncode = done.returncode
        lines = done.stdout.strip().splitlines()
        summary = lines[-1] if lines else ""
        run.counts = {word: int(count) for count, word in re.findall(r"(\d+) (\w+)", summary)}
        run.skips = [line for line in lines if line.startswith("SKIPPED")]
    return runs


def device_checks(torch: Any, device: str) -> list[dict[str, Any]]:
    """Each shipped tensor env on ``device`` and on the CPU, same seed, same actions: how far apart."""
    from parallelenv import ParallelEnv

    def check(env_class: Any, twins: list[Any]) -> dict[str, Any]:
        envs = [env_class(CHECK_ENVS, device=where) for where in ("cpu", device)]
        twins.extend(ParallelEnv(env, para_mode="tensor", asynchronous="restart", compile=False) for env in envs)
        actions = _actions(torch, twins[0].single_action_space, CHECK_STEPS, CHECK_ENVS, "cpu")
        same_flags, ended = True, 0
        obs = [penv.reset(seed=7)[0] for penv in twins]
        worst = float((obs[0] - obs[1].cpu()).abs().max())
        for row in actions:
            # Each step from the same state: over an episode a last-bit difference grows chaotically
            # (one ulp of Pendulum's angle is 0.6 apart in 200 steps on the CPU alone), which says
            # nothing of the kernels.
            for name in envs[0].state_fields:
                getattr(envs[1], name).copy_(getattr(envs[0], name))
            (cpu_obs, cpu_rew, cpu_term, cpu_trunc, _), (dev_obs, dev_rew, dev_term, dev_trunc, _) = (
                twins[0].step(row), twins[1].step(row.to(device)))
            worst = max(worst, float((cpu_obs - dev_obs.cpu()).abs().max()),
                        float((cpu_rew - dev_rew.cpu()).abs().max()))
            same_flags &= bool(torch.equal(cpu_term, dev_term.cpu()) and torch.equal(cpu_trunc, dev_trunc.cpu()))
            ended += int((cpu_term | cpu_trunc).sum())
        return {"env": env_class.__name__, "max_difference": worst, "same_flags": same_flags,
                "episodes_ended": ended, "ok": same_flags and worst <= CHECK_ATOL}

    return _each_shipped_env(check)


def _each_shipped_env(check: Any) -> list[dict[str, Any]]:
    """``check(env_class, twins)``'s row for each shipped tensor env; the ParallelEnvs it puts in ``twins``
    are closed after it. An env whose check raises is a row of the report, and the others still run."""
    from parallelenv.envs import CartPole, Chasing, Pendulum

    checks = []
    for env_class in (CartPole, Pendulum, Chasing):
        twins: list[Any] = []
        try:
            checks.append(check(env_class, twins))
        except Exception as exc:
            checks.append({"env": env_class.__name__, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False})
        finally:
            for penv in twins:
                penv.close()
    return checks


def _actions(torch: Any, space: Any, steps: int, num_envs: int, device: str) -> Any:
    """(steps, num_envs, ...) actions in ``space``, drawn with a seeded generator on ``device``."""
    generator = torch.Generator(device=device).manual_seed(ACTION_SEED)
    if hasattr(space, "n"):
        return torch.randint(0, int(space.n), (steps, num_envs), device=device, generator=generator)
    low = torch.as_tensor(space.low, device=device)
    high = torch.as_tensor(space.high, device=device)
    return low + (high - low) * torch.rand((steps, num_envs, *space.shape), device=device, generator=generator)


def compiled_checks(torch: Any, device: str) -> list[dict[str, Any]]:
    """Each shipped tensor env on ``device``, compile=True against eager, same seed, same actions, each step
    from the eager env's state: the same flags every step, values within COMPILED_RTOL / COMPILED_ATOL."""
    from parallelenv import ParallelEnv

    def check(env_class: Any, twins: list[Any]) -> dict[str, Any]:
        envs = [env_class(CHECK_ENVS, device=device) for _ in range(2)]
        twins.extend(ParallelEnv(env, para_mode="tensor", asynchronous="restart", compile=compile)
                     for env, compile in zip(envs, (False, True), strict=True))
        actions = _actions(torch, twins[0].single_action_space, COMPILED_STEPS, CHECK_ENVS, device)
        same_flags, ended, worst = True, 0, 0.0
        obs = [penv.reset(seed=7)[0] for penv in twins]
        same_flags &= bool(torch.equal(obs[0], obs[1]))
        for row in actions:
            for name in envs[0].state_fields:
                getattr(envs[1], name).copy_(getattr(envs[0], name))
            want, got = twins[0].step(row), twins[1].step(row)
            for a, b in zip(want[:2], got[:2], strict=True):
                excess = (b - a).abs() - COMPILED_RTOL * a.abs()
                worst = max(worst, float(excess.max()))
            same_flags &= all(bool(torch.equal(a, b)) for a, b in zip(want[2:4], got[2:4], strict=True))
            same_flags &= bool(torch.equal(want[4]["_ended_state"], got[4]["_ended_state"]))
            ended += int(want[4]["_ended_state"].sum())
        return {"env": f"{env_class.__name__}: compile=True against eager on the device, "
                       f"{COMPILED_STEPS} steps, within {COMPILED_RTOL:g} relative + {COMPILED_ATOL:g}",
                "max_difference": max(worst, 0.0), "same_flags": same_flags,
                "episodes_ended": ended, "ok": same_flags and worst <= COMPILED_ATOL}

    return _each_shipped_env(check)


def time_cartpole(torch: Any, num_envs: int, device: str, through_front: bool, steps: int,
                  repeats: int, compile: bool = False) -> dict[str, Any]:
    """Env-steps/s of CartPole(num_envs) on ``device`` per repeat: through ParallelEnv, or called directly
    and restarting ended episodes itself, as ``asynchronous="restart"`` does."""
    from parallelenv import ParallelEnv
    from parallelenv.envs import CartPole

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    env = CartPole(num_envs, device=device)
    penv = (ParallelEnv(env, para_mode="tensor", asynchronous="restart", compile=compile) if through_front
            else None)
    try:
        actions = _actions(torch, env.single_action_space, ACTION_ROWS, num_envs, device)
        step = penv.step if penv is not None else _direct_step(torch, env)
        (penv.reset if penv is not None else env.reset)(seed=0)
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        for i in range(max(5, steps // 10)):  # kernels compiled and cached, allocator warmed
            step(actions[i % ACTION_ROWS])
        sync()
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(steps):
                step(actions[i % ACTION_ROWS])
            sync()
            rates.append(num_envs * steps / (time.perf_counter() - start))
        peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
        return {"envs": num_envs, "device": device, "wrapper": _wrapper(through_front, compile),
                "rates": rates, "peak_mib": peak}
    finally:
        if penv is not None:
            penv.close()


def _wrapper(through_front: bool, compile: bool) -> str:
    return ("ParallelEnv compiled" if compile else "ParallelEnv") if through_front else "direct"


def _direct_step(torch: Any, env: Any) -> Callable[[Any], None]:
    def step(row: Any) -> None:
        env.step(row)
        env.reset_where(torch.logical_or(env.terminated, env.truncated))

    return step


def benchmark(torch: Any, sizes: list[int], cuda: bool, steps: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    places = (["cuda"] if cuda else []) + ["cpu"]
    for num_envs in sizes:
        for device in places:
            if device == "cpu" and num_envs > CPU_MAX_ENVS:
                continue
            for through_front, compile in ((True, False), (True, True), (False, False)):
                try:
                    rows.append(time_cartpole(torch, num_envs, device, through_front, steps, repeats, compile))
                except Exception as exc:  # out of memory at 16M, say: the smaller sizes still count
                    rows.append({"envs": num_envs, "device": device, "rates": [],
                                 "wrapper": _wrapper(through_front, compile),
                                 "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]})
                print(_bench_cells(rows[-1]), flush=True)
    return rows


def _bench_cells(row: dict[str, Any]) -> str:
    if not row["rates"]:
        return f"| {row['envs']:,} | {row['device']} | {row['wrapper']} | failed: {row['error']} | | |"
    median = statistics.median(row["rates"])
    spread = f" ({min(row['rates']) / 1e6:,.1f}..{max(row['rates']) / 1e6:,.1f})" if len(row["rates"]) > 1 else ""
    peak = "" if row["peak_mib"] is None else f"{row['peak_mib']:,.0f}"
    return (f"| {row['envs']:,} | {row['device']} | {row['wrapper']} | {median / 1e6:,.1f}{spread} | "
            f"{row['envs'] / median * 1e6:,.0f} | {peak} |")


def report(header: list[str], tests: list[TestRun], checks: list[dict[str, Any]],
           bench: list[dict[str, Any]], steps: int, repeats: int) -> str:
    lines = ["# parallelenv on a CUDA device", "", *header, ""]
    if tests:
        lines += ["| tests | passed | failed | skipped | errors |", "| --- | ---: | ---: | ---: | ---: |"]
        for run in tests:
            counts = run.counts
            lines.append(f"| {run.name} | {counts.get('passed', 0)} | {counts.get('failed', 0)} | "
                         f"{counts.get('skipped', 0)} | {counts.get('error', 0) + counts.get('errors', 0)} |")
        skips = sorted({skip for run in tests for skip in run.skips})
        lines += [""] + [f"- {skip}" for skip in skips] + ([""] if skips else [])
    if checks:
        lines += [f"Each shipped tensor env, {CHECK_ENVS} envs, {CHECK_STEPS} steps from seed 7 with the same "
                  f"actions on the device and on the CPU (asynchronous='restart'), the device's env given the "
                  f"CPU's state before each step; ok: the same terminated and truncated flags every step, "
                  f"observations and rewards within {CHECK_ATOL:g}:", "",
                  "| env | max difference | same flags | episodes ended | ok |", "| --- | ---: | --- | ---: | --- |"]
        for check in checks:
            if "error" in check:
                lines.append(f"| {check['env']} | failed: {check['error']} | | | no |")
            else:
                lines.append(f"| {check['env']} | {check['max_difference']:.2e} | {check['same_flags']} | "
                             f"{check['episodes_ended']} | {'yes' if check['ok'] else 'NO'} |")
        lines.append("")
    if bench:
        lines += [f"CartPole env-steps/s, millions, median of {repeats} repeats (min..max) of {steps} batch steps "
                  f"after a warm-up, the device synchronised before and after each; actions: {ACTION_ROWS} "
                  "pre-sampled rows on the device, cycled. ParallelEnv: para_mode='tensor', asynchronous='restart'; "
                  "direct: CartPole.step and reset_where of the ended envs, the front's work without it. "
                  "CPU rows: one torch thread.", "",
                  "| envs | device | wrapper | M env-steps/s | us per batch step | peak GPU MiB |",
                  "| ---: | --- | --- | ---: | ---: | ---: |"]
        lines += [_bench_cells(row) for row in bench]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="CartPole sizes to time")
    parser.add_argument("--steps", type=int, default=100, help="batch steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-tests", action="store_true", help="leave out the pytest runs")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "gpu-check" / "gpu-check.md")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("python -m benchmarks.gpu_check: torch is not installed here; nothing to check", file=sys.stderr)
        return 1
    torch.set_num_threads(1)  # the CPU rows: one core, as the harness's tensor workloads have
    cuda = torch.cuda.is_available()
    machine = describe()
    header = [f"{machine['date']}; {machine_line(machine)}", "",
              f"torch {torch.__version__}, CUDA {torch.version.cuda}; " + (
                  f"device: {torch.cuda.get_device_name(0)}" if cuda else
                  "**no CUDA device here: the gpu tests skip, the device checks and CUDA rows are left out**")]
    print("\n".join(header), flush=True)
    tests = [] if args.no_tests else run_tests("cuda" if cuda else "no CUDA device: the gpu tests skip")
    checks = (device_checks(torch, "cuda") + compiled_checks(torch, "cuda")) if cuda else []
    bench = benchmark(torch, args.sizes, cuda, args.steps, args.repeats)
    text = report(header, tests, checks, bench, args.steps, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}", file=sys.stderr)
    failed = any(run.returncode not in (0, 5) for run in tests) or not all(check["ok"] for check in checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
