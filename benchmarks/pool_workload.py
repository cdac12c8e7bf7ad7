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
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

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


def collection(make: Callable[[], Runner], steps: int, repeats: int) -> dict[str, float]:
    """The best of ``repeats`` timed runs of ``steps`` batch steps (after one untimed warm-up)."""
    runner = make()
    try:
        runner.reset(0)
        actions = np.zeros((steps, NUM_ENVS), np.int64)  # only their number counts: the policy acts
        runner.run(actions[: max(1, steps // 10)])
        rates, cpu = [], []
        for _ in range(repeats):
            wall, process = time.perf_counter(), time.process_time()
            done = runner.run(actions)
            wall, process = time.perf_counter() - wall, time.process_time() - process
            rates.append(done / wall)
            cpu.append(process / done)
    finally:
        runner.close()
    return {"env_steps_per_s": max(rates), "caller_cpu_us_per_env_step": 1e6 * min(cpu)}


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


def pool_workload(steps: int = 200, repeats: int = 3, update_repeats: int = 10,
                  backends: Sequence[str] = ("processes", "ray")) -> dict[str, Any]:
    """Everything this module measures, as one dict (see the module's docstring)."""
    envs = busy_envs()
    result: dict[str, Any] = {"one_vecworker_dummy8": collection(lambda: OneWorkerRunner(envs), steps, repeats)}
    reference = result["one_vecworker_dummy8"]["env_steps_per_s"]
    for backend in backends:
        with _maybe_ray(backend):
            measured = collection(lambda backend=backend: PoolRunner(envs, backend), steps, repeats)
            measured["speedup_over_one_vecworker"] = measured["env_steps_per_s"] / reference
            result[f"pool_{backend}_2x4"] = measured
            result[f"update_1M_{backend}"] = update_seconds(backend, update_repeats)
    return result


if __name__ == "__main__":
    print(json.dumps(pool_workload(), indent=1))
