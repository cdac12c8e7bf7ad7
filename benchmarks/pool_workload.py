"""pool8: a RolloutPool of 2 workers x 4 envs beside one VecWorker over 8 envs, and the cost of a weight update.

The envs are busy8's (:class:`benchmarks.workloads.BusyEnv`: 0.5 ms of CPU
a step); a torch MLP chooses the actions. What is measured:

- env-steps per second of collection, for the pool (``obtain_samples`` in
  synchronous mode) and for one VecWorker over ``para_mode="dummy"`` in the
  caller, and their ratio (the issue's target: >= 1.8 on 2 cores);
- the caller's CPU time per collected env-step (``time.process_time``, which
  counts the caller alone, not its workers): what is left of the caller's
  core for training;
- the time of one ``update_agent(state_dict, wait=True)`` of a 1M-parameter
  MLP, through shared memory (processes) and the object store (Ray), from
  the call until every worker has loaded it.

The harness can build the runners (:class:`PoolRunner`, :class:`OneWorkerRunner`,
each a :class:`benchmarks.registry.Runner`) or call :func:`pool_workload`,
which measures everything and returns one dict. ``python -m benchmarks.pool_workload``
prints it as JSON.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import psutil

from benchmarks.registry import EnvFactory, Runner, ray_cluster
from benchmarks.workloads import BusyEnv

NUM_ENVS = 8
NUM_WORKERS = 2
OBS_SIZE, NUM_ACTIONS = 64, 4  # BusyEnv's
POLICY_HIDDEN = (64, 64)  # the collection policy: a small MLP, ~0.1 ms on a batch of 8
# The update's MLP: 64*1000+1000 + 1000*935+935 + 935*4+4 = 1,004,679 parameters.
UPDATE_HIDDEN = (1000, 935)


def mlp(hidden: Sequence[int]) -> Any:
    """A greedy torch MLP policy over BusyEnv's observations (a module: it has a state dict)."""
    import torch

    class MLP(torch.nn.Module):  # made here, where torch is imported; workers get it by value
        def __init__(self, sizes: list[int]) -> None:
            super().__init__()
            layers: list[Any] = []
            for size_in, size_out in zip(sizes, sizes[1:], strict=False):
                layers += [torch.nn.Linear(size_in, size_out), torch.nn.Tanh()]
            self.net = torch.nn.Sequential(*layers[:-1])  # no Tanh after the output layer

        def forward(self, obs: Any) -> Any:
            return self.net(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=1).numpy()

    torch.manual_seed(0)
    return MLP([OBS_SIZE, *hidden, NUM_ACTIONS])


def busy_envs(num_envs: int = NUM_ENVS) -> list[EnvFactory]:
    return [functools.partial(BusyEnv)] * num_envs


class PoolRunner(Runner):
    """A RolloutPool of ``num_workers`` workers in synchronous mode; each ``run`` is one ``obtain_samples``."""

    def __init__(self, factories: Sequence[EnvFactory], backend: str = "processes",
                 num_workers: int = NUM_WORKERS) -> None:
        import torch

        from parallelenv.pool import RolloutPool

        torch.set_num_threads(1)
        self.num_envs = len(factories)
        self.pool = RolloutPool(list(factories), mlp(POLICY_HIDDEN), num_workers=num_workers, backend=backend, seed=0)

    def reset(self, seed: int) -> None:
        pass  # the pool's envs are seeded from its seed when they start

    def run(self, actions: np.ndarray) -> int:
        return self.pool.obtain_samples(0, len(actions) * self.num_envs).env_steps

    def pids(self) -> list[int]:
        return self.pool.pids()

    def close(self) -> None:
        self.pool.close()


class OneWorkerRunner(Runner):
    """The reference: one VecWorker over ``para_mode="dummy"``, the policy and every env in the caller."""

    def __init__(self, factories: Sequence[EnvFactory]) -> None:
        import torch

        from parallelenv import ParallelEnv
        from parallelenv.rollout import VecWorker

        torch.set_num_threads(1)
        penv = ParallelEnv(list(factories), para_mode="dummy", asynchronous="restart")
        self.worker = VecWorker(penv, mlp(POLICY_HIDDEN), seed=0)

    def reset(self, seed: int) -> None:
        self.worker.start_episode(seed)

    def run(self, actions: np.ndarray) -> int:
        return int(self.worker.collect(len(actions)).reward.size)

    def close(self) -> None:
        self.worker.shutdown()


def collection(makers: dict[str, Callable[[], Runner]], steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """Each runner's best of ``repeats`` timed runs of ``steps`` batch steps, the runners taking turns
    round by round (after one untimed warm-up each), so that a busy machine's drift hits them alike.

    ``cores_used`` is the CPU time of the caller and of the pool's worker processes over the wall
    time: on a machine shared with others it says whether the pool had its cores at all (with
    Linux's autogroup scheduling, the processes of one session share one session's part of the
    machine, however many they are). ``cpu_us_per_env_step`` is that CPU time per env-step.
    """
    runners = {}
    try:
        for name, make in makers.items():
            runners[name] = make()
            runners[name].reset(0)
        actions = np.zeros((steps, NUM_ENVS), np.int64)  # only their number counts: the policy acts
        for runner in runners.values():
            runner.run(actions[: max(1, steps // 10)])
        results: dict[str, dict[str, float]] = {}
        for _ in range(repeats):
            for name, runner in runners.items():
                processes = [psutil.Process(pid) for pid in getattr(runner, "pids", list)()]
                workers_cpu = sum(_cpu(p) for p in processes)
                wall, caller_cpu = time.perf_counter(), time.process_time()
                done = runner.run(actions)
                wall, caller_cpu = time.perf_counter() - wall, time.process_time() - caller_cpu
                workers_cpu = sum(_cpu(p) for p in processes) - workers_cpu
                best = results.setdefault(name, {"env_steps_per_s": 0.0, "caller_cpu_us_per_env_step": math.inf,
                                                 "cpu_us_per_env_step": math.inf})
                if done / wall > best["env_steps_per_s"]:
                    best.update(env_steps_per_s=done / wall, cores_used=(caller_cpu + workers_cpu) / wall)
                best["caller_cpu_us_per_env_step"] = min(best["caller_cpu_us_per_env_step"], 1e6 * caller_cpu / done)
                best["cpu_us_per_env_step"] = min(best["cpu_us_per_env_step"], 1e6 * (caller_cpu + workers_cpu) / done)
    finally:
        for runner in runners.values():
            runner.close()
    return results


def _cpu(process: psutil.Process) -> float:
    """A worker's CPU time so far (Ray actors on this machine included; 0 for one on another node)."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def update_seconds(backend: str, repeats: int) -> dict[str, float]:
    """Median and best time of ``update_agent(state_dict, wait=True)`` of the 1M-parameter MLP."""
    import torch

    from parallelenv.pool import RolloutPool

    torch.set_num_threads(1)
    policy = mlp(UPDATE_HIDDEN)
    times = []
    with RolloutPool(busy_envs(NUM_WORKERS), policy, num_workers=NUM_WORKERS, backend=backend) as pool:
        for _ in range(repeats):
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.add_(0.001)  # new weights each time, as after a training step
            started = time.perf_counter()
            pool.update_agent(policy.state_dict(), wait=True)
            times.append(time.perf_counter() - started)
    return {"median_ms": 1e3 * statistics.median(times), "best_ms": 1e3 * min(times),
            "parameters": sum(p.numel() for p in policy.parameters())}


@contextlib.contextmanager
def _maybe_ray(backend: str) -> Iterator[None]:
    with ray_cluster() if backend == "ray" else contextlib.nullcontext():
        yield


def pool_workload(steps: int = 200, repeats: int = 5, update_repeats: int = 10,
                  backends: Sequence[str] = ("processes", "ray")) -> dict[str, Any]:
    """Everything this module measures, as one dict (see the module's docstring)."""
    envs = busy_envs()
    result: dict[str, Any] = {}
    for backend in backends:
        with _maybe_ray(backend):
            measured = collection({"one_vecworker_dummy8": lambda: OneWorkerRunner(envs),
                                   f"pool_{backend}_2x4": lambda backend=backend: PoolRunner(envs, backend)},
                                  steps, repeats)
            reference, pool = measured["one_vecworker_dummy8"], measured[f"pool_{backend}_2x4"]
            pool["speedup_over_one_vecworker"] = pool["env_steps_per_s"] / reference["env_steps_per_s"]
            # What the CPU times promise where each worker has a core of its own and the caller's
            # share is small: a shared machine's scheduler may not give a pool its cores.
            pool["speedup_from_cpu_times"] = NUM_WORKERS * reference["cpu_us_per_env_step"] / pool["cpu_us_per_env_step"]
            result[f"one_vecworker_dummy8_beside_{backend}"] = reference
            result[f"pool_{backend}_2x4"] = pool
            result[f"update_1M_{backend}"] = update_seconds(backend, update_repeats)
    return result


if __name__ == "__main__":
    print(json.dumps(pool_workload(), indent=1))
