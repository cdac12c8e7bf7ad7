"""The tensor backend, eager and compiled, beside its peers and the machine's memory bound, in one run.

``make bench-tensor`` runs this. At each size, rounds of interleaved
repeats (A B C ... A B C ...) time, with the same pre-sampled random actions
and auto-reset throughout:

- ``ParallelEnv(CartPole(N), para_mode="tensor", asynchronous="restart")``,
  eager and with ``compile=True`` (compiled once, before the first round);
- Gymnasium's NumPy ``CartPoleVectorEnv`` (``make_vec(...,
  vectorization_mode="vector_entry_point")``);
- gymnax's CartPole-v1 in its own venv (:mod:`benchmarks.gymnax_peer`): a
  jitted call per step, and the whole repeat in one ``lax.scan``;
- the memory bound: a copy of the bytes a step must move (each state
  tensor read and written, the action read, the obs, reward, flags, last obs
  and ended mask written), as envs per second;
- Pendulum and Chasing through ParallelEnv, eager and compiled;
- ``Walk``, a user's env written as ``TensorEnv``'s example writes one, eager and compiled.

It prints a markdown table (medians, min..max) and each env's compile time
on its first step.

    python -m benchmarks.tensor_peers --sizes 65536 1048576 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
GYMNAX_PYTHON = REPO_ROOT / ".venv-gymnax" / "bin" / "python"
ACTION_ROWS = 16
FLAGS_BYTES = 4 + 1 + 1 + 1  # reward, terminated, truncated, the ended mask


def step_bytes(env: Any) -> int:
    """Bytes per env a step with restarts must move at least: each state tensor read and written, the action
    read, the obs and the last obs written, the reward and flags written."""
    def row(tensor: Any) -> int:
        return tensor[0].numel() * tensor.element_size()

    state = sum(2 * row(getattr(env, name)) for name in env.state_fields)
    return state + row(env.actions) + 2 * row(env.obs) + FLAGS_BYTES


def walk_class() -> Any:
    """A user's env written as :class:`parallelenv.tensor.TensorEnv`'s example writes one (in place, into its
    own tensors and the output buffers with ``out=``), which compiles unchanged."""
    import torch
    from gymnasium import spaces

    from parallelenv.tensor import TensorEnv, fill_rows, put_rows

    class Walk(TensorEnv):
        single_observation_space = spaces.Box(-10.0, 10.0, (1,))
        single_action_space = spaces.Discrete(2)
        state_fields = ("position", "elapsed")

        def __init__(self, num_envs: int, device: str = "cpu") -> None:
            super().__init__(num_envs, device)
            self.position = torch.zeros(num_envs, 1, device=self.device)
            self.elapsed = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

        def reset_envs(self, rows: Any, options: Any) -> None:
            put_rows(self.position, rows, self.rng.uniform((1,), -1.0, 1.0, rows))
            fill_rows(self.elapsed, rows, 0)
            self.obs.copy_(self.position)

        def step_envs(self, actions: Any) -> None:
            self.position.add_(actions[:, None] * 2 - 1).clamp_(-10.0, 10.0)
            self.elapsed += 1
            self.obs.copy_(self.position)
            torch.abs(self.position[:, 0], out=self.reward)
            torch.ge(self.reward, 10.0, out=self.terminated)
            torch.ge(self.elapsed, 100, out=self.truncated)

    return Walk


class Ours:
    """A shipped tensor env through ParallelEnv, eager or compiled, stepping pre-sampled actions."""

    def __init__(self, env_class: Any, num_envs: int, steps: int, compile: bool) -> None:
        import torch

        from parallelenv import ParallelEnv

        self.env = env_class(num_envs, device="cpu")
        self.penv = ParallelEnv(self.env, para_mode="tensor", asynchronous="restart", compile=compile)
        self.penv.reset(seed=0)
        space = self.env.single_action_space
        generator = torch.Generator().manual_seed(12345)
        if hasattr(space, "n"):
            self.actions = torch.randint(0, int(space.n), (ACTION_ROWS, num_envs), generator=generator)
        else:
            self.actions = torch.rand((ACTION_ROWS, num_envs, *space.shape), generator=generator) * 2 - 1
        self.num_envs, self.steps = num_envs, steps
        started = time.perf_counter()
        self.penv.step(self.actions[0])  # compiles, where asked
        self.first_step_s = time.perf_counter() - started
        for row in self.actions[1:4]:
            self.penv.step(row)

    def rate(self) -> float:
        step, actions = self.penv.step, self.actions
        started = time.perf_counter()
        for i in range(self.steps):
            step(actions[i % ACTION_ROWS])
        return self.num_envs * self.steps / (time.perf_counter() - started)

    def close(self) -> None:
        self.penv.close()


class NumpyCartPole:
    """Gymnasium's NumPy-vectorised CartPole, next-step autoreset (its default)."""

    def __init__(self, num_envs: int, steps: int) -> None:
        import gymnasium
        import numpy as np

        self.venv = gymnasium.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
        self.venv.reset(seed=0)
        self.actions = np.random.default_rng(12345).integers(0, 2, (ACTION_ROWS, num_envs))
        self.num_envs, self.steps = num_envs, steps

    def rate(self) -> float:
        step, actions = self.venv.step, self.actions
        started = time.perf_counter()
        for i in range(self.steps):
            step(actions[i % ACTION_ROWS])
        return self.num_envs * self.steps / (time.perf_counter() - started)

    def close(self) -> None:
        self.venv.close()


class Gymnax:
    """gymnax in its own venv's process, asked for one repeat of a form at a time."""

    def __init__(self, python: Path, num_envs: int, steps: int) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(REPO_ROOT / "benchmarks" / "gymnax_peer.py"), "--envs", str(num_envs),
             "--steps", str(steps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"gymnax's process did not start: {line!r}")

    def rate(self, form: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(form + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


class CopyBound:
    """A copy of ``bytes_per_env`` per env (half read, half written): the rate memory allows a step."""

    def __init__(self, num_envs: int, bytes_per_env: int, steps: int) -> None:
        import torch

        count = num_envs * bytes_per_env // 2 // 4
        self.source, self.target = torch.ones(count), torch.empty(count)
        self.num_envs, self.steps = num_envs, steps

    def rate(self) -> float:
        target, source = self.target, self.source
        started = time.perf_counter()
        for _ in range(self.steps):
            target.copy_(source)
        return self.num_envs * self.steps / (time.perf_counter() - started)

    def close(self) -> None:
        return None


def measure(sizes: list[int], repeats: int, step_seconds: float, gymnax: Path | None) -> tuple[list[dict], dict]:
    from parallelenv.envs import CartPole, Chasing, Pendulum

    rows, compile_s = [], {}
    for num_envs in sizes:
        steps = max(10, int(step_seconds * 2e7 / num_envs))  # ~step_seconds a repeat at 20 M env-steps/s
        runners: dict[str, Any] = {}
        for env_class in (CartPole, Pendulum, Chasing, walk_class()):
            name = env_class.__name__
            runners[f"{name} eager"] = Ours(env_class, num_envs, steps, compile=False)
            runners[f"{name} compiled"] = compiled = Ours(env_class, num_envs, steps, compile=True)
            compile_s[(name, num_envs)] = compiled.first_step_s
        runners["CartPole Gymnasium NumPy"] = NumpyCartPole(num_envs, steps)
        runners["CartPole copy bound"] = CopyBound(num_envs, step_bytes(runners["CartPole eager"].env), steps)
        peer = None
        if gymnax is not None:
            peer = Gymnax(gymnax, num_envs, steps)
            for form in ("step", "scan"):
                runners[f"CartPole gymnax {form}"] = form
        rates: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(repeats):
            for name, runner in runners.items():
                rates[name].append(peer.rate(runner) if isinstance(runner, str) else runner.rate())  # type: ignore[union-attr]
        for runner in runners.values():
            if not isinstance(runner, str):
                runner.close()
        if peer is not None:
            peer.close()
        rows.append({"envs": num_envs, "steps": steps, "rates": rates,
                     "bytes": step_bytes(CartPole(1, device="cpu"))})
    return rows, compile_s


def table(rows: list[dict], compile_s: dict) -> str:
    def m(rates: list[float]) -> str:
        return f"{statistics.median(rates) / 1e6:,.1f} ({min(rates) / 1e6:,.1f}..{max(rates) / 1e6:,.1f})"

    lines = ["| envs | what | M env-steps/s, median (min..max) | compiled over this |", "| ---: | --- | ---: | ---: |"]
    for row in rows:
        rates = row["rates"]
        for name, values in rates.items():
            env = name.split()[0]
            ours = statistics.median(rates[f"{env} compiled"])
            ratio = "" if name.endswith("compiled") else f"{ours / statistics.median(values):.2f}x"
            if name.endswith("bound"):
                name += f" ({row['bytes']} B an env)"
            lines.append(f"| {row['envs']:,} | {name} | {m(values)} | {ratio} |")
    lines += ["", "Compile time on the first step (s): " + ", ".join(
        f"{env} at {n:,}: {seconds:.1f}" for (env, n), seconds in compile_s.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tensor_peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[65_536, 1_048_576])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="about how long a repeat of eager torch runs")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch's threads, eager and compiled alike (default: this process's cores; gymnax's "
                             "JAX takes its own default)")
    parser.add_argument("--gymnax-python", type=Path, default=GYMNAX_PYTHON)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    gymnax = args.gymnax_python if args.gymnax_python.exists() else None
    if gymnax is None:
        print(f"no {args.gymnax_python}: gymnax left out (make bench-tensor makes its venv)", file=sys.stderr)
    rows, compile_s = measure(args.sizes, args.repeats, args.seconds, gymnax)
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), repeats {args.repeats}, "
          f"steps a repeat: {', '.join(str(row['steps']) for row in rows)}\n")
    print(table(rows, compile_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
