"""How results reach the caller (parallelenv.backends.handover): which kind each backend gets, the rule
that frees a spare obs slot, and, under every kind but ``lend``, that what the caller holds never changes.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from envs import CountingEnv, counting
from gymnasium import spaces

from parallelenv import ParallelEnv
from parallelenv.backends import buffers as buffers_module
from parallelenv.backends.buffers import OBS_SLOT_MAX_BYTES, RENEW_OBS_MIN_BYTES, SPARE_OBS_SLOTS, Buffers
from parallelenv.backends.handover import LEASES_HOLD_VIEWS, choose

HAS_TORCH = importlib.util.find_spec("torch") is not None
NUM_ENVS = 4


class RowEnv(CountingEnv):
    """A CountingEnv whose obs row is ``row_bytes`` long: CountingEnv's four values, then the step count
    over and over, so that a step written over a row the caller holds changes nearly all of it."""

    def __init__(self, tag: int, row_bytes: int) -> None:
        super().__init__(tag, episode_length=10**6)
        self.observation_space = spaces.Box(-np.inf, np.inf, (row_bytes // 8,), np.float64)

    def _obs(self, action: float) -> np.ndarray:
        obs = np.full(self.observation_space.shape, float(self.count))
        obs[:4] = super()._obs(action)
        return obs


def row_envs(batch_bytes: int) -> list[Callable[[], CountingEnv]]:
    """NUM_ENVS envs whose observations take ``batch_bytes`` a batch (CountingEnv's 4 values when 0)."""
    if not batch_bytes:
        return [counting(tag, episode_length=10**6) for tag in range(NUM_ENVS)]
    return [lambda tag=tag: RowEnv(tag, batch_bytes // NUM_ENVS) for tag in range(NUM_ENVS)]


# ---------------------------------------------------------------- which kind

def expected_kind(backend: str, copy: bool | None, batch_bytes: int) -> str:
    if copy is False or (copy is None and backend == "tensor"):
        return "lend"
    if batch_bytes >= RENEW_OBS_MIN_BYTES and backend == "dummy":
        return "renew"  # the caller's own memory
    if RENEW_OBS_MIN_BYTES <= batch_bytes <= OBS_SLOT_MAX_BYTES and backend == "subproc":
        return "slot"  # shared memory
    return "copy"


@pytest.mark.parametrize("copy, batch_bytes", [(None, 0), (None, RENEW_OBS_MIN_BYTES), (True, 0),
                                               (False, RENEW_OBS_MIN_BYTES)])
def test_each_backend_hands_results_over_as_its_buffers_and_copy_allow(make_penv, backend, copy, batch_bytes):
    penv = make_penv(row_envs(batch_bytes), copy=copy)
    handover = penv.backend.buffers.handover
    assert handover.kind == expected_kind(backend, copy, batch_bytes)
    assert penv.reuses_result_buffers is handover.lends is (handover.kind == "lend")


def test_the_kind_is_chosen_from_what_the_buffers_allow_and_lending_comes_first():
    assert [choose(lent, renews, slots).kind for lent, renews, slots in [
        (False, False, False), (False, True, False), (False, False, True), (True, True, True),
    ]] == ["copy", "renew", "slot", "lend"]
    buffers = Buffers.allocate(spaces.Box(0, 1, (2**14,)), spaces.Discrete(2), 2, zeros)
    buffers.renews_obs = True  # as a backend sets it once its buffers are made
    assert buffers.handover.kind == "renew"
    buffers.lent = True  # as the front sets it from copy=False
    assert buffers.handover.kind == "lend" and buffers.lent
    buffers.lent = False
    assert buffers.handover.kind == "renew"


@pytest.mark.parametrize("kind", ["copy", "lend", "renew", "slot"])
def test_each_kind_gives_the_rows_asked_for_its_own_way(kind):
    """Handover.step_results, what the front asks for a step's results once it has received them."""
    from parallelenv.array_kinds import NumpyArrays, Selection

    buffers = Buffers.allocate(spaces.Box(0, 1, (2**12,), np.float32), spaces.Discrete(2), 3, zeros,
                               spare_obs_slots=SPARE_OBS_SLOTS if kind == "slot" else 0)
    buffers.lent, buffers.renews_obs = kind == "lend", kind == "renew"
    assert buffers.handover.kind == kind
    arrays, everyone, some = NumpyArrays(spaces.Discrete(2)), Selection.of(np.arange(3), 3), Selection.of(
        np.array([2, 0]), 3)
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    written = buffers.obs
    written[:] = np.arange(3)[:, None]
    obs, reward, *_ = buffers.handover.step_results(arrays, buffers, everyone, fills_none_results=False)
    assert obs[:, 0].tolist() == [0, 1, 2]
    assert (obs is written) is (kind in ("lend", "renew")) and (reward is buffers.reward) is (kind == "lend")
    assert np.shares_memory(obs, written) is (kind != "copy")
    assert (buffers.obs is written) is (kind in ("copy", "lend"))  # renew and slot write the next step elsewhere
    if kind == "lend":  # unless the policy writes None results into them
        owned, *_ = buffers.handover.step_results(arrays, buffers, everyone, fills_none_results=True)
        assert not np.shares_memory(owned, buffers.obs)
    buffers.obs[:] = np.arange(10, 13)[:, None]  # a step of some envs: their rows are copied out, in their order
    rows, *_ = buffers.handover.step_results(arrays, buffers, some, fills_none_results=False)
    assert not np.shares_memory(rows, buffers.obs) and rows[:, 0].tolist() == [12, 10]


# ---------------------------------------------------------------- the slot rule

def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.zeros(shape, dtype)


def slot_buffers() -> Buffers:
    buffers = Buffers.allocate(spaces.Box(0, 1, (3, 2**12), np.float32), spaces.Discrete(2), 2, zeros,
                               spare_obs_slots=SPARE_OBS_SLOTS)
    assert buffers.handover.kind == "slot"
    return buffers


def handed_in_slot_1(buffers: Buffers, value: float) -> np.ndarray:
    """A step of every env written into slot 1 and handed over."""
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 1
    buffers.obs[:] = value
    handed = buffers.handover.whole_step_obs(buffers)
    assert np.shares_memory(handed, buffers.obs_slots[1]) and buffers.obs_slot == 0
    return handed


def torch_tensor(view: Callable[[Any], Any]) -> Callable[[np.ndarray], Any]:
    def make(handed: np.ndarray) -> Any:
        import torch

        return view(torch.from_numpy(handed))

    return make


needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
# What the caller may make of what it was handed, and whether that holds the slot.
KEEPS = [
    pytest.param(lambda a: a, True, id="the array"),
    pytest.param(lambda a: a[1], True, id="a row"),
    pytest.param(lambda a: a[1][2][5:], True, id="a slice of a row of a row"),
    pytest.param(lambda a: a.reshape(-1), True, id="a reshape"),
    pytest.param(lambda a: a[:, 1:].T, True, id="a transpose of a slice"),
    pytest.param(lambda a: np.asarray(a[0]), True, id="np.asarray of a row"),
    pytest.param(lambda a: a.view(np.uint8), True, id="a view as bytes"),
    pytest.param(lambda a: np.lib.stride_tricks.as_strided(a, (2, 2), (8, 4)), True, id="a strided view"),
    pytest.param(memoryview, True, id="a memoryview"),
    pytest.param(torch_tensor(lambda t: t), True, id="a torch tensor", marks=needs_torch),
    pytest.param(torch_tensor(lambda t: t[1][0, 3:]), True, id="a slice of a torch tensor of a row",
                 marks=needs_torch),
    pytest.param(np.copy, False, id="a copy"),
    pytest.param(lambda a: a[[0, 1]], False, id="a fancy index"),
    pytest.param(lambda a: a + 1, False, id="an arithmetic result"),
    pytest.param(lambda a: a.tolist(), False, id="a list"),
    pytest.param(torch_tensor(lambda t: t[1].clone()), False, id="a torch clone", marks=needs_torch),
]


def values_of(kept: Any) -> np.ndarray:
    """A copy of what ``kept`` reads now, whatever the caller made of the handed array."""
    return np.array(kept.numpy() if hasattr(kept, "numpy") else kept)


@pytest.mark.parametrize("keep, holds", KEEPS)
def test_a_spare_slot_is_held_exactly_while_the_caller_holds_a_view_of_what_was_handed_in_it(keep, holds):
    buffers = slot_buffers()
    handed = handed_in_slot_1(buffers, 1.0)
    kept = keep(handed)
    values = values_of(kept)
    del handed
    for _ in range(SPARE_OBS_SLOTS):
        buffers.handover.before_whole_call(buffers, step_of_every_env=True)
        assert (buffers.obs_slot != 1) is holds
        buffers.obs[:] = 2.0  # the next step, written where the caller holds nothing
        buffers.handover.whole_step_obs(buffers)
    np.testing.assert_array_equal(values_of(kept), values)
    del kept
    buffers.handover.before_whole_call(buffers, step_of_every_env=True)
    assert buffers.obs_slot == 1  # let go of: taken again


def test_a_reference_cycle_holds_a_spare_slot_until_the_garbage_collector_breaks_it():
    buffers = slot_buffers()
    gc.disable()
    try:
        cycle: list[Any] = [handed_in_slot_1(buffers, 1.0)[0]]
        cycle.append(cycle)
        del cycle
        buffers.handover.before_whole_call(buffers, step_of_every_env=True)
        assert buffers.obs_slot == 2  # held, as far as anyone can tell: the step goes elsewhere
        gc.collect()
        buffers.handover.before_whole_call(buffers, step_of_every_env=True)
        assert buffers.obs_slot == 1
    finally:
        gc.enable()


def test_views_hold_the_lease_they_come_from_on_this_numpy():
    """The premise of the rule; where it fails, shared buffers get no spare slots (and copy) instead."""
    assert LEASES_HOLD_VIEWS


def test_without_that_premise_shared_buffers_get_no_spare_slots(monkeypatch):
    obs_space = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert buffers_module.spare_obs_slots(obs_space, 8, copies_results=True) == SPARE_OBS_SLOTS
    monkeypatch.setattr(buffers_module, "LEASES_HOLD_VIEWS", False)
    assert buffers_module.spare_obs_slots(obs_space, 8, copies_results=True) == 0


# ---------------------------------------------------------------- what the caller holds

class Held:
    """Results the caller keeps, with the values they had when handed over, and what their envs' counts were."""

    def __init__(self, torch_results: bool) -> None:
        self.torch_results = torch_results
        self.kept: list[tuple[Any, Any]] = []

    @staticmethod
    def snapshot(value: Any) -> Any:
        return value.copy() if isinstance(value, np.ndarray) else value.clone()

    def keep(self, results: tuple[Any, ...]) -> None:
        obs, *step_arrays = results[:-1]
        arrays = [obs, obs[len(obs) - 1], *step_arrays]
        if HAS_TORCH and not self.torch_results:
            import torch

            arrays += [torch.from_numpy(obs), torch.from_numpy(obs[0])[2:]]
        self.kept += [(array, self.snapshot(array)) for array in arrays]

    def check(self) -> None:
        for array, values in self.kept:
            if isinstance(array, np.ndarray):
                np.testing.assert_array_equal(array, values)
            else:
                assert bool((array == values).all()), (array, values)

    def drop_oldest_half(self) -> None:
        """Let go of some, so that buffers that hand over without copying take back what they handed."""
        self.check()
        del self.kept[: len(self.kept) // 2]


def counts_of(obs: Any, env_ids: list[int], counts: list[int]) -> None:
    """The observations of ``env_ids`` are their envs' rows at these step counts, to the row's end."""
    rows = obs.tolist()
    assert [row[0] for row in rows] == env_ids
    assert [(row[1], min(row[4:] or [row[1]]), max(row[4:] or [row[1]])) for row in rows] == [
        (counts[env_id],) * 3 for env_id in env_ids]


@pytest.mark.parametrize("batch_bytes", [0, RENEW_OBS_MIN_BYTES, OBS_SLOT_MAX_BYTES], ids=["small", "64KiB", "8MiB"])
def test_what_the_caller_holds_under_copy_never_changes_whatever_it_calls_next(make_penv, backend, batch_bytes):
    penv = make_penv(row_envs(batch_bytes), asynchronous="continue", copy=True)
    kind = penv.backend.buffers.handover.kind
    assert kind == expected_kind(backend, True, batch_bytes)
    penv = getattr(penv, "penv", penv)  # the tensor backend's own results, torch tensors, not a NumPy view of them
    held = Held(torch_results=backend == "tensor")
    everyone, counts = list(range(NUM_ENVS)), [0] * NUM_ENVS

    def stepped(env_ids: list[int]) -> None:
        for env_id in env_ids:
            counts[env_id] += 1

    def keep(results: tuple[Any, ...], env_ids: list[int]) -> None:
        counts_of(results[0].cpu() if held.torch_results else results[0], env_ids, counts)
        held.keep(results)

    obs, info = penv.reset(seed=0)
    held.keep((obs, info))
    for _ in range(3):
        results = penv.step([1] * NUM_ENVS)
        stepped(everyone)
        keep(results, everyone)
        results = penv.step([2, 2], id=[2, 0])  # right after a step of every env the caller holds
        stepped([2, 0])
        keep(results, [2, 0])
        results = penv.reset(id=[1])
        counts[1] = 0
        keep(results, [1])
        penv.send([3] * NUM_ENVS)
        stepped(everyone)
        keep(penv.recv(), everyone)
        penv.send([4, 4], id=[0, 1])
        penv.send([4, 4], id=[3, 2])
        stepped(everyone)
        keep(penv.recv(), [0, 1, 3, 2])
        for _ in range(SPARE_OBS_SLOTS + 1):  # more steps of every env than spare slots, all held
            results = penv.step([1] * NUM_ENVS)
            stepped(everyone)
            keep(results, everyone)
        results = penv.reset()
        counts = [0] * NUM_ENVS
        keep(results, everyone)
        held.drop_oldest_half()
    held.check()


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("batch_bytes", [0, RENEW_OBS_MIN_BYTES], ids=["small", "64KiB"])
def test_what_the_caller_holds_is_still_there_after_close(make_penv, backend, batch_bytes, copy):
    """Results are the caller's after close() too: a lease on a spare slot in shared memory, or the
    buffers lent under copy=False, keep the segment mapped until they are collected (reading one after
    an unmapping crashed the process)."""
    penv = make_penv(row_envs(batch_bytes), asynchronous="continue", copy=copy)
    held = Held(torch_results=backend == "tensor")
    penv.reset(seed=0)
    for _ in range(1 if copy is False else SPARE_OBS_SLOTS):  # lent: only the last step is still as handed
        held.keep(getattr(penv, "penv", penv).step([1] * NUM_ENVS))
    penv.close()
    held.check()


@pytest.mark.parametrize("backend", ["dummy", "subproc"])
@pytest.mark.parametrize("batch_bytes", [RENEW_OBS_MIN_BYTES, OBS_SLOT_MAX_BYTES], ids=["64KiB", "8MiB"])
def test_a_step_of_every_env_is_handed_over_without_a_copy_where_the_buffers_allow(make_penv, backend, batch_bytes):
    """What the last test checks on these kinds is not a copy's doing: renew hands the buffers' obs
    itself over, slot a lease on a spare slot, each time one the caller no longer holds."""
    penv = make_penv(row_envs(batch_bytes), asynchronous="continue")
    buffers = penv.backend.buffers
    penv.reset(seed=0)
    handed, slots = [], []
    for _ in range(4):
        in_buffers = buffers.obs
        obs, *_ = penv.step([1] * NUM_ENVS)
        if buffers.handover.kind == "renew":
            assert obs is in_buffers and buffers.obs is not in_buffers
        else:
            slots.append([np.shares_memory(obs, slot) for slot in buffers.obs_slots].index(True))
        handed.append(obs)
        del in_buffers, obs
        if len(handed) == SPARE_OBS_SLOTS:
            handed.clear()  # the slots handed over in are taken again
    assert slots == ([1, 2, 1, 2] if backend == "subproc" else [])


@pytest.mark.parametrize("asynchronous", ["idle", None])
def test_lent_results_are_still_the_callers_own_where_the_policy_writes_none_results(make_penv, backend,
                                                                                     asynchronous):
    """copy=False lends the buffers of a step of every env, except under policies that write None
    results into them (docs/guide/calls.rst says so)."""
    penv = make_penv([counting(tag, episode_length=10**6) for tag in range(NUM_ENVS)], asynchronous=asynchronous,
                     copy=False)
    assert penv.reuses_result_buffers and penv.backend.buffers.handover.kind == "lend"
    penv = getattr(penv, "penv", penv)
    held = Held(torch_results=backend == "tensor")
    penv.reset(seed=0)
    for _ in range(3):
        held.keep(penv.step([1] * NUM_ENVS))
    held.check()


@pytest.mark.parametrize("backend", ["dummy", "subproc"])
def test_lending_takes_the_place_of_handing_over_without_a_copy(make_penv, backend):
    penv = make_penv(row_envs(RENEW_OBS_MIN_BYTES), asynchronous="continue", copy=False)
    buffers = penv.backend.buffers
    assert buffers.handover.kind == "lend" and buffers.obs_slots == []
    penv.reset(seed=0)
    first, *_ = penv.step([1] * NUM_ENVS)
    second, *_ = penv.step([1] * NUM_ENVS)
    assert first is second is buffers.obs  # what the next step rewrites, as copy=False promises


def test_closing_while_the_caller_holds_a_lease_removes_the_segment_and_reports_nothing(no_leaks):
    """The backend and its shared memory may go before what the caller was handed: close() unlinks the
    segment (no_leaks), and nothing complains when the segment is collected (filterwarnings=error)."""
    with ParallelEnv(row_envs(RENEW_OBS_MIN_BYTES), para_mode="subproc", num_workers=2,
                     asynchronous="continue") as penv:
        penv.reset(seed=0)
        obs, *_ = penv.step([1] * NUM_ENVS)
        row = obs[1]
        del obs
        assert any(np.shares_memory(row, slot) for slot in penv.backend.buffers.obs_slots[1:])
    del penv
    gc.collect()
    del row
