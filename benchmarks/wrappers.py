"""One small adapter per vector-env wrapper, behind the common ``Runner`` API.

Adding a wrapper is one ``@register`` class (or one ``register(...)(partial)``
line): give it a name, a kind (what it is fairly compared with), the modules
it needs, and implement ``reset``, ``step`` and ``close``. Each adapter
imports its library inside ``__init__``, so a benchmark process only pays for
the one it measures and a missing peer is an ImportError reported as a skip.
Importing this module fills :data:`WRAPPERS`; the rest of the harness reads
the table from here.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.ceiling import CeilingRunner
from benchmarks.lockstep import LockstepRunner
from benchmarks.machine import seen_cores, usable_cores
from benchmarks.pool_workload import OneWorkerRunner, PoolRunner
from benchmarks.registry import (
    CEILING,
    IN_PROCESS,
    RAY,
    SUBPROCESS,
    WITH_POLICY,
    WRAPPERS,
    EnvFactory,
    Runner,
    Unsupported,
    default_wrappers,
    env_steps,
    ray_cluster,
    register,
)

__all__ = ["WRAPPERS", "default_wrappers"]

# --- parallelenv -----------------------------------------------------------


class ParallelEnvRunner(Runner):
    """Ours, lockstep: ``step`` of every env, restarted on episode end.

    ``envs_per_worker``: N / k workers of k envs (the many-worker workloads).
    ``cores(workers)``: how many cores parallelenv is to see for that many
    workers (:func:`benchmarks.machine.seen_cores`), None for the real ones;
    it decides the subproc backend's path. ``options``: more of ParallelEnv's.
    """

    def __init__(self, factories: Sequence[EnvFactory], mode: str, worker_per_env: bool = False,
                 copy: bool | None = None, envs_per_worker: int = 0,
                 cores: Callable[[int], int | None] | None = None, **options: Any) -> None:
        from parallelenv import ParallelEnv

        # Envs that wait (sleep, I/O) rather than compute want one worker each,
        # as the peers' one-process-per-env wrappers have; CPU-bound ones one per core.
        if worker_per_env:
            options["num_workers"] = len(factories)
        elif envs_per_worker:
            options["num_workers"] = -(-len(factories) // envs_per_worker)
        if copy is not None:
            options["copy"] = copy
        self._seen_cores = contextlib.ExitStack()
        if cores is not None and (count := cores(options.get("num_workers", usable_cores()))) is not None:
            # For the process's life, not the constructor's alone: whatever the backend reads later
            # (a restarted worker's start) sees the same machine.
            self._seen_cores.enter_context(seen_cores(count))
            self.cores_seen = count
        try:
            self.penv = ParallelEnv(list(factories), para_mode=mode, asynchronous="restart", **options)
        except BaseException:
            self._seen_cores.close()
            raise
        self.workers = len(self.penv.backend.pids()) or None

    def reset(self, seed: int) -> None:
        self.penv.reset(seed=seed)

    def step(self, actions: np.ndarray) -> None:
        self.penv.step(actions)

    def close(self) -> None:
        try:
            self.penv.close()
        finally:
            self._seen_cores.close()


class ParallelEnvAsyncRunner(ParallelEnvRunner):
    """Ours, k-of-n: act on whichever ``wait_num`` envs answer first."""

    wait_num = 8

    def run(self, actions: np.ndarray) -> int:
        steps, num_envs = actions.shape
        # Each env replays its own column of actions, at its own pace.
        taken = np.zeros(num_envs, dtype=np.int64)
        self.penv.send(actions[0], id=None)
        received, in_flight = 0, num_envs
        while received < env_steps(actions):
            ids = self._recv(min(self.wait_num, in_flight))
            received += len(ids)
            taken[ids] += 1
            self.penv.send(actions[taken[ids] % steps, ids], id=ids)
        # Collect what is still in flight, so that the timing includes it and
        # the next repeat starts with no call pending.
        while in_flight:
            ids = self._recv(min(self.wait_num, in_flight))
            received += len(ids)
            in_flight -= len(ids)
        return received

    def _recv(self, wait_num: int) -> np.ndarray:
        *_, info = self.penv.recv(wait_num=wait_num)
        return np.asarray(info["env_id"], dtype=np.int64)


register("parallelenv-dummy", IN_PROCESS, ours=True, requires=("parallelenv",),
         note="asynchronous='restart'")(functools.partial(ParallelEnvRunner, mode="dummy"))
register("parallelenv-subproc", SUBPROCESS, ours=True, requires=("parallelenv",),
         note="asynchronous='restart'")(functools.partial(ParallelEnvRunner, mode="subproc"))
register("parallelenv-subproc-nocopy", SUBPROCESS, ours=True, requires=("parallelenv",), quick=False,
         workloads=frozenset({"bigobs8"}), baseline="parallelenv-subproc",
         note="copy=False: a step's results are the shared buffers, rewritten by the next step")(
    functools.partial(ParallelEnvRunner, mode="subproc", copy=False))
register("parallelenv-ray", RAY, ours=True, requires=("parallelenv", "ray"), quick=False, session=ray_cluster,
         workloads=frozenset({"cartpole8", "cartpole64", "busy8"}),
         note="one actor per env, asynchronous='restart'")(
    functools.partial(ParallelEnvRunner, mode="ray"))
register("parallelenv-ray-subproc", RAY, ours=True, requires=("parallelenv", "ray"), quick=False,
         session=ray_cluster, workloads=frozenset({"cartpole8", "cartpole64", "busy8"}),
         note="one actor per node, its envs in the actor's own worker processes")(
    functools.partial(ParallelEnvRunner, mode="ray-subproc"))
register("parallelenv-subproc-perenv", SUBPROCESS, ours=True, requires=("parallelenv",),
         workloads=frozenset({"jitter16"}),
         note="lockstep step, num_workers=N (one worker per env)")(
    functools.partial(ParallelEnvRunner, mode="subproc", worker_per_env=True))
register("parallelenv-subproc-async", SUBPROCESS, ours=True, requires=("parallelenv",),
         workloads=frozenset({"jitter16"}),
         note=f"send/recv(wait_num={ParallelEnvAsyncRunner.wait_num}), num_workers=N; "
              "steps/s counts results received")(
    functools.partial(ParallelEnvAsyncRunner, mode="subproc", worker_per_env=True))


# The many-worker workloads (sleep*): the subproc backend on each of its paths, N / k workers of k envs.
def _a_core_per_worker(workers: int) -> int:
    return workers


def _fewer_cores_than_workers(workers: int) -> int | None:
    """The real cores where they are fewer than the workers already (2 here), else one fewer than the workers."""
    return None if workers > usable_cores() else max(1, workers - 1)


register("parallelenv-subproc-counted", SUBPROCESS, ours=True, requires=("parallelenv",), per_worker=True,
         workloads=frozenset(), note="num_workers=N/k; parallelenv made to see a core per worker (cores seen: "
         "benchmarks.machine.seen_cores), the path of a machine with that many: counted steps")(
    functools.partial(ParallelEnvRunner, mode="subproc", cores=_a_core_per_worker))
register("parallelenv-subproc-perpipe", SUBPROCESS, ours=True, requires=("parallelenv",), per_worker=True,
         workloads=frozenset(), note="num_workers=N/k, more workers than the cores parallelenv sees: "
         "each worker's answer read from its pipe")(
    functools.partial(ParallelEnvRunner, mode="subproc", cores=_fewer_cores_than_workers))
register("parallelenv-subproc-healing", SUBPROCESS, ours=True, requires=("parallelenv",), per_worker=True,
         workloads=frozenset(), baseline="parallelenv-subproc-counted",
         note="as parallelenv-subproc-counted, with healing on (on_worker_failure='restart')")(
    functools.partial(ParallelEnvRunner, mode="subproc", cores=_a_core_per_worker, on_worker_failure="restart"))

register("parallelenv-subproc-restart", SUBPROCESS, ours=True, requires=("parallelenv",), workloads=frozenset(),
         baseline="parallelenv-subproc", note="as parallelenv-subproc, with healing on (on_worker_failure='restart'): "
         "what the snapshot variants add to")(
    functools.partial(ParallelEnvRunner, mode="subproc", on_worker_failure="restart"))

# Lossless healing's cost: snapshots of every env every N steps and the steps since kept (cheetah8 is the bar).
for _every in (100, 10):
    register(f"parallelenv-subproc-snapshots{_every}", SUBPROCESS, ours=True, requires=("parallelenv",),
             workloads=frozenset(), baseline="parallelenv-subproc",
             note=f"as parallelenv-subproc, healing without a cut episode: on_worker_failure='restart', "
             f"snapshots={_every}")(
        functools.partial(ParallelEnvRunner, mode="subproc", on_worker_failure="restart", snapshots=_every))

# The cost of measuring (ParallelEnv(stats=True)): cheetah8 and the 64-worker sleep workload are the bars.
# stats= is passed only where the revision's ParallelEnv takes it, so that --against a revision from
# before it compares measuring with that revision not measuring.


def _stats_if_known(factories: Sequence[EnvFactory], **options: Any) -> ParallelEnvRunner:
    import inspect

    from parallelenv import ParallelEnv

    if "stats" in inspect.signature(ParallelEnv).parameters:
        options["stats"] = True
    return ParallelEnvRunner(factories, **options)


register("parallelenv-subproc-stats", SUBPROCESS, ours=True, requires=("parallelenv",), workloads=frozenset(),
         baseline="parallelenv-subproc", note="as parallelenv-subproc, measuring where the time goes (stats=True)")(
    functools.partial(_stats_if_known, mode="subproc"))
register("parallelenv-subproc-counted-stats", SUBPROCESS, ours=True, requires=("parallelenv",), per_worker=True,
         workloads=frozenset(), baseline="parallelenv-subproc-counted",
         note="as parallelenv-subproc-counted, measuring where the time goes (stats=True)")(
    functools.partial(_stats_if_known, mode="subproc", cores=_a_core_per_worker))


register("ceiling", CEILING, workloads=frozenset({"cheetah8", "pong8"}),
         note="no wrapper: one bare process per core steps its share of the envs back to back, restarting "
              "ended episodes, each timing its own loop; steps/s is the sum of their rates")(CeilingRunner)
register("lockstep", CEILING, per_worker=True, workloads=frozenset(),
         note="no wrapper: N/k bare processes of k envs, all woken by one futex broadcast with the actions in "
              "shared memory, counting down on a pipe of tokens, no result sent back: the least a lockstep of "
              "that many processes costs on this machine (benchmarks/lockstep.py)")(LockstepRunner)


class MLPPolicy:
    """Greedy actions of an MLP on the observations: deterministic, and each row on its own."""

    def __init__(self, obs_size: int, num_actions: int, hidden: Sequence[int]) -> None:
        import torch

        torch.manual_seed(0)
        sizes = [obs_size, *hidden]
        layers: list[Any] = []
        for size_in, size_out in zip(sizes, sizes[1:], strict=False):
            layers += [torch.nn.Linear(size_in, size_out), torch.nn.Tanh()]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], num_actions))

    def __call__(self, obs: Any) -> Any:
        # .float(): bigobs8's frames are uint8 (a no-op on float32 observations).
        return self.net(obs.flatten(1).float()).argmax(dim=1)


class CollectRunner(Runner):
    """Ours, with a policy in the loop: ``VecWorker.collect`` over subproc, four envs a worker.

    The pre-sampled actions only say how many steps to take; the policy, a
    torch MLP, chooses the actions. ``overlap`` is the one difference
    between the two wrappers built from it.
    """

    # What the issue asks of collect16: a policy whose forward pass on the
    # batch takes about as long as an env's step (1 ms). Three hidden layers
    # of 1024 on one thread of the 2-core AMD EPYC host of 2026-11-25: ~1.3 ms
    # on a batch of 16, ~0.9 ms on a half batch of 8 (of 512: 0.35 and
    # 0.23 ms, where overlap has little to hide: 1.16x).
    hidden = (1024, 1024, 1024)
    # A worker steps its envs one after another. With several envs a worker,
    # each half of an overlapped collection (the even and the odd envs) takes
    # half of every worker's envs, so a half's step takes half a step's time;
    # with one env a worker it would take all of it, and nothing could
    # overlap. Two a worker: a half's step then takes one env's step (~1.1
    # ms on collect16, as long as the policy's forward pass on the other
    # half); busy8's CPU-bound envs get four workers on the two cores.
    envs_per_worker = 2

    def __init__(self, factories: Sequence[EnvFactory], overlap: bool) -> None:
        import gymnasium
        import torch

        from parallelenv import ParallelEnv
        from parallelenv.rollout import VecWorker

        # One thread: the policy has the caller's core; a second thread would
        # contend with the workers for the other core, and stall on a busy host.
        torch.set_num_threads(1)
        penv = ParallelEnv(list(factories), para_mode="subproc", asynchronous="restart",
                           num_workers=-(-len(factories) // self.envs_per_worker))
        policy = MLPPolicy(gymnasium.spaces.flatdim(penv.single_observation_space),
                           int(penv.single_action_space.n), self.hidden)
        self.worker = VecWorker(penv, policy, output="torch", device="cpu", overlap=overlap)

    def reset(self, seed: int) -> None:
        self.worker.start_episode(seed)

    def run(self, actions: np.ndarray) -> int:
        return int(self.worker.collect(len(actions)).reward.numel())

    def close(self) -> None:
        self.worker.shutdown()


COLLECT_NOTE = (f"VecWorker.collect, output='torch', subproc with num_workers=N/{CollectRunner.envs_per_worker}, "
                f"a torch MLP "
                f"{'x'.join(map(str, CollectRunner.hidden))} on one thread choosing the actions")
# Not in --quick: each repeat imports torch, and bench-quick must stay under two minutes. On busy8 (envs
# that use their cores, so that nothing is left to overlap on two) as well as on collect16.
register("parallelenv-collect-plain", WITH_POLICY, ours=True, requires=("parallelenv", "torch"), quick=False,
         workloads=frozenset({"collect16", "busy8"}), note=f"{COLLECT_NOTE}; every env steps together")(
    functools.partial(CollectRunner, overlap=False))
register("parallelenv-collect-overlapped", WITH_POLICY, ours=True, requires=("parallelenv", "torch"), quick=False,
         workloads=frozenset({"collect16", "busy8"}), baseline="parallelenv-collect-plain",
         note=f"{COLLECT_NOTE}; overlap=True: one half steps while the policy acts for the other")(
    functools.partial(CollectRunner, overlap=True))


class TensorRunner(Runner):
    """Ours, batched: the tensor CartPole, through ParallelEnv or called directly.

    Both replay the same actions as one int64 tensor made before the clock
    starts; ``direct`` restarts finished envs itself, as the front object's
    ``asynchronous="restart"`` does, so the two differ by the front alone.
    """

    def __init__(self, factories: Sequence[EnvFactory], direct: bool) -> None:
        import torch

        from parallelenv import ParallelEnv
        from parallelenv.envs import CartPole

        # One core, as Gymnasium's NumPy uses: a like-for-like comparison, and on a
        # shared machine torch's second thread waits for a core and stalls every op.
        torch.set_num_threads(1)

        self.env = CartPole(len(factories), device="cpu")
        self.penv = None if direct else ParallelEnv(self.env, para_mode="tensor", asynchronous="restart")
        self._actions: Any = None

    def reset(self, seed: int) -> None:
        if self.penv is None:
            self.env.reset(seed=seed)
        else:
            self.penv.reset(seed=seed)

    def run(self, actions: np.ndarray) -> int:
        import torch

        if self._actions is None or self._actions.shape != actions.shape:
            self._actions = torch.from_numpy(actions)  # no copy: the same int64 array
        if self.penv is None:
            env = self.env
            for row in self._actions:
                env.step(row)
                env.reset_where(torch.logical_or(env.terminated, env.truncated))
        else:
            step = self.penv.step
            for row in self._actions:
                step(row)
        return env_steps(actions)

    def close(self) -> None:
        if self.penv is not None:
            self.penv.close()


# A RolloutPool (benchmarks/pool_workload.py): 2 workers of 4 envs, each with its own copy of the policy,
# beside one VecWorker over dummy running the same policy for every env in the caller (its baseline).
POOL_NOTE = "a torch MLP 64x64 choosing the actions; RolloutPool.obtain_samples in synchronous mode"
register("parallelenv-one-vecworker", WITH_POLICY, ours=True, requires=("parallelenv", "torch"), quick=False,
         workloads=frozenset({"busy8"}), note=f"one VecWorker over dummy, {POOL_NOTE.split(';')[0]}")(
    OneWorkerRunner)
register("parallelenv-pool-processes", WITH_POLICY, ours=True, requires=("parallelenv", "torch"), quick=False,
         workloads=frozenset({"busy8"}), baseline="parallelenv-one-vecworker",
         note=f"2 worker processes of 4 envs; {POOL_NOTE}")(functools.partial(PoolRunner, backend="processes"))
register("parallelenv-pool-ray", WITH_POLICY, ours=True, requires=("parallelenv", "torch", "ray"), quick=False,
         session=ray_cluster, workloads=frozenset({"busy8"}), baseline="parallelenv-one-vecworker",
         note=f"2 Ray actors of 4 envs; {POOL_NOTE}")(functools.partial(PoolRunner, backend="ray"))


register("parallelenv-tensor", IN_PROCESS, ours=True, requires=("parallelenv", "torch"),
         workloads=frozenset(), note="ParallelEnv(CartPole(N), para_mode='tensor', asynchronous='restart'); one torch thread")(
    functools.partial(TensorRunner, direct=False))
register("tensorenv-direct", IN_PROCESS, ours=True, requires=("parallelenv", "torch"), workloads=frozenset(),
         note="parallelenv.envs.CartPole called directly, restarting finished envs (the front's overhead); "
              "one torch thread")(
    functools.partial(TensorRunner, direct=True))


# --- Gymnasium -------------------------------------------------------------


class GymnasiumRunner(Runner):
    """Gymnasium 1.x vector envs with their default (next-step) autoreset."""

    def __init__(self, factories: Sequence[EnvFactory], asynchronous: bool, same_step: bool = False) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        self.venv: Any
        mode = AutoresetMode.SAME_STEP if same_step else AutoresetMode.NEXT_STEP
        if asynchronous:
            self.venv = AsyncVectorEnv(list(factories), shared_memory=True, autoreset_mode=mode)
            self.workers = len(factories)
        else:
            self.venv = SyncVectorEnv(list(factories), autoreset_mode=mode)

    def reset(self, seed: int) -> None:
        self.venv.reset(seed=seed)

    def step(self, actions: np.ndarray) -> None:
        self.venv.step(actions)

    def close(self) -> None:
        self.venv.close()


register("gymnasium-sync", IN_PROCESS, requires=("gymnasium",),
         note="SyncVectorEnv; next-step autoreset (its default)")(
    functools.partial(GymnasiumRunner, asynchronous=False))
# Our wrappers run asynchronous="restart": an env is reset in the step that
# ends it, one more env call per episode than next-step autoreset makes (there
# the reset takes the next step's place). This peer resets as ours do.
register("gymnasium-sync-same-step", IN_PROCESS, requires=("gymnasium",), quick=False,
         workloads=frozenset({"cartpole8", "cartpole64"}), baseline="gymnasium-sync",
         note="SyncVectorEnv(autoreset_mode=SAME_STEP): resets in the step that ends an episode, as ours do")(
    functools.partial(GymnasiumRunner, asynchronous=False, same_step=True))
register("gymnasium-async", SUBPROCESS, requires=("gymnasium",),
         note="AsyncVectorEnv(shared_memory=True); next-step autoreset")(
    functools.partial(GymnasiumRunner, asynchronous=True))


class GymnasiumVectorRunner(GymnasiumRunner):
    """Gymnasium's NumPy-vectorised CartPole (``vectorization_mode="vector_entry_point"``)."""

    def __init__(self, factories: Sequence[EnvFactory]) -> None:
        import gymnasium

        self.venv = gymnasium.make_vec("CartPole-v1", num_envs=len(factories), vectorization_mode="vector_entry_point")


register("gymnasium-numpy-vector", IN_PROCESS, requires=("gymnasium",), workloads=frozenset(),
         note="make_vec('CartPole-v1', vectorization_mode='vector_entry_point'); next-step autoreset")(
    GymnasiumVectorRunner)


# --- EnvPool ---------------------------------------------------------------


class EnvPoolRunner(Runner):
    """EnvPool's own build of the workload's env, stepped by its C++ thread pool in the caller's process."""

    def __init__(self, factories: Sequence[EnvFactory]) -> None:
        from benchmarks.real_envs import ENVPOOL_TWINS

        twin = ENVPOOL_TWINS.get(factories[0])
        if twin is None:
            raise Unsupported(f"EnvPool has no twin of {factories[0]!r} (benchmarks/real_envs.py)")
        self.task, self.options, self.num_envs = twin.task, twin.options, len(factories)
        self.venv: Any = None

    def reset(self, seed: int) -> None:
        import envpool

        # EnvPool takes its seed when made (env i gets seed + i), so it is made here.
        if self.venv is None:
            # Every env in each batch (batch_size=N): a lockstep step, as the others make.
            self.venv = envpool.make(self.task, env_type="gymnasium", num_envs=self.num_envs,
                                     batch_size=self.num_envs, num_threads=usable_cores(), seed=seed,
                                     **self.options)
        self.venv.reset()

    def step(self, actions: np.ndarray) -> None:
        self.venv.step(actions)

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()


register("envpool", SUBPROCESS, requires=("envpool",), workloads=frozenset({"cheetah8", "pong8"}),
         note="envpool.make(task, env_type='gymnasium', batch_size=N, num_threads=cores): a C++ thread "
              "pool in the caller's process (its threads' CPU counts as the parent's); next-step autoreset; "
              "HalfCheetah-v5 as Gymnasium's, Pong-v5 with ALE/Pong-v5's sticky actions and no FIRE reset")(
    EnvPoolRunner)


# --- Stable-Baselines3 -----------------------------------------------------


class SB3Runner(Runner):
    """SB3 VecEnvs: they reset a finished env inside ``step``."""

    def __init__(self, factories: Sequence[EnvFactory], subproc: bool) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        self.venv: Any
        if not subproc:
            self.venv = DummyVecEnv(list(factories))
            return
        # SubprocVecEnv's default start method, forkserver, is what its users
        # get. The forkserver preloads __main__, which in a user's script
        # imports stable_baselines3 (and torch) once; here __main__ is the
        # harness, so preload SB3 alike rather than have each worker import
        # torch on its own, which costs seconds per worker on two cores.
        multiprocessing.set_forkserver_preload(["__main__", "stable_baselines3.common.vec_env"])
        self.venv = SubprocVecEnv(list(factories))
        self.workers = len(factories)

    def reset(self, seed: int) -> None:
        self.venv.seed(seed)
        self.venv.reset()

    def step(self, actions: np.ndarray) -> None:
        self.venv.step(actions)

    def close(self) -> None:
        self.venv.close()


register("sb3-dummy", IN_PROCESS, requires=("stable_baselines3",), quick=False,
         note="DummyVecEnv; resets a finished env inside step")(
    functools.partial(SB3Runner, subproc=False))
# Not in --quick: each worker imports torch with SB3 (~18 s of start-up on a busy 2-core machine).
register("sb3-subproc", SUBPROCESS, requires=("stable_baselines3",), quick=False,
         note="SubprocVecEnv (forkserver); resets inside step")(
    functools.partial(SB3Runner, subproc=True))


# --- Tianshou --------------------------------------------------------------


class TianshouRunner(Runner):
    """Tianshou venvs leave resets to the caller, as its Collector does."""

    def __init__(self, factories: Sequence[EnvFactory], ray_workers: bool = False, kind: str = "shmem") -> None:
        from tianshou.env import RayVectorEnv, ShmemVectorEnv, SubprocVectorEnv

        if kind == "parallelenv":  # our adapter of Tianshou's interface, over subproc
            from parallelenv import ParallelEnv
            from parallelenv.integrations.tianshou import TianshouVectorEnv

            self.venv = TianshouVectorEnv(ParallelEnv(list(factories), para_mode="subproc", asynchronous="idle"))
            return
        venv_class = RayVectorEnv if ray_workers else SubprocVectorEnv if kind == "subproc" else ShmemVectorEnv
        self.venv = venv_class(list(factories))

    def reset(self, seed: int) -> None:
        self.venv.seed(seed)
        self.venv.reset()

    def step(self, actions: np.ndarray) -> None:
        _, _, terminated, truncated, _ = self.venv.step(actions)
        done = np.flatnonzero(np.logical_or(terminated, truncated))
        if done.size:
            self.venv.reset(done)

    def close(self) -> None:
        self.venv.close()


register("tianshou-shmem", SUBPROCESS, requires=("tianshou",), quick=False,
         note="ShmemVectorEnv; the caller resets finished envs, as its Collector does")(
    functools.partial(TianshouRunner, ray_workers=False))
register("tianshou-subproc", SUBPROCESS, requires=("tianshou",), quick=False,
         note="SubprocVectorEnv; the caller resets finished envs, as its Collector does")(
    functools.partial(TianshouRunner, kind="subproc"))
register("parallelenv-tianshou", SUBPROCESS, ours=True, requires=("parallelenv", "tianshou"), quick=False,
         note="integrations.tianshou.TianshouVectorEnv over subproc (asynchronous='idle'); the caller resets "
              "finished envs, as Tianshou's Collector does")(
    functools.partial(TianshouRunner, kind="parallelenv"))
register("tianshou-ray", RAY, requires=("tianshou", "ray"), quick=False, session=ray_cluster,
         workloads=frozenset({"cartpole8"}), note="RayVectorEnv; the caller resets finished envs")(
    functools.partial(TianshouRunner, ray_workers=True))


# --- plain Ray -------------------------------------------------------------


class EnvActor:
    """Hosts one env in a Ray actor; restarts it when an episode ends."""

    def __init__(self, factory: EnvFactory) -> None:
        self.env = factory()

    def reset(self, seed: int) -> Any:
        return self.env.reset(seed=seed)[0]

    def step(self, action: Any) -> tuple[Any, float, bool, bool]:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            obs, _ = self.env.reset()
        return obs, float(reward), bool(terminated), bool(truncated)

    def close(self) -> None:
        self.env.close()


@register("ray-actors", RAY, requires=("ray",), quick=False, session=ray_cluster,
          workloads=frozenset({"cartpole8", "cartpole64", "busy8"}),
          note="one actor per env, one ray.get of all steps; the actor resets its env")
class RayActorsRunner(Runner):
    """The plain Ray baseline: one actor per env, one ``ray.get`` per step."""

    def __init__(self, factories: Sequence[EnvFactory]) -> None:
        import ray

        self._ray = ray
        # Fractional CPUs so N actors fit on fewer cores: Ray reserves one CPU
        # per actor by default and would leave the rest pending forever.
        cpus = min(1.0, (os.cpu_count() or 1) / len(factories))
        actor_class: Any = ray.remote(num_cpus=cpus)(EnvActor)
        self.actors: list[Any] = [actor_class.remote(f) for f in factories]

    def reset(self, seed: int) -> None:
        # seed + i per env, as the vector envs of the other libraries do.
        refs = [a.reset.remote(seed + i) for i, a in enumerate(self.actors)]
        self.obs = np.stack(self._ray.get(refs))

    def step(self, actions: np.ndarray) -> None:
        refs = [a.step.remote(x) for a, x in zip(self.actors, actions.tolist(), strict=True)]
        obs, rewards, terminated, truncated = zip(*self._ray.get(refs), strict=True)
        # Assemble the batch, as every other wrapper hands one back.
        self.obs = np.stack(obs)
        self.rewards = np.asarray(rewards)
        self.done = np.logical_or(terminated, truncated)

    def close(self) -> None:
        try:
            self._ray.get([a.close.remote() for a in self.actors])
        finally:
            for actor in self.actors:
                self._ray.kill(actor)
