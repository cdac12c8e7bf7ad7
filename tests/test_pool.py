"""RolloutPool: VecWorkers in processes and Ray actors (docs/design.rst, "A pool of rollout workers").

Synchronous mode is checked against the same VecWorkers run one by one in
this process, bit for bit; failure tests compare the surviving workers'
transitions with a fault-free run's. The multi-node test runs this module
as a script (``python test_pool.py multinode``) in a process of its own,
with a Ray cluster of its own, as tests/ray_multinode.py does for ParallelEnv.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import HAS_RAY, HAS_TORCH, TESTS_DIR, assert_gone, slowness
from envs import DelayEnv, FaultyEnv, SlowToBuildEnv, counting

from parallelenv import ClosedError, ParallelEnv, WorkerDiedError, WorkerStartError
from parallelenv.backends import progress
from parallelenv.healing import WORKER_HUNG
from parallelenv.pool import PoolWorkerError, RolloutPool
from parallelenv.rollout import VecWorker

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="the pool's policies here are torch modules")
THIS = Path(__file__).resolve()
SEED = 7
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed")


def make_policy(seed: int = 0):
    import torch

    class Chooser(torch.nn.Module):
        """CountingEnv's obs -> one of its 5 actions, through a small linear layer."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 5)

        def forward(self, obs):
            return self.layer(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

    torch.manual_seed(seed)
    return Chooser()


def envs_of(count: int = 4, delay: float = 0.0) -> list:
    if delay:
        return [lambda tag=tag: DelayEnv(tag, delay, episode_length=3 + tag) for tag in range(count)]
    return [counting(tag, 3 + tag) for tag in range(count)]


def one_by_one(envs: list, policy, groups: list[list[int]], weights, steps: int) -> list:
    """What the same VecWorkers collect run in this process, one after another."""
    batches = []
    for worker, ids in enumerate(groups):
        vec = VecWorker(ParallelEnv([envs[i] for i in ids], asynchronous="restart"), policy, seed=SEED,
                        worker_number=worker)
        vec.update_agent(weights)
        batches.append(vec.collect(steps))
        vec.shutdown()
    return batches


def assert_same(a, b) -> None:
    for name in ("obs", "action", "reward", "terminated", "truncated", "next_obs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


BACKENDS = ["processes", pytest.param("ray", marks=needs_ray)]


@pytest.fixture(params=BACKENDS)
def pool_backend(request, no_leaks):
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


# ------------------------------------------------------------------ synchronous mode


@pytest.mark.timeout(240)
def test_sync_mode_equals_the_vecworkers_one_by_one(pool_backend):
    envs, policy = envs_of(), make_policy()
    weights = make_policy(seed=1).state_dict()
    with RolloutPool(envs, policy, num_workers=2, backend=pool_backend, seed=SEED) as pool:
        samples = pool.obtain_samples(0, num_samples=24, agent_update=weights)
        episodes = pool.obtain_exact_episodes(2)
        pids = pool.pids()
    expected = one_by_one(envs, make_policy(), [[0, 1], [2, 3]], weights, steps=6)
    assert [(p.worker, p.policy_version, p.env_ids) for p in samples.parts] == [(0, 1, (0, 1)), (1, 1, (2, 3))]
    for part, batch in zip(samples.parts, expected, strict=True):
        assert_same(part.data, batch)
    assert samples.transitions().obs.shape == (6, 4, 4) and samples.lost == ()
    np.testing.assert_array_equal(samples.column_workers(), [0, 0, 1, 1])
    # Two episodes of every worker: the first to end in each, the pool's env numbers.
    np.testing.assert_array_equal(episodes.episodes().env_ids, [0, 1, 2, 3])
    np.testing.assert_array_equal(episodes.episodes().lengths, [3, 4, 5, 6])
    if pool_backend == "ray":
        assert_gone(pids)


@pytest.mark.timeout(180)
def test_a_new_policy_parameters_and_env_updates_reach_every_worker(no_leaks):
    with RolloutPool(envs_of(2), make_policy(), num_workers=2, seed=SEED) as pool:
        assert pool.update_agent(make_policy(seed=3), wait=True) == 1
        assert pool.update_agent(make_policy(seed=4).state_dict(), wait=True) == 2
        samples = pool.obtain_samples(0, 2)
        # Env 0 of each worker replaced: a CountingEnv's obs starts with its tag.
        updated = pool.obtain_samples(1, 2, env_update=[{0: counting(8)}, {0: counting(9)}])
    assert {part.policy_version for part in samples.parts} == {2}
    expected = one_by_one(envs_of(2), make_policy(), [[0], [1]], make_policy(seed=4).state_dict(), steps=1)
    for part, batch in zip(samples.parts, expected, strict=True):
        assert_same(part.data, batch)
    assert [part.data.obs[0, 0, 0] for part in updated.parts] == [8, 9]


# ------------------------------------------------------------------ stragglers and async


@pytest.mark.timeout(180)
def test_a_straggler_does_not_set_the_pace(no_leaks):
    """Worker 1's envs are 100x slower: the call returns with worker 0's chunks; worker 1's arrives later."""
    envs = [lambda: DelayEnv(0, 0.001), lambda: DelayEnv(1, 0.001), lambda: DelayEnv(2, 0.2), lambda: DelayEnv(3, 0.2)]
    with RolloutPool(envs, make_policy(), num_workers=2, mode="first", chunk_steps=4, seed=SEED) as pool:
        first = pool.obtain_samples(0, num_samples=16)
        assert {part.worker for part in first.parts} == {0}
        assert first.env_steps >= 16
        time.sleep(2.0)  # worker 1's chunk (4 steps of 0.2 s per env) is in by now
        later = pool.obtain_samples(1, num_samples=8)
    assert 1 in {part.worker for part in later.parts}
    assert {part.data.num_steps for part in later.parts} == {4}


@pytest.mark.timeout(180)
def test_async_workers_collect_while_the_caller_trains_and_tag_the_version(no_leaks):
    with RolloutPool(envs_of(4, delay=0.002), make_policy(), num_workers=2, mode="async", chunk_steps=4,
                     prefetch=2, seed=SEED) as pool:
        pool.obtain_samples(0, num_samples=16)
        time.sleep(0.5)  # "training": the workers fill their prefetched chunks meanwhile
        version = pool.update_agent(make_policy(seed=5).state_dict())
        versions: set[int] = set()
        for itr in range(6):
            samples = pool.obtain_samples(itr, num_samples=16)
            versions |= {part.policy_version for part in samples.parts}
            np.testing.assert_array_equal(samples.column_versions(), np.repeat(
                [part.policy_version for part in samples.parts], 2))
    assert version == 1 and versions >= {1}


# ------------------------------------------------------------------ failures


def kill_when_busy(pool: RolloutPool, worker: int, after_s: float) -> threading.Timer:
    pid = pool.pids()[worker]
    timer = threading.Timer(after_s, os.kill, (pid, signal.SIGKILL))
    timer.start()
    return timer


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_collection_is_replaced_and_the_others_are_untouched(no_leaks):
    envs = envs_of(4, delay=0.02)
    weights = make_policy(seed=1).state_dict()
    with RolloutPool(envs, make_policy(), num_workers=2, seed=SEED) as pool:
        pool.update_agent(weights, wait=True)
        timer = kill_when_busy(pool, 1, after_s=0.5)
        samples = pool.obtain_samples(0, num_samples=4 * 60)  # 60 steps of 20 ms: ~1.2 s per worker
        timer.join()
        after = pool.obtain_samples(1, num_samples=4)
        failures = list(pool.failures)
    expected = one_by_one(envs, make_policy(), [[0, 1]], weights, steps=60)
    assert_same(samples.parts[0].data, expected[0])
    [lost] = samples.lost
    assert (lost.worker, lost.env_ids, lost.policy_version) == (1, (2, 3), 1) and "SIGKILL" in lost.reason
    # The replacement collected worker 1's share again, with the current weights and fresh seeds.
    assert [(p.worker, p.policy_version) for p in samples.parts] == [(0, 1), (1, 1)]
    assert samples.parts[1].data.num_steps == 60 and after.lost == ()
    [failure] = failures
    assert failure.env_ids == (2, 3) and "worker 1" in failure.reason


@pytest.mark.timeout(240)
def test_with_snapshots_a_worker_killed_mid_collection_cuts_no_episode(no_leaks):
    """The replacement goes on from its predecessor's collection after the last batch: every env's
    transitions are the unfaulted run's, nothing is lost, and the failure log names the envs restored."""
    from parallelenv import check_state

    envs = envs_of(4, delay=0.02)
    assert check_state(envs[0], steps=10)  # DelayEnv's state is its pickle, checked here
    weights = make_policy(seed=1).state_dict()

    def run(fault: bool):
        with RolloutPool(envs, make_policy(), num_workers=2, seed=SEED, snapshots=True) as pool:
            pool.update_agent(weights, wait=True)
            calls = [pool.obtain_samples(0, num_samples=4 * 7)]  # mid-episode: DelayEnv's episodes are 3-6 steps
            timer = kill_when_busy(pool, 1, after_s=0.3) if fault else None
            calls.append(pool.obtain_samples(1, num_samples=4 * 60))  # 60 steps of 20 ms: ~1.2 s per worker
            if timer is not None:
                timer.join()
            calls.append(pool.obtain_samples(2, num_samples=4 * 5))
            return calls, list(pool.failures)

    faulted, failures = run(fault=True)
    clean, _ = run(fault=False)
    for got, want in zip(faulted, clean, strict=True):
        assert got.lost == ()
        for part, expected in zip(got.parts, want.parts, strict=True):
            assert part.worker == expected.worker
            assert_same(part.data, expected.data)
    [failure] = failures
    assert failure.env_ids == (2, 3) and failure.restored == (2, 3) and "SIGKILL" in failure.reason


@pytest.mark.timeout(240)
def test_with_snapshots_an_env_whose_state_cannot_be_taken_is_replaced_as_without(no_leaks, monkeypatch):
    """No pickle trusted, no protocol: each batch says why its collection was not kept, and a worker
    lost is replaced as without snapshots (its work logged lost), the reason in the failure log."""
    from parallelenv.state import capture

    monkeypatch.setattr(capture, "_TRUSTED_PICKLES", set())  # another test of this process may have trusted it
    with RolloutPool(envs_of(4, delay=0.02), make_policy(), num_workers=2, seed=SEED, snapshots=True) as pool:
        pool.obtain_samples(0, num_samples=4 * 4)
        timer = kill_when_busy(pool, 0, after_s=0.3)
        samples = pool.obtain_samples(1, num_samples=4 * 60)
        timer.join()
        [failure] = pool.failures
    [lost] = samples.lost
    assert lost.worker == 0 and failure.restored == ()
    assert "restart their episodes" in failure.reason and "DelayEnv has no get_state()" in failure.reason


@pytest.mark.timeout(240)
def test_past_the_restart_budget_the_death_raises_and_nothing_is_left(no_leaks):
    pool = RolloutPool(envs_of(2, delay=0.02), make_policy(), num_workers=2, seed=SEED, max_restarts=0)
    kill_when_busy(pool, 0, after_s=0.3)
    with pytest.raises(WorkerDiedError, match="worker 0") as raised:
        pool.obtain_samples(0, num_samples=2 * 100)
    assert raised.value.env_indices == [0]
    with pytest.raises(ClosedError):
        pool.obtain_samples(1, 2)


@pytest.mark.timeout(240)
def test_a_hung_worker_is_killed_after_call_timeout_and_the_budget_bounds_it(no_leaks):
    envs = [counting(0, 100), lambda: FaultyEnv(1, at_step=2, how="hang")]  # every incarnation hangs
    pool = RolloutPool(envs, make_policy(), num_workers=2, call_timeout=2.0, max_restarts=1)
    with pytest.raises(WorkerDiedError, match=r"worker 1: it did not answer within call_timeout=2 s"):
        pool.obtain_samples(0, num_samples=2 * 5)
    [failure] = pool.failures
    assert failure.kind == WORKER_HUNG and failure.env_ids == (1,)


@pytest.mark.timeout(180)
def test_a_pool_dropped_without_close_ends_its_workers(no_leaks):
    pool = RolloutPool(envs_of(2), make_policy(), num_workers=2)
    pids = pool.pids()
    del pool
    gc.collect()
    assert_gone(pids)


# ------------------------------------------------------------------ bad input


def test_an_unpicklable_policy_is_refused_naming_the_workers(no_leaks):
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot be pickled to send it to workers 0-1"):
        RolloutPool(envs_of(2), lambda obs: lock and np.zeros(len(obs), np.int64), num_workers=2)


@pytest.mark.timeout(180)
def test_weights_of_the_wrong_shape_are_refused_before_any_is_sent(no_leaks):
    import torch

    with RolloutPool(envs_of(2), make_policy(), num_workers=2) as pool:
        weights = make_policy().state_dict()
        weights["layer.weight"] = torch.zeros(3, 4)
        with pytest.raises(ValueError, match=r"workers 0-1 .*'layer.weight' has shape \(3, 4\), the policy's has \(5, 4\)"):
            pool.update_agent(weights)
        assert pool.version == 0
        assert pool.obtain_samples(0, 2).parts[0].policy_version == 0  # still usable


def broken_factory():
    raise RuntimeError("no licence for this simulator")


@pytest.mark.timeout(180)
def test_a_slow_start_says_how_many_workers_have_started(no_leaks, capfd, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.2)
    envs = [lambda: SlowToBuildEnv(0, 0.0), lambda: SlowToBuildEnv(1, 2.0)]  # the second worker starts later
    with RolloutPool(envs, make_policy(), num_workers=2, backend="processes") as pool:
        assert pool.num_envs == 2
    lines = [line for line in capfd.readouterr().err.splitlines() if "pool workers" in line]
    assert lines and all(re.match(r"parallelenv: started [01] of 2 pool workers \(processes\) \(\d+ s\)$", line)
                         for line in lines), lines


@pytest.mark.timeout(180)
def test_envs_that_fail_to_build_name_the_worker_and_nothing_is_left(no_leaks):
    envs = [counting(0), counting(1), broken_factory, counting(3)]
    with pytest.raises(PoolWorkerError) as raised:
        RolloutPool(envs, make_policy(), num_workers=2)
    error = raised.value
    assert (error.worker, error.env_ids, error.what) == (1, [2, 3], "building its envs and policy")
    assert "no licence for this simulator" in error.message and "worker 1" in str(error)


def test_arguments_are_checked_before_any_worker_starts(no_leaks):
    with pytest.raises(ValueError, match="num_workers=5"):
        RolloutPool(envs_of(4), make_policy(), num_workers=5)
    with pytest.raises(ValueError, match="mode='fastest'; use one of 'sync', 'first', 'async'"):
        RolloutPool(envs_of(4), make_policy(), mode="fastest")
    with pytest.raises(ValueError, match="para_mode='threads' is not a backend"):
        RolloutPool(envs_of(4), make_policy(), para_mode="threads")
    with pytest.raises(ValueError, match="backend='dask'"):
        RolloutPool(envs_of(4), make_policy(), backend="dask")


# ------------------------------------------------------------------ Ray


@needs_ray
@pytest.mark.timeout(300)
def test_a_ray_actor_killed_mid_collection_is_replaced(ray_session):
    envs = envs_of(4, delay=0.02)
    with RolloutPool(envs, make_policy(), num_workers=2, backend="ray", seed=SEED) as pool:
        timer = kill_when_busy(pool, 0, after_s=0.5)
        samples = pool.obtain_samples(0, num_samples=4 * 60)
        timer.join()
        pids = pool.pids()
    expected = one_by_one(envs, make_policy(), [[0, 1], [2, 3]], make_policy().state_dict(), steps=60)
    assert_same(samples.parts[1].data, expected[1])
    assert [lost.worker for lost in samples.lost] == [0]
    assert samples.parts[0].worker == 0 and samples.parts[0].data.num_steps == 60
    assert_gone(pids)


@needs_ray
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("cpus", "asked", "has"), [
    (4, "1 Ray actor asks 4 CPUs", "no node with that much (the largest has 2 CPUs)"),  # no node holds one
    (1.5, "2 Ray actors ask 3 CPUs in all (1.5 CPUs each)", "room for 1 of them"),  # the nodes hold one, not two
])
def test_a_pool_the_ray_cluster_can_never_hold_is_refused_at_once(ray_session, no_leaks, cpus, asked, has):
    begun = time.monotonic()
    with pytest.raises(WorkerStartError) as caught:
        RolloutPool(envs_of(4), make_policy(), num_workers=2, backend="ray", actor_options={"num_cpus": cpus})
    assert time.monotonic() - begun < 10 * slowness()  # 10 s on a quiet machine; Ray's own calls slow with the load
    message = str(caught.value)
    assert asked in message and has in message and "2 CPUs in all" in message, message
    assert "did not start" in message and "died" not in message


@needs_ray
@pytest.mark.timeout(120)
def test_a_pool_waiting_for_busy_cpus_says_so_and_does_not_start(ray_session, no_leaks, caplog):
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 2}])  # every CPU of the session's cluster, as another job's actors hold them
    ray_session.get(group.ready(), timeout=30)
    try:
        with pytest.raises(PoolWorkerError, match="did not start within start_timeout=2 s") as caught:
            RolloutPool(envs_of(4), make_policy(), num_workers=2, backend="ray", start_timeout=2)
    finally:
        remove_placement_group(group)
    # What it waited for, beside what the cluster has: the placement group holds both CPUs.
    assert "1 Ray actor asks 1 CPU; the Ray cluster has 2 CPUs, 0 CPUs free now" in str(caught.value), caught.value
    assert "died" not in str(caught.value)
    said = [record.getMessage() for record in caplog.records if "waiting" in record.getMessage()]
    assert len(said) == 1 and "waiting up to the pool's start_timeout for other actors or tasks to free 1 CPU" in said[0]


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_lost_node_s_workers_come_back_on_the_live_node():
    """A head and two worker nodes (ray.cluster_utils.Cluster), in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, str(THIS), "multinode"], env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["nodes_before"] == 2, seen  # a worker on each node
    # Whether Ray already knows the node is dead when the call fails depends on its heartbeats.
    assert seen["lost_workers"] == [seen["doomed_worker"]] and "Ray" in seen["reason"], seen
    assert seen["nodes_after"] == [seen["survivor"]], seen
    assert seen["workers_returned"] == [0, 1] and seen["closed"], seen


def multinode() -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]  # room for both workers on either
    cluster.wait_for_nodes()
    # The nodes' processes inherit this script's PYTHONPATH (tests/ and the checkout), as its workers need.
    ray.init(address=cluster.address, log_to_driver=False)
    seen: dict = {}
    try:
        pool = RolloutPool(envs_of(4, delay=0.02), make_policy(), num_workers=2, backend="ray", seed=SEED)
        pool.obtain_samples(0, 4)
        placed = pool.nodes()
        seen["nodes_before"] = len(set(placed))
        doomed = nodes[0]
        seen["doomed_worker"] = placed.index(doomed.node_id)
        seen["survivor"] = nodes[1].node_id
        doomed_pid = pool.pids()[seen["doomed_worker"]]

        def lose_the_node() -> None:
            cluster.remove_node(doomed, allow_graceful=False)
            try:
                os.kill(doomed_pid, signal.SIGKILL)  # a lost machine takes its processes with it
            except ProcessLookupError:
                pass

        timer = threading.Timer(0.5, lose_the_node)
        timer.start()
        samples = pool.obtain_samples(1, num_samples=4 * 60)
        timer.join()
        seen["lost_workers"] = [lost.worker for lost in samples.lost]
        seen["reason"] = samples.lost[0].reason if samples.lost else ""
        seen["workers_returned"] = [part.worker for part in samples.parts]
        seen["nodes_after"] = sorted(set(pool.nodes()))
        pool.close()
        seen["closed"] = True
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(seen), flush=True)


# ------------------------------------------------------------------ the guide page


def test_every_python_block_of_the_guide_page_runs(no_leaks):
    from sybil import Sybil
    from sybil.parsers.rest import PythonCodeBlockParser

    page = TESTS_DIR.parent / "docs" / "guide" / "pool.rst"
    examples = list(Sybil(parsers=[PythonCodeBlockParser()]).parse(page))
    assert examples, "docs/guide/pool.rst has no python block"
    for example in examples:
        example.evaluate()


if __name__ == "__main__":
    if sys.argv[1] == "multinode":
        multinode()


# ------------------------------------------------------------------ saved and resumed


@pytest.mark.timeout(240)
def test_a_pools_collections_resume_where_they_were_saved(pool_backend, tmp_path):
    """Saved between two calls, a new pool of the saved workers (in other processes) collects what the
    first would have: every env's state, the agents' current observations and episode sums came back."""
    from parallelenv import check_state

    envs, policy = envs_of(), make_policy()
    assert check_state(envs[0], steps=10)  # CountingEnv's state is its pickle, checked here
    with RolloutPool(envs, policy, num_workers=2, backend=pool_backend, seed=SEED) as pool:
        pool.obtain_samples(0, num_samples=20)
        pool.save(tmp_path / "pool.pkl")
        expected = pool.obtain_samples(1, num_samples=24)
    with RolloutPool.load(tmp_path / "pool.pkl", make_policy(), backend=pool_backend, seed=SEED) as resumed:
        assert resumed.num_workers == 2
        got = resumed.obtain_samples(0, num_samples=24)
    for part, want in zip(got.parts, expected.parts, strict=True):
        assert part.env_ids == want.env_ids
        assert_same(part.data, want.data)
        np.testing.assert_array_equal(part.data.episode_lengths, want.data.episode_lengths)


def test_a_pool_loads_only_its_own_kind_of_file(tmp_path, no_leaks):
    from parallelenv import check_state
    from parallelenv.rollout import VecWorker

    assert check_state(counting(0, 3), steps=5)

    with VecWorker(ParallelEnv([counting(0, 3)], asynchronous="restart"), lambda obs: np.zeros(len(obs), int)) as vec:
        vec.collect(2)
        vec.save(tmp_path / "worker.pkl")
    with pytest.raises(ValueError, match="not a file RolloutPool.save"):
        RolloutPool.load(tmp_path / "worker.pkl", make_policy())


@pytest.mark.timeout(120)
def test_a_worker_lost_as_the_pool_saves_is_replaced_and_the_save_completes(tmp_path, no_leaks):
    """The replacement serves the save its predecessor never answered; the call does not wait forever."""
    import os
    import signal

    from parallelenv import check_state

    envs = envs_of()
    assert check_state(envs[0], steps=10)
    with RolloutPool(envs, make_policy(), num_workers=2, backend="processes", seed=SEED) as pool:
        pool.obtain_samples(0, num_samples=8)
        os.kill(pool.pids()[1], signal.SIGKILL)
        pool.save(tmp_path / "pool.pkl")
        assert [f.env_ids for f in pool.failures] == [(2, 3)]
    with RolloutPool.load(tmp_path / "pool.pkl", make_policy(), backend="processes", seed=SEED) as resumed:
        assert resumed.obtain_samples(0, num_samples=8).transitions().obs.shape == (2, 4, 4)
